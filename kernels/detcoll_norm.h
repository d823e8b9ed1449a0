// detcoll_norm.h — the residual add + RMSNorm that follows an all_reduce, for CUDA and HIP.
//
// For each of `rows` rows of `hidden` elements (DcNormParams, detcoll_protocol.h):
//
//     h_j = residual_j + sum_j                  one add in the dtype: the tree's own add
//     q   = sum of f32(h_j)^2                   256 lanes, then halving (below)
//     inv = 1 / sqrt(q / hidden + eps)          f32, every operation correctly rounded
//     y_j = dtype(f32(h_j) * inv * f32(w_j))    two f32 products, one rounding to the dtype
//
// exactly steps 2-5 of the CPU reference, fixed_tree::residual_rmsnorm
// (crates/fixed-tree/src/rmsnorm.rs; docs/contract.md, "Fused all_reduce + residual + RMSNorm").
// `sum` is the all_reduce's output (step 1).
//
// The order is the reference's: one block of DC_NORM_THREADS = 256 threads per row (grid-stride
// over rows); thread t is lane t and handles the elements j = c * 2048 + 8t + v (v in 0..8, c the
// chunk), in increasing j, adding each square into its own f32 partial. The block then halves
// the 256 partials: p_t = p_t + p_{t+s} for s = 128, 64, ..., 1 and t < s. On CUDA the levels
// s = 128, 64, 32 go through shared memory and s = 16 .. 1 through shuffles inside warp 0
// (shfl_down by s gives lane t < s exactly p_t + p_{t+s}); on HIP (64-wide wavefronts, and no
// HIP headers in the offline build) every level goes through shared memory. Same tree, same bits.
//
// No operation is fused or approximate: multiplies, adds, the division and the square root are
// inline PTX with an explicit `.rn` (never contracted, never flushed, whatever the NVRTC flags)
// on CUDA, and plain IEEE operations on HIP, whose entry file is compiled with contraction off
// (-ffp-contract=off and `#pragma clang fp contract(off)`) and with clang's default correctly
// rounded f32 division and square root. Conversions are the software ones of detcoll_tree.h
// (exact widening, one round-to-nearest-even narrowing, subnormals kept).
//
// Aliasing: `h` may be exactly `sum` or `residual`, `y` exactly `sum` or `residual` (element j is
// read and written by the same thread, reads first); `h` and `y` must not overlap; `weight`
// overlaps neither output.
//
// Like the other headers, no includes of the platform: it is included by the entry files after
// detcoll_protocol.h (DcNormParams, the DC_* execution-model macros).
#ifndef DETCOLL_NORM_H
#define DETCOLL_NORM_H

#include "detcoll_protocol.h"

// Threads of one block (lanes of the sum of squares): fixed_tree::RMSNORM_LANES.
#define DC_NORM_THREADS 256
// Contiguous elements of one lane per chunk: fixed_tree::RMSNORM_VECTOR.
#define DC_NORM_VECTOR 8
// Elements of one chunk: every lane's vector once.
#define DC_NORM_CHUNK (DC_NORM_THREADS * DC_NORM_VECTOR)

// ---------------------------------------------------------------------------------------------
// f32 operations, each rounded once to nearest even; no flush to zero, no contraction.
// ---------------------------------------------------------------------------------------------

DC_DEV float dc_norm_add(float a, float b) { return dc_as_f32(dc_add_f32_bits(dc_as_u32(a), dc_as_u32(b))); }

DC_DEV float dc_norm_mul(float a, float b) {
#if defined(DC_CUDA)
    float r;
    asm("mul.rn.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b));
    return r;
#else
    return a * b;
#endif
}

DC_DEV float dc_norm_div(float a, float b) {
#if defined(DC_CUDA)
    float r;
    asm("div.rn.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b));
    return r;
#else
    return a / b;
#endif
}

DC_DEV float dc_norm_sqrt(float a) {
#if defined(DC_CUDA)
    float r;
    asm("sqrt.rn.f32 %0, %1;" : "=f"(r) : "f"(a));
    return r;
#else
    return __builtin_sqrtf(a);
#endif
}

// The element (its bits, f32 in 32 bits, f16/bf16 in the low 16) as an f32: exact.
template <int DT>
DC_DEV float dc_norm_widen(dc_u32 bits) {
    if (DT == DC_F32) return dc_as_f32(bits);
    if (DT == DC_F16) return dc_f16_to_f32((dc_u16)bits);
    return dc_bf16_to_f32((dc_u16)bits);
}

// An f32 rounded once to the element type (nearest even; the identity for f32), as bits.
template <int DT>
DC_DEV dc_u32 dc_norm_narrow(float f) {
    if (DT == DC_F32) return dc_as_u32(f);
    if (DT == DC_F16) return (dc_u32)dc_f32_to_f16(f);
    return (dc_u32)dc_f32_to_bf16(f);
}

// ---------------------------------------------------------------------------------------------
// The kernel body, for one dtype. Must run with DC_NORM_THREADS threads per block.
// ---------------------------------------------------------------------------------------------

template <int DT>
DC_DEV void dc_residual_rmsnorm_rows(const DcNormParams& p) {
    DC_SHARED float s_part[DC_NORM_THREADS];
    DC_SHARED float s_q;
    const dc_u32 t = DC_TID;
    const dc_u64 esz = DT == DC_F32 ? 4u : 2u;
    const dc_u64 hidden = p.hidden;
    for (dc_u64 row = DC_BID; row < p.rows; row += DC_NBLOCKS) {
        const dc_u64 off = row * hidden * esz;
        const dc_u8* sum = (const dc_u8*)p.sum + off;
        const dc_u8* res = (const dc_u8*)p.residual + off;
        const dc_u8* wgt = (const dc_u8*)p.weight;
        dc_u8* h = (dc_u8*)p.h + off;
        dc_u8* y = (dc_u8*)p.y + off;

        // Pass 1: h = residual + sum (stored), and lane t's sum of squares in element order.
        float part = 0.0f;
        for (dc_u64 c = 0; c * DC_NORM_CHUNK < hidden; ++c) {
            const dc_u64 first = c * DC_NORM_CHUNK + (dc_u64)t * DC_NORM_VECTOR;
#pragma unroll
            for (int v = 0; v < DC_NORM_VECTOR; ++v) {
                const dc_u64 j = first + v;
                if (j < hidden) {
                    const dc_u32 hb = dc_add_scalar<DT, false>(dc_load_elem<DT>(res + j * esz), dc_load_elem<DT>(sum + j * esz));
                    dc_store_elem<DT>(h + j * esz, hb);
                    const float hf = dc_norm_widen<DT>(hb);
                    part = dc_norm_add(part, dc_norm_mul(hf, hf));
                }
            }
        }

        // The halving tree over the 256 lanes.
        s_part[t] = part;
        DC_SYNC_BLOCK();
#if defined(DC_CUDA)
        for (dc_u32 s = DC_NORM_THREADS / 2; s >= 32; s >>= 1) {
            if (t < s) s_part[t] = dc_norm_add(s_part[t], s_part[t + s]);
            DC_SYNC_BLOCK();
        }
        if (t < 32) {
            float v = s_part[t];
#pragma unroll
            for (dc_u32 s = 16; s >= 1; s >>= 1) v = dc_norm_add(v, __shfl_down_sync(0xffffffffu, v, s));
            if (t == 0) s_q = v;
        }
#else
        for (dc_u32 s = DC_NORM_THREADS / 2; s >= 1; s >>= 1) {
            if (t < s) s_part[t] = dc_norm_add(s_part[t], s_part[t + s]);
            DC_SYNC_BLOCK();
        }
        if (t == 0) s_q = s_part[0];
#endif
        DC_SYNC_BLOCK();
        const float q = s_q;

        // hidden <= 2^24 (checked by the host): its f32 is exact.
        const float mean = dc_norm_div(q, (float)p.hidden);
        const float r = dc_norm_add(mean, p.eps);
        const float inv = dc_norm_div(1.0f, dc_norm_sqrt(r));

        // Pass 2: y = dtype(f32(h) * inv * f32(w)), from this thread's own h.
        for (dc_u64 c = 0; c * DC_NORM_CHUNK < hidden; ++c) {
            const dc_u64 first = c * DC_NORM_CHUNK + (dc_u64)t * DC_NORM_VECTOR;
#pragma unroll
            for (int v = 0; v < DC_NORM_VECTOR; ++v) {
                const dc_u64 j = first + v;
                if (j < hidden) {
                    const float hf = dc_norm_widen<DT>(dc_load_elem<DT>(h + j * esz));
                    const float wf = dc_norm_widen<DT>(dc_load_elem<DT>(wgt + j * esz));
                    const float n = dc_norm_mul(hf, inv);
                    dc_store_elem<DT>(y + j * esz, dc_norm_narrow<DT>(dc_norm_mul(n, wf)));
                }
            }
        }
        // The next row reuses s_part and s_q.
        DC_SYNC_BLOCK();
    }
}

// The entry points' body: the dtype's instantiation. A block of another size, or a dtype
// without an add, is a host bug: stop the kernel rather than return with y unwritten.
DC_DEV void dc_residual_rmsnorm(const DcNormParams& p) {
    if (DC_NTID != DC_NORM_THREADS) DC_UNSUPPORTED_WORLD();
    switch (p.dtype) {
        case DC_F32: dc_residual_rmsnorm_rows<DC_F32>(p); break;
        case DC_F16: dc_residual_rmsnorm_rows<DC_F16>(p); break;
        case DC_BF16: dc_residual_rmsnorm_rows<DC_BF16>(p); break;
        default: DC_UNSUPPORTED_WORLD();
    }
}

#endif  // DETCOLL_NORM_H
