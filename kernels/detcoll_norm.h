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
// the 256 partials: p_t = p_t + p_{t+s} for s = 128, 64, ..., 1 and t < s (dc_norm_reduce: on
// CUDA one barrier, then every warp evaluates the levels 128, 64, 32 from shared memory and 16 ..
// 1 through shuffles; on HIP, 64-wide wavefronts and no HIP headers in the offline build, every
// level through shared memory). Same tree, same bits.
//
// Three paths, chosen once per block from the parameters, all with exactly that arithmetic (and,
// in a fused launch, the gathered-sum form and the row form in registers, further below):
//
// * vector, h in registers: hidden % 8 == 0 and every address 16-byte aligned (the same test in
//   every block: dc_norm_vector_ok), and the row short enough (<= 8192 f16/bf16 or 4096 f32
//   elements, DC_NORM_REG_WORDS): thread t loads its 8 elements of each chunk with one (f16,
//   bf16) or two (f32) 16-byte loads per tensor (a warp reads 512 or 1024 contiguous bytes),
//   every load of the row up front, stores h the same way, keeps it in registers for pass 2;
// * vector, streaming: the same for longer rows, pass 2 re-reading h (its own stores);
// * scalar: any other shape or alignment (odd hidden, a tensor offset by one element), one
//   element at a time, pass 2 re-reading h: the original kernel, the reference path.
//
// No operation is fused or approximate: multiplies, adds, the division and the square root are
// inline PTX with an explicit `.rn` (never contracted, never flushed, whatever the NVRTC flags)
// on CUDA, and plain IEEE operations on HIP, whose entry file is compiled with contraction off
// (-ffp-contract=off and `#pragma clang fp contract(off)`) and with clang's default correctly
// rounded f32 division and square root. Conversions are the software ones of detcoll_tree.h
// (exact widening, one round-to-nearest-even narrowing, subnormals kept); the vector paths
// widen f16 with a select form of the same function (dc_norm_f16_to_f32_sel).
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
    // One VOP2 multiply (round to nearest even from the MODE register, f32 denormals kept:
    // mode 3), written out so that the vector paths' independent products are not packed
    // into v_pk_mul_f32 (the compile test allows no packed multiply in the kernels).
    float r;
    asm("v_mul_f32 %0, %1, %2" : "=v"(r) : "v"(a), "v"(b));
    return r;
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

// The vector path's widening: dc_norm_widen with the f16 case written as selects between the
// candidates of dc_f16_to_f32 (detcoll_tree.h) instead of early returns. Each candidate is
// computed exactly as there (man * 2^-24 is the same correctly rounded, here exact, product)
// and the conditions are the same, so the bits are the same for every input; the unrolled lanes
// compile to straight-line code instead of branches per element. (Narrowing keeps
// dc_norm_narrow: its select form needs more registers than it saves.)
DC_DEV float dc_norm_f16_to_f32_sel(dc_u32 h) {
    const dc_u32 sign = (h & 0x8000u) << 16;
    const dc_u32 exp = (h >> 10) & 0x1fu;
    const dc_u32 man = h & 0x3ffu;
    const dc_u32 special = sign | 0x7f800000u | (man << 13);                                // inf, NaN
    const dc_u32 sub = dc_as_u32(dc_norm_mul((float)man, 5.9604644775390625e-8f)) | sign;  // zero, subnormal
    const dc_u32 normal = sign | ((exp + 112u) << 23) | (man << 13);
    return dc_as_f32(exp == 0x1fu ? special : exp == 0u ? sub : normal);
}

template <int DT>
DC_DEV float dc_norm_widen_sel(dc_u32 bits) {
    if (DT == DC_F16) return dc_norm_f16_to_f32_sel(bits);
    return dc_norm_widen<DT>(bits);
}

// ---------------------------------------------------------------------------------------------
// The halving tree and the row's scale, shared by every path.
// ---------------------------------------------------------------------------------------------

// Shared memory of one block: two buffers of the 256 lane partials (rows alternate between
// them, so a row's partials never overwrite ones another warp may still read) and, on HIP,
// the row's sum of squares.
struct DcNormShared {
    float part[2][DC_NORM_THREADS];
    float q[2];
};

// The sum of squares q of one row from lane t's partial `part` (every thread of the block
// calls it; `buf` is the row's parity), in the reference's order: p_t = p_t + p_{t+s} for
// s = 128, 64, ..., 1 and t < s; q = p_0. Returns q in every thread.
//
// CUDA: after one barrier every warp evaluates the whole tree itself: its lane l reads the
// partials l + 32w (w = 0..7), adds them as the levels s = 128, 64, 32 do (a_w + a_{w+4}, then
// b_w + b_{w+2}, then c_0 + c_1: for lane l these are exactly p_t + p_{t+s} at t = l + 32w),
// then the levels 16 .. 1 go through shuffles (shfl_down by s gives lane l < s exactly
// p_l + p_{l+s}) and lane 0's result is broadcast. Every warp computes the same bits; no second
// barrier is needed, and the double buffer makes the next row's writes safe: a warp writes
// buffer b again only two rows later, after every warp has passed the barrier of the row in
// between, so after it read buffer b.
// HIP (64-wide wavefronts, and no HIP headers in the offline build): every level through
// shared memory, the same tree.
#if defined(DC_CUDA)
// The CUDA evaluation of the tree over the 256 partials in shared memory `s` (after a barrier
// that made them visible), by the calling warp; returns q in every lane.
DC_DEV float dc_norm_tree_warp(const float* s) {
    const dc_u32 l = DC_TID & 31u;
    float a[8];
#pragma unroll
    for (int w = 0; w < 8; ++w) a[w] = s[l + 32u * (dc_u32)w];
#pragma unroll
    for (int w = 0; w < 4; ++w) a[w] = dc_norm_add(a[w], a[w + 4]);  // s = 128
#pragma unroll
    for (int w = 0; w < 2; ++w) a[w] = dc_norm_add(a[w], a[w + 2]);  // s = 64
    float v = dc_norm_add(a[0], a[1]);                                // s = 32
#pragma unroll
    for (dc_u32 d = 16; d >= 1; d >>= 1) v = dc_norm_add(v, __shfl_down_sync(0xffffffffu, v, d));
    return __shfl_sync(0xffffffffu, v, 0);
}

// 512 more floats of shared memory: the row form's partials (the first half's, continued by the
// second half's threads, then the lanes' partials for the tree, dc_norm_row_in_regs) and the
// fused epilogue's second set of pair buffers (dc_norm_rows_regs); no launch uses both. One
// allocation for every instantiation: a static shared array in a template is one per dtype and
// vector count, in every kernel of the image (they add up), and 4 KiB more of them measured
// slower on one H200.
DC_DEV float* dc_norm_row_shared() {
    DC_SHARED float s[2 * DC_NORM_THREADS];
    return s;
}
#endif

DC_DEV float dc_norm_reduce(DcNormShared& sh, dc_u32 buf, float part) {
    const dc_u32 t = DC_TID;
    float* s = sh.part[buf];
    if (t < DC_NORM_THREADS) s[t] = part;  // a fused launch's threads beyond the lanes add nothing
    DC_SYNC_BLOCK();
#if defined(DC_CUDA)
    return dc_norm_tree_warp(s);
#else
    for (dc_u32 d = DC_NORM_THREADS / 2; d >= 1; d >>= 1) {
        if (t < d) s[t] = dc_norm_add(s[t], s[t + d]);
        DC_SYNC_BLOCK();
    }
    if (t == 0) sh.q[buf] = s[0];
    DC_SYNC_BLOCK();
    // The next barrier that lets thread 0 write q[buf] again is two rows away (see above).
    return sh.q[buf];
#endif
}

// inv = 1 / sqrt(q / hidden + eps). hidden <= 2^24 (checked by the host): its f32 is exact.
// (A multiplication by 2^-k for hidden = 2^k gives the same bits and was measured on 1x H100
// on 2026-12-06: no faster within noise, 0.97-1.01x the fused call; not kept.)
DC_DEV float dc_norm_inv(const DcNormParams& p, float q) {
    const float mean = dc_norm_div(q, (float)p.hidden);
    const float r = dc_norm_add(mean, p.eps);
    return dc_norm_div(1.0f, dc_norm_sqrt(r));
}

// ---------------------------------------------------------------------------------------------
// Which rows a block normalises. Rows go to blocks in units of `group` consecutive rows: unit k
// (rows k * group .. k * group + group - 1) to block k % blocks. The standalone kernel and a
// fused launch with a barrier use group 1 (rows b, b + blocks, ...); a fused launch whose
// blocks each wrote whole rows of the sum uses the protocol's rows per tile (dc_norm_local_group),
// so that a block normalises exactly the rows it reduced. The bits of a row do not depend on
// the block that computes it.
// ---------------------------------------------------------------------------------------------

// Calls body(row, buf) for this block's rows in increasing order; buf alternates per row (the
// shared buffer of dc_norm_reduce).
template <class F>
DC_DEV void dc_norm_for_rows(const DcNormParams& p, dc_u32 group, F body) {
    const dc_u64 m = group ? group : 1u;
    dc_u32 buf = 0;
    for (dc_u64 k = DC_BID; k * m < p.rows; k += DC_NBLOCKS) {
        const dc_u64 end = (k + 1u) * m < p.rows ? (k + 1u) * m : p.rows;
        for (dc_u64 row = k * m; row < end; ++row, buf ^= 1u) body(row, buf);
    }
}

// The j-th row (from 0) dc_norm_for_rows gives this block, into `row`; false when it has fewer.
DC_DEV bool dc_norm_block_row(const DcNormParams& p, dc_u32 group, dc_u32 j, dc_u64& row) {
    const dc_u32 m = group ? group : 1u;
    row = ((dc_u64)DC_BID + (dc_u64)(j / m) * DC_NBLOCKS) * m + j % m;
    return row < p.rows;
}

// ---------------------------------------------------------------------------------------------
// The scalar path: any hidden, any element-aligned address. One element at a time; pass 2
// re-reads h from memory. The reference path for the shapes the vector path does not take.
// ---------------------------------------------------------------------------------------------

template <int DT>
DC_DEV void dc_norm_rows_scalar(const DcNormParams& p, DcNormShared& sh, dc_u32 group) {
    const dc_u32 t = DC_TID;
    const bool active = t < DC_NORM_THREADS;  // a lane (see dc_norm_epilogue)
    const dc_u64 esz = DT == DC_F32 ? 4u : 2u;
    const dc_u64 hidden = p.hidden;
    dc_norm_for_rows(p, group, [&](dc_u64 row, dc_u32 buf) {
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
                if (active && j < hidden) {
                    const dc_u32 hb = dc_add_scalar<DT, false>(dc_load_elem<DT>(res + j * esz), dc_load_elem<DT>(sum + j * esz));
                    dc_store_elem<DT>(h + j * esz, hb);
                    const float hf = dc_norm_widen<DT>(hb);
                    part = dc_norm_add(part, dc_norm_mul(hf, hf));
                }
            }
        }

        const float inv = dc_norm_inv(p, dc_norm_reduce(sh, buf, part));

        // Pass 2: y = dtype(f32(h) * inv * f32(w)), from this thread's own h.
        for (dc_u64 c = 0; c * DC_NORM_CHUNK < hidden; ++c) {
            const dc_u64 first = c * DC_NORM_CHUNK + (dc_u64)t * DC_NORM_VECTOR;
#pragma unroll
            for (int v = 0; v < DC_NORM_VECTOR; ++v) {
                const dc_u64 j = first + v;
                if (active && j < hidden) {
                    const float hf = dc_norm_widen<DT>(dc_load_elem<DT>(h + j * esz));
                    const float wf = dc_norm_widen<DT>(dc_load_elem<DT>(wgt + j * esz));
                    const float n = dc_norm_mul(hf, inv);
                    dc_store_elem<DT>(y + j * esz, dc_norm_narrow<DT>(dc_norm_mul(n, wf)));
                }
            }
        }
    });
}

// ---------------------------------------------------------------------------------------------
// The vector path: hidden % 8 == 0 and every address 16-byte aligned (decided once per block,
// dc_norm_vector_ok). Thread t's 8 elements of a chunk, 8t .. 8t+7, are one 16-byte vector for
// f16/bf16 and two for f32, loaded and stored whole (a warp moves 512 or 1024 contiguous bytes);
// either all 8 are in the row or none (hidden % 8 == 0). Element e of the 8 is bits
// [16(e%2), 16(e%2) + 16) of word e/2 for f16/bf16 (little endian), word e for f32. The
// arithmetic and its order are the scalar path's: the packed dtype add is the scalar add in
// each half (detcoll_tree.h), the squares go into the lane's partial in increasing j.
// ---------------------------------------------------------------------------------------------

// 32-bit words of h one thread keeps in registers between the passes: DC_NORM_REG_WORDS / words
// per lane chunks, i.e. rows of up to 4 * 2048 = 8192 f16/bf16 elements or 2 * 2048 = 4096 f32
// ones (64 registers a thread for the whole kernel on sm_90: 4 blocks of 256 threads per SM).
// Longer rows re-read h (the thread's own stores) in pass 2.
#define DC_NORM_REG_WORDS 16

// 16-byte loads and stores of our plain vector type (NVRTC emits ld.global.v4 / st.global.v4;
// the no_gpu test checks). Plain accesses rather than volatile or non-coherent ones: sum,
// residual and the outputs may alias exactly, so the compiler must keep one thread's loads and
// stores of them in program order, which it does for ordinary accesses it cannot prove apart.
DC_DEV dc_u32x4 dc_norm_ld16(const dc_u8* p) { return *(const dc_u32x4*)p; }

DC_DEV void dc_norm_st16(dc_u8* p, dc_u32x4 v) { *(dc_u32x4*)p = v; }

// 32-bit words of one lane's 8 elements, and its 16-byte vectors.
#define DC_NORM_WORDS(DT) ((DT) == DC_F32 ? 8 : 4)

template <int DT>
DC_DEV void dc_norm_ld_lane(const dc_u8* p, dc_u32 (&w)[DC_NORM_WORDS(DT)]) {
#pragma unroll
    for (int k = 0; k < DC_NORM_WORDS(DT) / 4; ++k) {
        const dc_u32x4 v = dc_norm_ld16(p + 16 * k);
        w[4 * k] = v.x;
        w[4 * k + 1] = v.y;
        w[4 * k + 2] = v.z;
        w[4 * k + 3] = v.w;
    }
}

template <int DT>
DC_DEV void dc_norm_st_lane(dc_u8* p, const dc_u32 (&w)[DC_NORM_WORDS(DT)]) {
#pragma unroll
    for (int k = 0; k < DC_NORM_WORDS(DT) / 4; ++k) {
        dc_u32x4 v;
        v.x = w[4 * k];
        v.y = w[4 * k + 1];
        v.z = w[4 * k + 2];
        v.w = w[4 * k + 3];
        dc_norm_st16(p + 16 * k, v);
    }
}

// A lane's 8 elements as f32 (exact): element e is bits [16(e%2), 16(e%2) + 16) of word e/2 for
// f16/bf16 (little endian), word e for f32.
template <int DT>
DC_DEV void dc_norm_widen_lane(float (&f)[DC_NORM_VECTOR], const dc_u32 (&w)[DC_NORM_WORDS(DT)]) {
#pragma unroll
    for (int e = 0; e < DC_NORM_VECTOR; ++e) {
        if constexpr (DT == DC_F32) f[e] = dc_as_f32(w[e]);
        else f[e] = dc_norm_widen_sel<DT>((w[e >> 1] >> (16 * (e & 1))) & 0xffffu);
    }
}

// h = residual + sum for one lane's 8 elements (word by word: 1 f32 or 2 f16/bf16 each).
template <int DT>
DC_DEV void dc_norm_add_lane(dc_u32 (&h)[DC_NORM_WORDS(DT)], const dc_u32 (&r)[DC_NORM_WORDS(DT)],
                             const dc_u32 (&s)[DC_NORM_WORDS(DT)]) {
#pragma unroll
    for (int i = 0; i < DC_NORM_WORDS(DT); ++i) h[i] = dc_add_word<DT, false>(r[i], s[i]);
}

// The lane's squares into its partial, in increasing j.
DC_DEV float dc_norm_squares_lane(float part, const float (&hf)[DC_NORM_VECTOR]) {
#pragma unroll
    for (int e = 0; e < DC_NORM_VECTOR; ++e) part = dc_norm_add(part, dc_norm_mul(hf[e], hf[e]));
    return part;
}

// y = dtype(f32(h) * inv * f32(w)) for one lane's 8 elements, as words.
template <int DT>
DC_DEV void dc_norm_scale_lane(dc_u32 (&y)[DC_NORM_WORDS(DT)], const float (&hf)[DC_NORM_VECTOR],
                               const dc_u32 (&w)[DC_NORM_WORDS(DT)], float inv) {
    float wf[DC_NORM_VECTOR];
    dc_norm_widen_lane<DT>(wf, w);
#pragma unroll
    for (int i = 0; i < DC_NORM_WORDS(DT); ++i) y[i] = 0u;
#pragma unroll
    for (int e = 0; e < DC_NORM_VECTOR; ++e) {
        const float n = dc_norm_mul(hf[e], inv);
        const dc_u32 b = dc_norm_narrow<DT>(dc_norm_mul(n, wf[e]));
        if constexpr (DT == DC_F32) y[e] = b;
        else y[e >> 1] |= b << (16 * (e & 1));
    }
}

// Whether the launch takes the vector path: the same answer in every block (one check each).
DC_DEV bool dc_norm_vector_ok(const DcNormParams& p) {
    return p.hidden % DC_NORM_VECTOR == 0 && ((p.sum | p.residual | p.weight | p.h | p.y) & 15u) == 0;
}

// The vector path with h in registers: rows of at most C chunks (hidden <= C * 2048).
// EARLY_W (the fused launch's epilogue, whose blocks have registers to spare): each row loads
// the weight together with its residual and sum, instead of after its sum of squares, taking a
// load's latency off the row's dependent chain. The arithmetic is the same.
//
// The fused epilogue's blocks (CUDA, 512 threads: EARLY_W) with two rows or more take them two
// at a time, one per half of the block (threads 256 + t are lane t of the second row), instead
// of one at a time with half the threads idle: such a block (the protocol's grid is small when
// ranks share a GPU: 16 blocks a rank at world 8 on one H200) then waits for one row's chain of
// loads, barrier and tree per pair instead of per row. (Blocks of one row keep the sequential
// loop: the pair form measured 0.2-0.5 us slower for them on one H200.) Each row's lanes, order
// and tree are the same, so are its bits. The pair's partials go to one buffer per half; pairs
// alternate between two sets of buffers (sh.part and the row form's, dc_norm_row_shared, which
// no epilogue uses otherwise), so, as in dc_norm_reduce, a warp writes a set again only after
// every warp has passed the barrier of the pair in between, hence after it read that set.
template <int DT, int C, bool EARLY_W>
DC_DEV void dc_norm_rows_regs(const DcNormParams& p, DcNormShared& sh, dc_u32 group) {
    constexpr int NW = DC_NORM_WORDS(DT);
    const dc_u64 esz = DT == DC_F32 ? 4u : 2u;
    const dc_u64 hidden = p.hidden;
#if defined(DC_CUDA)
    dc_u64 second_row;
    const bool pairs = EARLY_W && DC_NTID == 2u * DC_NORM_THREADS && dc_norm_block_row(p, group, 1u, second_row);
#else
    const bool pairs = false;
#endif
    const dc_u32 t = pairs ? DC_TID % DC_NORM_THREADS : DC_TID;  // this thread's lane of its row
    const dc_u64 lane = (dc_u64)t * DC_NORM_VECTOR;               // its first element of chunk 0
    const bool active = t < DC_NORM_THREADS;                      // a lane (see dc_norm_epilogue)
    const dc_u8* wgt = (const dc_u8*)p.weight + lane * esz;

    // Row `row`'s loads, then h = residual + sum: stored, squared in order into the returned
    // partial, and kept (as words). Chunk c holds this thread's vector when
    // c * 2048 + 8t < hidden. Every load of the row first.
    auto first_pass = [&](dc_u64 row, dc_u32 (&hw)[C][NW], dc_u32 (&w_early)[EARLY_W ? C : 1][NW]) -> float {
        const dc_u64 off = (row * hidden + lane) * esz;
        const dc_u8* sum = (const dc_u8*)p.sum + off;
        const dc_u8* res = (const dc_u8*)p.residual + off;
        dc_u8* h = (dc_u8*)p.h + off;
        float part = 0.0f;
        dc_u32 sw[C][NW];
#pragma unroll
        for (int c = 0; c < C; ++c) {
            if (active && (dc_u64)c * DC_NORM_CHUNK + lane < hidden) {
                dc_norm_ld_lane<DT>(res + (dc_u64)c * DC_NORM_CHUNK * esz, hw[c]);
                dc_norm_ld_lane<DT>(sum + (dc_u64)c * DC_NORM_CHUNK * esz, sw[c]);
                if constexpr (EARLY_W) dc_norm_ld_lane<DT>(wgt + (dc_u64)c * DC_NORM_CHUNK * esz, w_early[c]);
            }
        }
#pragma unroll
        for (int c = 0; c < C; ++c) {
            if (active && (dc_u64)c * DC_NORM_CHUNK + lane < hidden) {
                dc_norm_add_lane<DT>(hw[c], hw[c], sw[c]);
                dc_norm_st_lane<DT>(h + (dc_u64)c * DC_NORM_CHUNK * esz, hw[c]);
                float hf[DC_NORM_VECTOR];
                dc_norm_widen_lane<DT>(hf, hw[c]);
                part = dc_norm_squares_lane(part, hf);
            }
        }
        return part;
    };
    // y of row `row` from h kept and the row's scale. The weight (one row, read by every row:
    // it stays in the caches) after the barrier, which keeps the registers, and so the blocks
    // per SM, of the loads above (or with them: EARLY_W).
    auto second_pass = [&](dc_u64 row, const dc_u32 (&hw)[C][NW], const dc_u32 (&w_early)[EARLY_W ? C : 1][NW],
                           float inv) {
        dc_u8* y = (dc_u8*)p.y + (row * hidden + lane) * esz;
#pragma unroll
        for (int c = 0; c < C; ++c) {
            if (active && (dc_u64)c * DC_NORM_CHUNK + lane < hidden) {
                dc_u32 ww[NW], yw[NW];
                float hf[DC_NORM_VECTOR];
                if constexpr (EARLY_W) {
#pragma unroll
                    for (int i = 0; i < NW; ++i) ww[i] = w_early[c][i];
                } else {
                    dc_norm_ld_lane<DT>(wgt + (dc_u64)c * DC_NORM_CHUNK * esz, ww);
                }
                dc_norm_widen_lane<DT>(hf, hw[c]);
                dc_norm_scale_lane<DT>(yw, hf, ww, inv);
                dc_norm_st_lane<DT>(y + (dc_u64)c * DC_NORM_CHUNK * esz, yw);
            }
        }
    };

    if (!pairs) {
        dc_norm_for_rows(p, group, [&](dc_u64 row, dc_u32 buf) {
            dc_u32 hw[C][NW];
            dc_u32 w_early[EARLY_W ? C : 1][NW];
            const float part = first_pass(row, hw, w_early);
            second_pass(row, hw, w_early, dc_norm_inv(p, dc_norm_reduce(sh, buf, part)));
        });
        return;
    }
#if defined(DC_CUDA)
    const dc_u32 half = DC_TID / DC_NORM_THREADS;
    float* second_set = dc_norm_row_shared();
    for (dc_u32 j = 0;; j += 2u) {
        dc_u64 row;
        if (!dc_norm_block_row(p, group, j, row)) break;  // the same in every thread
        const bool mine = dc_norm_block_row(p, group, j + half, row);
        float* part_buf = (j & 2u) ? second_set + half * DC_NORM_THREADS : sh.part[half];
        dc_u32 hw[C][NW];
        dc_u32 w_early[EARLY_W ? C : 1][NW];
        part_buf[t] = mine ? first_pass(row, hw, w_early) : 0.0f;
        DC_SYNC_BLOCK();
        const float inv = dc_norm_inv(p, dc_norm_tree_warp(part_buf));
        if (mine) second_pass(row, hw, w_early, inv);
    }
#endif
}

// The vector path for longer rows: pass 2 re-reads h (this thread's own stores).
template <int DT>
DC_DEV void dc_norm_rows_stream(const DcNormParams& p, DcNormShared& sh, dc_u32 group) {
    constexpr int NW = DC_NORM_WORDS(DT);
    const dc_u64 esz = DT == DC_F32 ? 4u : 2u;
    const dc_u64 hidden = p.hidden;
    const dc_u64 lane = (dc_u64)DC_TID * DC_NORM_VECTOR;
    const bool active = DC_TID < DC_NORM_THREADS;  // a lane (see dc_norm_epilogue)
    const dc_u8* wgt = (const dc_u8*)p.weight + lane * esz;
    dc_norm_for_rows(p, group, [&](dc_u64 row, dc_u32 buf) {
        const dc_u64 off = (row * hidden + lane) * esz;
        const dc_u8* sum = (const dc_u8*)p.sum + off;
        const dc_u8* res = (const dc_u8*)p.residual + off;
        dc_u8* h = (dc_u8*)p.h + off;
        dc_u8* y = (dc_u8*)p.y + off;

        float part = 0.0f;
        for (dc_u64 c = 0; active && c * DC_NORM_CHUNK + lane < hidden; ++c) {
            dc_u32 hw[NW], sw[NW];
            float hf[DC_NORM_VECTOR];
            dc_norm_ld_lane<DT>(res + c * DC_NORM_CHUNK * esz, hw);
            dc_norm_ld_lane<DT>(sum + c * DC_NORM_CHUNK * esz, sw);
            dc_norm_add_lane<DT>(hw, hw, sw);
            dc_norm_st_lane<DT>(h + c * DC_NORM_CHUNK * esz, hw);
            dc_norm_widen_lane<DT>(hf, hw);
            part = dc_norm_squares_lane(part, hf);
        }

        const float inv = dc_norm_inv(p, dc_norm_reduce(sh, buf, part));

        for (dc_u64 c = 0; active && c * DC_NORM_CHUNK + lane < hidden; ++c) {
            dc_u32 hw[NW], ww[NW], yw[NW];
            float hf[DC_NORM_VECTOR];
            dc_norm_ld_lane<DT>(h + c * DC_NORM_CHUNK * esz, hw);
            dc_norm_ld_lane<DT>(wgt + c * DC_NORM_CHUNK * esz, ww);
            dc_norm_widen_lane<DT>(hf, hw);
            dc_norm_scale_lane<DT>(yw, hf, ww, inv);
            dc_norm_st_lane<DT>(y + c * DC_NORM_CHUNK * esz, yw);
        }
    });
}

template <int DT, bool EARLY_W>
DC_DEV void dc_norm_rows(const DcNormParams& p, DcNormShared& sh, dc_u32 group) {
    if (!dc_norm_vector_ok(p)) {
        dc_norm_rows_scalar<DT>(p, sh, group);
    } else if (p.hidden <= DC_NORM_REG_WORDS / DC_NORM_WORDS(DT) * DC_NORM_CHUNK) {
        dc_norm_rows_regs<DT, DC_NORM_REG_WORDS / DC_NORM_WORDS(DT), EARLY_W>(p, sh, group);
    } else {
        dc_norm_rows_stream<DT>(p, sh, group);
    }
}

// The entry points' body: the dtype's instantiation. A block of another size, or a dtype
// without an add, is a host bug: stop the kernel rather than return with y unwritten.
//
// Rows go to blocks in units of `group` (dc_norm_for_rows); lanes are the threads below
// DC_NORM_THREADS. A block of more threads (the fused collective's DC_THREADS) runs the same
// code: its other threads only join the barriers, so the arithmetic and its order are unchanged.
// EARLY_W: see dc_norm_rows_regs (the fused epilogue's instantiation).
template <bool EARLY_W>
DC_DEV void dc_norm_any(const DcNormParams& p, dc_u32 group) {
    DC_SHARED DcNormShared sh;
    if (DC_NTID < DC_NORM_THREADS) DC_UNSUPPORTED_WORLD();
    switch (p.dtype) {
        case DC_F32: dc_norm_rows<DC_F32, EARLY_W>(p, sh, group); break;
        case DC_F16: dc_norm_rows<DC_F16, EARLY_W>(p, sh, group); break;
        case DC_BF16: dc_norm_rows<DC_BF16, EARLY_W>(p, sh, group); break;
        default: DC_UNSUPPORTED_WORLD();
    }
}

// The standalone kernel (after an all_reduce launch). A programmatic dependent launch on CUDA
// (crates/cuda-ipc/src/norm.rs): its blocks may start while the all_reduce still runs, and
// wait here until it has completed and its output is visible.
DC_DEV void dc_residual_rmsnorm(const DcNormParams& p) {
    DC_GRID_DEP_WAIT();
    if (DC_NTID != DC_NORM_THREADS) DC_UNSUPPORTED_WORLD();
    dc_norm_any<false>(p, 1u);
}

// ---------------------------------------------------------------------------------------------
// The gathered-sum form (CUDA; large batches on the RS+AG and bulk push routes). The fused
// launch's phase-2 segments carry DC_SEG_NORM_READ: the protocol skips their copies (a peer's
// reduced shard into the output), and the norm reads every element's sum where it lies after
// phase 2 — the peer's frame (RS+AG), the peer's reduced-shard slot of the own frame (bulk
// push), or the output for the rank's own shard and for the rows of a chunked call's earlier
// launches (dc_norm_sum_at, the same addresses the skipped copy would have read). That saves
// the copy's write and the norm's re-read of the output: 2n (W - 1) / W bytes per rank.
//
// One warp per row, so that a block keeps as many rows in flight as it has warps (the
// protocol's blocks are few; one 256-lane row per block at a time was the measured bottleneck
// of an in-kernel norm). The arithmetic and its order are the block form's exactly: lane t of
// the reference (elements c * 2048 + 8t .. + 7 of chunk c) is lane t % 32 of the warp, which
// keeps the 8 partials of lanes t % 32 + 32k (k = 0..7) apart; the halving tree is then
// dc_norm_reduce's CUDA evaluation without its shared-memory step (thread l already holds
// p_{l + 32k} as partial k): levels 128, 64, 32 in registers, 16 .. 1 through shuffles.
// Only the vector path: the host sets the flag only when dc_norm_vector_ok holds and every
// segment and source is 16-byte aligned (CollectiveNormParams::new).
// ---------------------------------------------------------------------------------------------

// Whether this fused launch reads the gathered sums in place (the host flags every phase-2
// segment or none).
DC_DEV bool dc_norm_reads_gathered(const DcHeader& h, const DcSeg* seg) {
    return h.nphase2 != 0u && (seg[h.nstage + h.nphase1].flags & DC_SEG_NORM_READ) != 0u;
}

#if defined(DC_CUDA)
// The address of the sum of output byte `o` (the first of a 16-byte vector; no segment boundary
// falls inside one, but one may fall between the two vectors of an f32 lane): the source the phase-2 copy of its segment reads (dc_run_segment's
// gather on the pull route, dc_bulk_gather's on bulk push), or the output itself.
DC_DEV const dc_u8* dc_norm_sum_at(const DcHeader& h, const DcSeg* seg, dc_u64 frame, const DcNormParams& p, dc_u64 o) {
    const dc_u64 a = p.sum + o;
    const dc_u32 first = h.nstage + h.nphase1;
    for (dc_u32 i = 0; i < h.nphase2; ++i) {
        const DcSeg& s = seg[first + i];
        const dc_u64 rel = a - s.ptr;
        if (rel < s.bytes) {
            const dc_u64 base = h.mode == DC_MODE_PUSH ? (s.peer == h.rank ? s.src : h.data[h.rank] + frame + s.frame_off)
                                                       : h.data[s.peer] + frame + s.frame_off;
            return (const dc_u8*)(base + rel);
        }
    }
    return (const dc_u8*)a;
}

template <int DT>
DC_DEV void dc_norm_rows_gathered(const DcHeader& h, const DcSeg* seg, dc_u64 frame, const DcNormParams& p) {
    constexpr int NW = DC_NORM_WORDS(DT);
    constexpr int KG = 16 / NW;  // lanes of a thread whose loads are in flight together (32 words)
    const dc_u64 esz = DT == DC_F32 ? 4u : 2u;
    const dc_u64 hidden = p.hidden;
    const dc_u64 row_bytes = hidden * esz;
    const dc_u32 l = DC_TID & 31u;
    const dc_u64 warps = DC_NTID / 32u;
    const dc_u8* wgt = (const dc_u8*)p.weight;
    // Rows b * warps + w, then a launch's worth of rows on (the host sizes the grid to a block
    // per `warps` rows, up to the most it keeps resident).
    for (dc_u64 row = (dc_u64)DC_BID * warps + DC_TID / 32u; row < p.rows; row += (dc_u64)DC_NBLOCKS * warps) {
        const dc_u64 base = row * row_bytes;
        float part[8];
#pragma unroll
        for (int k = 0; k < 8; ++k) part[k] = 0.0f;

        // Pass 1: h = residual + sum (stored), lane l + 32k's squares into part[k] in increasing j.
        for (dc_u64 c = 0; c * DC_NORM_CHUNK < hidden; ++c) {
#pragma unroll
            for (int k0 = 0; k0 < 8; k0 += KG) {
                dc_u32 rw[KG][NW], sw[KG][NW];
#pragma unroll
                for (int k = 0; k < KG; ++k) {
                    const dc_u64 e = c * DC_NORM_CHUNK + (dc_u64)(l + 32u * (dc_u32)(k0 + k)) * DC_NORM_VECTOR;
                    if (e < hidden) {
                        const dc_u64 o = base + e * esz;
                        dc_norm_ld_lane<DT>((const dc_u8*)p.residual + o, rw[k]);
                        // Each 16-byte vector from its own source (an f32 lane is two, and a
                        // segment boundary may fall between them).
#pragma unroll
                        for (int v = 0; v < NW / 4; ++v) {
                            const dc_u32x4 x = dc_norm_ld16(dc_norm_sum_at(h, seg, frame, p, o + 16u * (dc_u64)v));
                            sw[k][4 * v] = x.x;
                            sw[k][4 * v + 1] = x.y;
                            sw[k][4 * v + 2] = x.z;
                            sw[k][4 * v + 3] = x.w;
                        }
                    }
                }
#pragma unroll
                for (int k = 0; k < KG; ++k) {
                    const dc_u64 e = c * DC_NORM_CHUNK + (dc_u64)(l + 32u * (dc_u32)(k0 + k)) * DC_NORM_VECTOR;
                    if (e < hidden) {
                        dc_norm_add_lane<DT>(rw[k], rw[k], sw[k]);
                        dc_norm_st_lane<DT>((dc_u8*)p.h + base + e * esz, rw[k]);
                        float hf[DC_NORM_VECTOR];
                        dc_norm_widen_lane<DT>(hf, rw[k]);
                        part[k0 + k] = dc_norm_squares_lane(part[k0 + k], hf);
                    }
                }
            }
        }

        // The halving tree (dc_norm_reduce's levels): p_t + p_{t+128} is part[k] + part[k + 4]
        // for t = l + 32k, and so on; every lane of the warp gets the same q.
#pragma unroll
        for (int w = 0; w < 4; ++w) part[w] = dc_norm_add(part[w], part[w + 4]);  // s = 128
#pragma unroll
        for (int w = 0; w < 2; ++w) part[w] = dc_norm_add(part[w], part[w + 2]);  // s = 64
        float v = dc_norm_add(part[0], part[1]);                                   // s = 32
#pragma unroll
        for (dc_u32 d = 16; d >= 1; d >>= 1) v = dc_norm_add(v, __shfl_down_sync(0xffffffffu, v, d));
        const float inv = dc_norm_inv(p, __shfl_sync(0xffffffffu, v, 0));

        // Pass 2: y = dtype(f32(h) * inv * f32(w)) from this thread's own h.
        for (dc_u64 c = 0; c * DC_NORM_CHUNK < hidden; ++c) {
#pragma unroll
            for (int k0 = 0; k0 < 8; k0 += KG) {
                dc_u32 hw[KG][NW], ww[KG][NW];
#pragma unroll
                for (int k = 0; k < KG; ++k) {
                    const dc_u64 e = c * DC_NORM_CHUNK + (dc_u64)(l + 32u * (dc_u32)(k0 + k)) * DC_NORM_VECTOR;
                    if (e < hidden) {
                        dc_norm_ld_lane<DT>((const dc_u8*)p.h + base + e * esz, hw[k]);
                        dc_norm_ld_lane<DT>(wgt + e * esz, ww[k]);
                    }
                }
#pragma unroll
                for (int k = 0; k < KG; ++k) {
                    const dc_u64 e = c * DC_NORM_CHUNK + (dc_u64)(l + 32u * (dc_u32)(k0 + k)) * DC_NORM_VECTOR;
                    if (e < hidden) {
                        dc_u32 yw[NW];
                        float hf[DC_NORM_VECTOR];
                        dc_norm_widen_lane<DT>(hf, hw[k]);
                        dc_norm_scale_lane<DT>(yw, hf, ww[k], inv);
                        dc_norm_st_lane<DT>((dc_u8*)p.y + base + e * esz, yw);
                    }
                }
            }
        }
    }
}
#endif

// ---------------------------------------------------------------------------------------------
// The row form in registers (CUDA; a fused launch on the LL push or the one-shot route where
// each block reduces exactly one whole row in f16/bf16: of hidden 4096, the decode shape, one
// tile; or of hidden 8192, two tiles). The reduce (dc_push_reduce on LL push,
// dc_reduce_row_kept on one-shot) gives thread t of a block its NV 16-byte vectors of the
// block's row (dc_row_vector: with one a row, vector t of the 8 KiB tile, elements 8t .. 8t + 7,
// lane t % 256 of chunk t / 256 in the reference's order; with two, chunks 0-1 of lane t for
// t < 256 and chunks 2-3 of lane t - 256 for the others). So the thread keeps its vectors of the
// sum in registers (DcNormRowRegs) and loads its vectors of the residual and the weight before
// the protocol's waits: the norm then reads nothing from memory. The arithmetic and its order
// are the block form's: thread t < 256 adds the squares of its vectors into a partial from 0
// (the first chunks of lane t), thread 256 + t continues that partial with its own (the later
// chunks of lane t), in increasing j; the halving tree over the 256 lane partials is
// dc_norm_reduce's; y from h and the weight in registers. The protocol body
// (dc_collective_mode) runs it inline right after its reduce, without the epilogue's block
// barrier: each thread starts from its own registers, and the form's own two barriers order the
// shared partials.
// ---------------------------------------------------------------------------------------------

// Whether every block of this fused launch writes whole rows of the sum and nothing else writes
// it: the launch is the call's only one (its one reduce segment is the whole sum: rows * row
// bytes from frame offset 0), the protocol is the LL push or the one-shot pull (one reduce
// segment in phase 1, no phase 2: tile t of it, output bytes [t * tile, (t + 1) * tile), is
// block t % grid's), and the launch has exactly the protocol's blocks. (That last test is also
// what keeps a call from ending before its peers' flags are seen: blocks beyond the grid take no
// part in the protocol and wait for no peer, and only the launch's barrier, which every protocol
// block reaches after its waits, orders the call's end after theirs. A form without the
// barrier must keep it.)
DC_DEV bool dc_norm_whole_sum(const DcHeader& h, const DcSeg* seg, const DcNormParams& p) {
    if (h.mode == DC_MODE_PUSH || h.nphase1 != 1u || h.nphase2 != 0u || DC_NBLOCKS != h.grid) return false;
    const DcSeg& s = seg[h.nstage];
    const dc_u64 row = (dc_u64)p.hidden * (p.dtype == DC_F32 ? 4u : 2u);
    if ((s.flags & DC_SEG_GATHER) != 0u || s.frame_off != 0u || s.ptr != p.sum) return false;
    return row != 0u && s.bytes == p.rows * row;
}

// Whether a fused launch takes the row form in registers with one vector a thread: the launch's
// blocks each reduce whole rows (`group`, dc_norm_local_group) of exactly one 16-byte vector per
// thread (a row is the tile: f16/bf16, hidden * 2 = tile = 16 * threads), each block at most one
// (rows <= grid), on the LL push or the one-shot pull route (dc_norm_local_group already refuses
// bulk push and every launch with a phase 2), on the norm's vector path. The same answer in
// every block.
DC_DEV bool dc_norm_row_regs_ok(const DcHeader& h, const DcNormParams& p, dc_u32 group) {
#if defined(DC_CUDA)
    return h.mode != DC_MODE_PUSH && group == 1u && (p.dtype == DC_F16 || p.dtype == DC_BF16) &&
           (dc_u64)p.hidden * 2u == h.tile_bytes && h.tile_bytes == 16u * DC_NTID &&
           2u * DC_NORM_CHUNK == p.hidden && p.rows <= h.grid && dc_norm_vector_ok(p);
#else
    (void)h;
    (void)p;
    (void)group;
    return false;
#endif
}

// Whether a fused launch takes the row form in registers with two vectors a thread (declared in
// detcoll_protocol.h; every thread asks it before the launch's wait, to pick the body): a row
// is two tiles of one 16-byte vector per thread (f16/bf16, hidden 8192), the launch is one-shot
// or LL push and its blocks reduce whole rows (dc_norm_whole_sum), every row has a block of its
// own (rows <= grid), on the norm's vector path. Block b < rows then reduces row b: on one-shot
// tiles 2b and 2b + 1, after the ready flags of the blocks that staged them, in every peer and
// in its own rank (tile t is block t % grid's: blocks 2b and 2b + 1 while 2 * rows <= grid; with
// more rows, blocks stage two tiles each and row b waits for blocks 2b % grid and (2b + 1) %
// grid; dc_collective_mode's wait); on LL push the row
// is a unit of the chunk walk (dc_for_chunks<2>: unit u is block u % grid's). The staging is
// the plain all_reduce's either way, so a rank that takes another form (its own addresses'
// alignment decides dc_norm_vector_ok) still pairs with its peers' flags.
DC_DEV bool dc_norm_two_tile_rows(const DcHeader& h, const DcSeg* seg, const DcNormParams& p) {
#if defined(DC_CUDA)
    const bool blocks = (h.mode == DC_MODE_PULL || h.mode == DC_MODE_PUSH_LL) && p.rows <= h.grid;
    return blocks && (p.dtype == DC_F16 || p.dtype == DC_BF16) && h.tile_bytes == 16u * DC_NTID &&
           (dc_u64)p.hidden * 2u == 2u * (dc_u64)h.tile_bytes && 4u * DC_NORM_CHUNK == p.hidden &&
           dc_norm_vector_ok(p) && dc_norm_whole_sum(h, seg, p);
#else
    (void)h;
    (void)seg;
    (void)p;
    return false;
#endif
}

// The row form's loads before the protocol (declared in detcoll_protocol.h): this thread's
// vectors of its block's row of the residual and of the weight. The residual is never an
// output of the protocol (the host refuses a residual overlapping the sum, detcoll_core's
// validate_norm), so reading it first reads the same values.
template <int NV>
DC_DEV void dc_norm_row_regs_load(const DcNormPlan& plan, DcNormRowRegs<NV>& regs) {
    const DcNormParams& p = plan.n;
    if ((dc_u64)DC_BID >= p.rows) return;
    const dc_u8* residual = (const dc_u8*)p.residual + (dc_u64)DC_BID * p.hidden * 2u;
#pragma unroll
    for (int k = 0; k < NV; ++k) {
        const dc_u64 v = 16u * (dc_u64)dc_row_vector<NV>(k);
        regs.residual[k] = dc_norm_ld16(residual + v);
        regs.weight[k] = dc_norm_ld16((const dc_u8*)p.weight + v);
    }
}

#if defined(DC_CUDA)
// The row forms' pairs (dc_norm_protocol_rows: f16/bf16 rows of 4096 two to a 16 KiB tile, two
// vectors a thread): tile `tile` holds rows 2 * tile and 2 * tile + 1, and dc_row_vector<2>
// gives thread t < 256 chunks 0 and 1 of lane t of the first, thread 256 + t the same of the
// second — each thread a whole lane of its row, in the reference's order. So each half of the
// block is one row's 256 lanes: the halves' partials go to the two halves of the 512 shared
// floats and each half's warps evaluate their own row's tree (dc_norm_tree_warp), the two rows'
// chains side by side after one barrier, where a row a tile costs two barriers a row. The
// lanes, order and tree are every form's, so are the bits. The barrier before the partials'
// stores keeps them from the previous pair's trees (a block takes its tiles one after another).
template <int DT>
DC_DEV void dc_norm_row_pair_in_regs(const DcNormParams& p, const DcNormRowRegs<2>& r, dc_u64 tile) {
    float* s = dc_norm_row_shared();
    if (2u * tile >= p.rows) return;  // a block without a tile (the same for its threads)
    const dc_u32 half = DC_TID / DC_NORM_THREADS;
    const bool mine = 2u * tile + half < p.rows;  // always, for the whole tiles the host cuts
    const dc_u64 base = tile * 4u * p.hidden;     // the tile's first byte: two rows of 2 * hidden
    float hf[2][DC_NORM_VECTOR];
    float q = 0.0f;
#pragma unroll
    for (int k = 0; k < 2; ++k) {
        const dc_u64 off = base + 16u * (dc_u64)dc_row_vector<2>(k);
        dc_u32 hw[4] = {r.residual[k].x, r.residual[k].y, r.residual[k].z, r.residual[k].w};
        const dc_u32 sw[4] = {r.sum[k].x, r.sum[k].y, r.sum[k].z, r.sum[k].w};
        dc_norm_add_lane<DT>(hw, hw, sw);
        if (mine) dc_norm_st_lane<DT>((dc_u8*)p.h + off, hw);
        dc_norm_widen_lane<DT>(hf[k], hw);
        q = dc_norm_squares_lane(q, hf[k]);
    }
    DC_SYNC_BLOCK();
    s[DC_TID] = q;
    DC_SYNC_BLOCK();
    const float inv = dc_norm_inv(p, dc_norm_tree_warp(s + half * DC_NORM_THREADS));
    if (!mine) return;
#pragma unroll
    for (int k = 0; k < 2; ++k) {
        const dc_u64 off = base + 16u * (dc_u64)dc_row_vector<2>(k);
        const dc_u32 ww[4] = {r.weight[k].x, r.weight[k].y, r.weight[k].z, r.weight[k].w};
        dc_u32 yw[4];
        dc_norm_scale_lane<DT>(yw, hf[k], ww, inv);
        dc_norm_st_lane<DT>((dc_u8*)p.y + off, yw);
    }
}

// The row form's norm of row `index` (a tile; with two rows of 4096 to the tile, the pair of
// tile `index`: dc_norm_row_pair_in_regs).
template <int DT, int NV>
DC_DEV void dc_norm_row_in_regs(const DcNormParams& p, const DcNormRowRegs<NV>& r, dc_u64 index) {
    if constexpr (NV == 2) {
        if (p.hidden == 2u * DC_NORM_CHUNK) {
            dc_norm_row_pair_in_regs<DT>(p, r, index);
            return;
        }
    }
    float* s_first = dc_norm_row_shared();
    float* s_part = s_first + DC_NORM_THREADS;
    if (index >= p.rows) return;      // a block without a row (the same for its threads)
    const dc_u32 lane = DC_TID % DC_NORM_THREADS;
    const dc_u64 row = index * p.hidden * 2u;
    float hf[NV][DC_NORM_VECTOR];
#pragma unroll
    for (int k = 0; k < NV; ++k) {
        const dc_u64 off = row + 16u * (dc_u64)dc_row_vector<NV>(k);
        dc_u32 hw[4] = {r.residual[k].x, r.residual[k].y, r.residual[k].z, r.residual[k].w};
        const dc_u32 sw[4] = {r.sum[k].x, r.sum[k].y, r.sum[k].z, r.sum[k].w};
        dc_norm_add_lane<DT>(hw, hw, sw);
        dc_norm_st_lane<DT>((dc_u8*)p.h + off, hw);
        dc_norm_widen_lane<DT>(hf[k], hw);
    }
    if (DC_TID < DC_NORM_THREADS) {
        float q = 0.0f;
#pragma unroll
        for (int k = 0; k < NV; ++k) q = dc_norm_squares_lane(q, hf[k]);
        s_first[lane] = q;
    }
    DC_SYNC_BLOCK();
    if (DC_TID >= DC_NORM_THREADS) {
        float q = s_first[lane];
#pragma unroll
        for (int k = 0; k < NV; ++k) q = dc_norm_squares_lane(q, hf[k]);
        s_part[lane] = q;
    }
    DC_SYNC_BLOCK();
    const float inv = dc_norm_inv(p, dc_norm_tree_warp(s_part));
#pragma unroll
    for (int k = 0; k < NV; ++k) {
        const dc_u64 off = row + 16u * (dc_u64)dc_row_vector<NV>(k);
        const dc_u32 ww[4] = {r.weight[k].x, r.weight[k].y, r.weight[k].z, r.weight[k].w};
        dc_u32 yw[4];
        dc_norm_scale_lane<DT>(yw, hf[k], ww, inv);
        dc_norm_st_lane<DT>((dc_u8*)p.y + off, yw);
    }
}
#endif

template <int NV>
DC_DEV void dc_norm_row_in_regs_any(const DcNormParams& p, const DcNormRowRegs<NV>& r, dc_u64 row) {
#if defined(DC_CUDA)
    if (p.dtype == DC_F16) dc_norm_row_in_regs<DC_F16, NV>(p, r, row);
    else dc_norm_row_in_regs<DC_BF16, NV>(p, r, row);
#else
    (void)p;
    (void)r;
    (void)row;
    DC_UNSUPPORTED_WORLD();
#endif
}

// ---------------------------------------------------------------------------------------------
// The row loop (CUDA; a fused one-shot launch in f16/bf16 with more rows than its blocks take
// one at a time). A row a tile (hidden 4096): block b staged and reduces tiles b, b + grid, ...
// of the sum, which are rows b, b + grid, ... (dc_norm_local_group is 1). (Rows of two tiles,
// hidden 8192, do not loop: a loop of them, block b < grid / 2 taking rows b, b + grid / 2, ...,
// measured 6-29 % slower than the epilogue or the norm's own launch at world 2, 64-128 rows, on
// one H100; benches/results/h100-2026-12-05-row-loop.md. So did a loop on every block, rows b,
// b + grid, ... waiting for the blocks that staged them: at 2-8 rows a block 3-23 % slower than
// the one-shot all_reduce then the norm's own launch at worlds 2/4/8 on one H100;
// benches/results/h100-2026-12-06-two-tile-rows.md.)
// Instead of the epilogue's second pass over the rows
// (re-reading the sum, the residual and the weight after the block's barrier) or the norm's
// own launch, the block takes its rows one after the other in the row form in registers: each
// thread reduces its vectors of the row and keeps them (dc_reduce_row_kept), and the row is
// normalised right away from registers (dc_norm_row_in_regs, the same lanes, order and tree, so
// the same bits). The weight loads once (before the protocol's wait, with the block's first
// row's residual: dc_norm_row_regs_load); the next row's residual loads while this row's norm
// runs. Consecutive rows reuse the form's shared partials
// safely: a row's writes of s_first follow the previous row's second barrier, after which no
// thread reads s_first of that row; its writes of s_part follow its own first barrier, which
// every warp reaches only after its tree of the previous row read s_part.
// ---------------------------------------------------------------------------------------------

// Whether a fused launch takes the row loop: the conditions of the row form in registers on the
// one-shot pull route with a row a tile (dc_norm_row_regs_ok), except that the rows outnumber
// the launch's blocks. Every thread asks it at the entry, from parameter space (the body is an
// instantiation of its own, dc_collective_mode's LOOP).
DC_DEV dc_u32 dc_norm_local_group(const DcHeader& h, const DcSeg* seg, const DcNormParams& p);
DC_DEV bool dc_norm_row_loop(const DcHeader& h, const DcSeg* seg, const DcNormParams& p) {
#if defined(DC_CUDA)
    if (h.mode != DC_MODE_PULL || (p.dtype != DC_F16 && p.dtype != DC_BF16) || h.tile_bytes != 16u * DC_NTID ||
        !dc_norm_vector_ok(p))
        return false;
    return (dc_u64)p.hidden * 2u == h.tile_bytes && 2u * DC_NORM_CHUNK == p.hidden && p.rows > h.grid &&
           dc_norm_local_group(h, seg, p) == 1u;
#else
    (void)h;
    (void)seg;
    (void)p;
    return false;
#endif
}

template <int W, int NV>
DC_DEV void dc_norm_rows_kept(const DcHeader& h, const DcSeg& s, dc_u64 frame, const DcNormPlan& plan,
                              DcNormRowRegs<NV>& regs) {
    static_assert(NV == 1, "the row loop takes rows of one tile");
#if defined(DC_CUDA)
    const DcNormParams& p = plan.n;
    const dc_u64 row_bytes = (dc_u64)p.hidden * 2u;
    const dc_u64 step = h.grid;
    for (dc_u64 r = DC_BID; r < p.rows; r += step) {
        dc_reduce_row_kept_any<W, NV>(h, s, frame, regs.sum, plan.sum_is_y == 0u, r);
        const dc_u64 next = r + step;
        dc_u32x4 residual_next[NV];
#pragma unroll
        for (int k = 0; k < NV; ++k) {
            residual_next[k] = regs.residual[k];
            if (next < p.rows)
                residual_next[k] = dc_norm_ld16((const dc_u8*)p.residual + next * row_bytes + 16u * (dc_u64)dc_row_vector<NV>(k));
        }
        dc_norm_row_in_regs_any<NV>(p, regs, r);
#pragma unroll
        for (int k = 0; k < NV; ++k) regs.residual[k] = residual_next[k];
    }
#else
    (void)h;
    (void)s;
    (void)frame;
    (void)plan;
    (void)regs;
    DC_UNSUPPORTED_WORLD();
#endif
}

// ---------------------------------------------------------------------------------------------
// The bulk rows form (CUDA; a fused launch on the bulk push route in f16/bf16 with rows of one
// tile, hidden 4096 in the 8 KiB tile or hidden 8192 in the 16 KiB tile the host sets for such
// calls, whose segments are whole rows: large batches at world 2). The plain bulk
// push all_reduce writes its shard's sums into the output and into every peer's frame, and
// copies the peers' reduced shards into the output after phase 2; the norm then re-reads the
// whole output (its own launch) or the gathered sums (the gathered-sum form, one launch after a
// barrier of the launch's blocks). Here instead each block takes its tiles of the own shard one
// row after the other: its threads reduce their vectors of the row (one, or two in the 16 KiB
// tile, at the row form in registers' lanes, dc_row_vector; the plain reduce's tree over
// the own input and the senders' slots, in rank order), write the sum into every peer's
// reduced-shard slot as the plain reduce does, keep it, and normalise the row at once from
// registers (dc_norm_row_in_regs: h and y stored; the sum stored too unless y is its buffer);
// after phase 2, the block's tiles of each peer's reduced shard are normalised the same way from
// the own frame, where the skipped copies would have read them. Per rank that saves the sum's
// store and re-read of the own shard and the copies of the peers' shards: at world 2, 7n bytes
// of traffic become 6n (n the call's bytes). Tiles are the plain call's (tile t of a segment is
// block t % grid's, a tile a row), so every block stages, writes back, signals and waits for
// exactly the plain call's tiles and flags: a peer in another form (its own alignment decides)
// pairs with it. (That holds in the 16 KiB tile too: the plain call's paths walk tiles of any
// size, dc_for_tiles, and which thread of a block moves which bytes of its tile is the block's
// own business, its flags released after a barrier of the block.) No barrier of the launch:
// every block waits for every peer in both phases. The arithmetic is the row form's (the same
// lanes, order and tree), so the bits are the same.
// ---------------------------------------------------------------------------------------------

// The shape both row forms in the protocol share (the bulk rows form below, the RS+AG rows form
// further on), and the vectors a thread holds of each row in it (1 or 2; 0: neither form):
// f16/bf16 rows that are exactly a protocol tile — hidden 4096 in the 8 KiB tile every call
// has (one 16-byte vector per thread, NV = 1), or hidden 8192 in the 16 KiB tile the host sets
// only for such fused calls (a "wide tile", two vectors per thread, NV = 2: a row of two tiles
// would have its halves staged and flagged by two blocks, and a block would wait for both, as
// the one-shot two-tile form does; with a tile a row each block's own flags cover its rows), or
// two rows of 4096 in that 16 KiB tile (a "pair": two vectors a thread, half the block a row,
// dc_norm_row_pair_in_regs; the host takes it for batches whose shards are whole pairs) —
// on the norm's vector path, a launch of exactly the protocol's blocks, one reduce segment and
// a phase 2 whose segments the norm reads in place (DC_SEG_NORM_READ), and every reduce and
// phase-2 segment whole tiles of the sum that together are all of it (the launch's rows); with
// `frame_rows`, each also starting a tile into the frames (the pull route counts tiles from the
// frame's start, so a tile is then whole rows); without, the input 16-byte aligned.
DC_DEV dc_u32 dc_norm_protocol_rows(const DcHeader& h, const DcSeg* seg, const DcNormParams& p, bool frame_rows) {
#if defined(DC_CUDA)
    if ((p.dtype != DC_F16 && p.dtype != DC_BF16) || DC_NBLOCKS != h.grid || h.nphase1 != 1u ||
        (seg[h.nstage].flags & DC_SEG_GATHER) != 0u || !dc_norm_reads_gathered(h, seg) || !dc_norm_vector_ok(p))
        return 0u;
    // The tile is a row of 4096 in 8 KiB (one vector a thread of the block's 512), or 16 KiB
    // (two vectors a thread): a row of 8192, or a pair of rows of 4096 (dc_norm_row_pair_in_regs).
    dc_u32 nv;
    if (h.tile_bytes == 16u * DC_NTID && 2u * DC_NORM_CHUNK == p.hidden) nv = 1u;
    else if (h.tile_bytes == 32u * DC_NTID && (4u * DC_NORM_CHUNK == p.hidden || 2u * DC_NORM_CHUNK == p.hidden)) nv = 2u;
    else return 0u;
    // Bulk push reads the own leaf from the caller's input with 16-byte loads (the pull route
    // reads it from the frame, staged by the plain copy): an input view off 16 bytes (an
    // element offset) takes the gathered-sum form, whose reduce takes any alignment.
    if (!frame_rows && (seg[h.nstage].src & 15u) != 0u) return 0u;
    // The tile (8 or 16 KiB, a power of two) is whole rows: the masks test whole tiles (with
    // pairs, an odd batch's last row is no whole tile, and the segments then do not cover it).
    const dc_u64 tile = h.tile_bytes;
    const dc_u64 end = p.rows * (dc_u64)p.hidden * 2u;
    dc_u64 covered = 0;
    for (dc_u32 i = h.nstage; i < h.nstage + 1u + h.nphase2; ++i) {
        const DcSeg& s = seg[i];
        if (s.ptr < p.sum || ((s.ptr - p.sum) & (tile - 1u)) != 0u || (s.bytes & (tile - 1u)) != 0u ||
            s.ptr - p.sum + s.bytes > end || (frame_rows && (s.frame_off & (tile - 1u)) != 0u))
            return 0u;
        covered += s.bytes;
    }
    return covered == end ? nv : 0u;
#else
    (void)h;
    (void)seg;
    (void)p;
    (void)frame_rows;
    return 0u;
#endif
}

// Whether a fused launch takes the bulk rows form, and with how many vectors a thread (declared
// in detcoll_protocol.h; every thread asks it at the entry, from parameter space; 0: it does
// not): bulk push in the shape dc_norm_protocol_rows (above) tests, its phase-2 segments
// flagged by the host (CollectiveNormParams::new). The host asks the same
// (CollectiveNormParams::shard_rows) to size the grid and to pick the tile; were they ever to
// differ, the launch would only take the gathered-sum form after the launch's barrier.
DC_DEV dc_u32 dc_norm_bulk_rows(const DcHeader& h, const DcSeg* seg, const DcNormParams& p) {
    return h.mode == DC_MODE_PUSH ? dc_norm_protocol_rows(h, seg, p, false) : 0u;
}

#if defined(DC_CUDA)
// Both row forms in the protocol hold NV vectors a thread of each row (a row is the tile,
// NV * 8 KiB), at the lanes the row form in registers normalises: byte dc_row_vector<NV>(k) * 16
// of the row (with one, 16 * t; with two, t < 256 holds chunks 0 and 1 of lane t, 256 + t chunks
// 2 and 3: dc_norm_row_in_regs continues one lane's partial across the two threads). The row's
// index is its byte offset in the sum over the row's bytes, a constant power of two (a shift:
// dc_norm_protocol_rows made h.tile_bytes that), so no 64-bit division.
template <int NV>
DC_DEV void dc_protocol_row_vectors(dc_u64 (&v)[NV]) {
#pragma unroll
    for (int k = 0; k < NV; ++k) v[k] = 16u * (dc_u64)dc_row_vector<NV>((dc_u32)k);
}

// The own shard's rows. Prefetch: with one vector a thread, each row's loads (the W leaves and
// the residual) are issued while the previous row is normalised; with two, a second row's 2W
// leaves in flight beside the current row's would be 4W vectors of registers (128 at world 8:
// every register the 512-thread launch bounds leave a thread), so the next row loads once the
// current one is normalised (its loads are still 2W vectors in flight together).
template <int W, int DT, int NV>
DC_DEV void dc_bulk_reduce_rows_dt(const DcHeader& h, const DcSeg& s, dc_u64 frame, const DcNormPlan& plan,
                                   DcNormRowRegs<NV>& regs) {
    const DcNormParams& p = plan.n;
    const dc_u64 own = h.data[h.rank] + frame;
    constexpr dc_u64 row = (dc_u64)NV * 4u * DC_NORM_CHUNK;  // = h.tile_bytes (dc_norm_protocol_rows)
    dc_u64 v[NV];
    dc_protocol_row_vectors<NV>(v);
    const dc_u64 first = s.ptr - p.sum;  // the segment's first byte in the sum: a row's
    const bool push = (s.flags & DC_SEG_WRITE_BACK) != 0u;
    // Tiles b, b + grid, ... of the segment (dc_for_tiles from 0; whole rows).
    const dc_u64 tile = h.tile_bytes, step = (dc_u64)h.grid * tile;
    dc_u64 lo = (dc_u64)DC_BID * tile;
    if (lo >= s.bytes) return;
    dc_u32x4 x[NV][W], res[NV];
    auto load = [&](dc_u64 at, dc_u32x4 (&xs)[NV][W], dc_u32x4 (&rs)[NV]) {
#pragma unroll
        for (int k = 0; k < NV; ++k) {
            const dc_u64 off = at + v[k];
            rs[k] = dc_norm_ld16((const dc_u8*)p.residual + first + off);
#pragma unroll
            for (int q = 0; q < W; ++q)
                xs[k][q] = (dc_u32)q == h.rank
                               ? *(const dc_u32x4*)(s.src + off)
                               : *(const dc_u32x4*)(own + s.frame_off + (dc_u64)q * h.push_stride + off);
        }
    };
    load(lo, x, res);
    for (; lo < s.bytes; lo += step) {
        const bool more = lo + step < s.bytes;
        dc_u32x4 nx[NV][W], nres[NV];
        if constexpr (NV == 1) {
            if (more) load(lo + step, nx, nres);
        }
#pragma unroll
        for (int k = 0; k < NV; ++k) {
            const dc_u64 off = lo + v[k];
            const dc_u32x4 r = dc_tree_vec<W, DT, false>(x[k]);
            if (push) {
#pragma unroll
                for (int t = 0; t < W; ++t)
                    if ((dc_u32)t != h.rank)
                        *(dc_u32x4*)(h.data[t] + frame + h.push_ag + (dc_u64)h.rank * h.push_stride + off) = r;
            }
            if (plan.sum_is_y == 0u) *(dc_u32x4*)(s.ptr + off) = r;
            regs.sum[k] = r;
            regs.residual[k] = res[k];
        }
        dc_norm_row_in_regs<DT, NV>(p, regs, (first + lo) / row);
        if (more) {
            if constexpr (NV == 1) {
#pragma unroll
                for (int q = 0; q < W; ++q) x[0][q] = nx[0][q];
                res[0] = nres[0];
            } else {
                load(lo + step, x, res);
            }
        }
    }
}

// The peers' reduced shards after phase 2, each row's loads (NV vectors of the sum and of the
// residual: few registers, so with either NV) issued while the previous row is normalised.
template <int DT, int NV>
DC_DEV void dc_bulk_norm_rows_dt(const DcHeader& h, const DcSeg* seg, dc_u64 frame, const DcNormPlan& plan,
                                 DcNormRowRegs<NV>& regs) {
    const DcNormParams& p = plan.n;
    constexpr dc_u64 row = (dc_u64)NV * 4u * DC_NORM_CHUNK;  // = h.tile_bytes
    dc_u64 v[NV];
    dc_protocol_row_vectors<NV>(v);
    const dc_u64 tile = h.tile_bytes, step = (dc_u64)h.grid * tile;
    for (dc_u32 i = 0; i < h.nphase2; ++i) {
        const DcSeg& s = seg[h.nstage + h.nphase1 + i];
        // Where dc_bulk_gather would have copied the segment from.
        const dc_u8* from = s.peer == h.rank ? (const dc_u8*)s.src : (const dc_u8*)(h.data[h.rank] + frame + s.frame_off);
        const dc_u8* residual = (const dc_u8*)p.residual + (s.ptr - p.sum);
        const dc_u64 first = s.ptr - p.sum;
        dc_u64 lo = (dc_u64)DC_BID * tile;
        if (lo >= s.bytes) continue;
        dc_u32x4 sum[NV], res[NV];
#pragma unroll
        for (int k = 0; k < NV; ++k) {
            sum[k] = dc_norm_ld16(from + lo + v[k]);
            res[k] = dc_norm_ld16(residual + lo + v[k]);
        }
        for (; lo < s.bytes; lo += step) {
            const bool more = lo + step < s.bytes;
            dc_u32x4 nsum[NV], nres[NV];
            if (more) {
#pragma unroll
                for (int k = 0; k < NV; ++k) {
                    nsum[k] = dc_norm_ld16(from + lo + step + v[k]);
                    nres[k] = dc_norm_ld16(residual + lo + step + v[k]);
                }
            }
#pragma unroll
            for (int k = 0; k < NV; ++k) {
                regs.sum[k] = sum[k];
                regs.residual[k] = res[k];
            }
            dc_norm_row_in_regs<DT, NV>(p, regs, (first + lo) / row);
            if (more) {
#pragma unroll
                for (int k = 0; k < NV; ++k) {
                    sum[k] = nsum[k];
                    res[k] = nres[k];
                }
            }
        }
    }
}
#endif

template <int W, int NV>
DC_DEV void dc_bulk_reduce_rows(const DcHeader& h, const DcSeg& s, dc_u64 frame, const DcNormPlan& plan,
                                DcNormRowRegs<NV>& regs) {
#if defined(DC_CUDA)
    if (h.dtype == DC_F16) dc_bulk_reduce_rows_dt<W, DC_F16, NV>(h, s, frame, plan, regs);
    else dc_bulk_reduce_rows_dt<W, DC_BF16, NV>(h, s, frame, plan, regs);
#else
    (void)h;
    (void)s;
    (void)frame;
    (void)plan;
    (void)regs;
    DC_UNSUPPORTED_WORLD();
#endif
}

template <int NV>
DC_DEV void dc_bulk_norm_rows(const DcHeader& h, const DcSeg* seg, dc_u64 frame, const DcNormPlan& plan,
                              DcNormRowRegs<NV>& regs) {
#if defined(DC_CUDA)
    if (h.dtype == DC_F16) dc_bulk_norm_rows_dt<DC_F16, NV>(h, seg, frame, plan, regs);
    else dc_bulk_norm_rows_dt<DC_BF16, NV>(h, seg, frame, plan, regs);
#else
    (void)h;
    (void)seg;
    (void)frame;
    (void)plan;
    (void)regs;
    DC_UNSUPPORTED_WORLD();
#endif
}

// ---------------------------------------------------------------------------------------------
// The RS+AG rows form (CUDA; a fused launch on RS+AG, the pull route with a phase 2, in the
// shape of dc_norm_protocol_rows with the segments a row into the frames: large batches at
// worlds 4 and 8). The plain RS+AG all_reduce reduces the own shard into the output and its
// write-back slot of the own frame, then copies the peers' reduced shards out of their frames
// after phase 2, and the gathered-sum form then reads every row again after the launch's
// barrier, a warp per row. Here each block takes its tiles of the own shard (tile t of the
// frame is block t % grid's; a tile is a row: 8 KiB of hidden 4096, or the 16 KiB wide tile of
// hidden 8192) a row at a time: its threads reduce their vectors of the row (one or two,
// dc_row_vector) over every rank's frame (the plain reduce's tree, in rank order), write the
// sums back into the own frame as the plain reduce does, keep them and normalise the row from
// registers (dc_norm_row_in_regs); after phase 2 (the plain call's flags) it normalises its
// tiles of each peer's reduced shard straight from that peer's frame. Each row's loads are
// issued while the previous row is normalised (the reduce's only with one vector a thread, as
// in the bulk rows form). No barrier of the launch: every block waits for every peer in both
// phases. The same arithmetic as every row form, so the same bits.
// ---------------------------------------------------------------------------------------------

// Whether a fused launch takes the RS+AG rows form, and with how many vectors a thread
// (declared in detcoll_protocol.h; asked at the entry like dc_norm_bulk_rows, and by the host:
// CollectiveNormParams::shard_rows).
DC_DEV dc_u32 dc_norm_rsag_rows(const DcHeader& h, const DcSeg* seg, const DcNormParams& p) {
    return h.mode == DC_MODE_PULL && h.nphase2 != 0u ? dc_norm_protocol_rows(h, seg, p, true) : 0u;
}

#if defined(DC_CUDA)
// This block's first tile of a segment at frame offset `frame_off` (a row's: a multiple of the
// tile, NV * 8 KiB = h.tile_bytes, a constant shift), as dc_for_tiles_at walks it: tile t of the
// frame is block t % grid's.
template <int NV>
DC_DEV dc_u64 dc_rsag_first_tile(const DcHeader& h, dc_u64 frame_off) {
    const dc_u64 t0 = frame_off / ((dc_u64)NV * 4u * DC_NORM_CHUNK);
    return t0 + ((dc_u64)DC_BID + h.grid - (dc_u32)(t0 % h.grid)) % h.grid;
}

template <int W, int DT, int NV>
DC_DEV void dc_rsag_reduce_rows_dt(const DcHeader& h, const DcSeg& s, dc_u64 frame, const DcNormPlan& plan,
                                   DcNormRowRegs<NV>& regs) {
    const DcNormParams& p = plan.n;
    constexpr dc_u64 tile = (dc_u64)NV * 4u * DC_NORM_CHUNK;  // = h.tile_bytes (dc_norm_protocol_rows)
    dc_u64 v[NV];
    dc_protocol_row_vectors<NV>(v);
    const dc_u64 end = s.frame_off + s.bytes, step = (dc_u64)h.grid * tile;
    // Frame offset `at` of the segment is output byte s.ptr + (at - s.frame_off), row
    // (s.ptr - p.sum + at - s.frame_off) / tile of the sum.
    const dc_u64 to_sum = s.ptr - p.sum - s.frame_off;
    const bool wb = (s.flags & DC_SEG_WRITE_BACK) != 0u;
    dc_u64 at = dc_rsag_first_tile<NV>(h, s.frame_off) * tile;
    if (at >= end) return;
    dc_u32x4 x[NV][W], res[NV];
    auto load = [&](dc_u64 a, dc_u32x4 (&xs)[NV][W], dc_u32x4 (&rs)[NV]) {
#pragma unroll
        for (int k = 0; k < NV; ++k) {
            rs[k] = dc_norm_ld16((const dc_u8*)p.residual + to_sum + a + v[k]);
#pragma unroll
            for (int q = 0; q < W; ++q) xs[k][q] = *(const dc_u32x4*)(h.data[q] + frame + a + v[k]);
        }
    };
    load(at, x, res);
    for (; at < end; at += step) {
        const bool more = at + step < end;
        dc_u32x4 nx[NV][W], nres[NV];
        if constexpr (NV == 1) {
            if (more) load(at + step, nx, nres);
        }
#pragma unroll
        for (int k = 0; k < NV; ++k) {
            const dc_u32x4 r = dc_tree_vec<W, DT, false>(x[k]);
            if (wb) *(dc_u32x4*)(h.data[h.rank] + frame + at + v[k]) = r;
            if (plan.sum_is_y == 0u) *(dc_u32x4*)(p.sum + to_sum + at + v[k]) = r;
            regs.sum[k] = r;
            regs.residual[k] = res[k];
        }
        dc_norm_row_in_regs<DT, NV>(p, regs, (to_sum + at) / tile);
        if (more) {
            if constexpr (NV == 1) {
#pragma unroll
                for (int q = 0; q < W; ++q) x[0][q] = nx[0][q];
                res[0] = nres[0];
            } else {
                load(at + step, x, res);
            }
        }
    }
}

template <int DT, int NV>
DC_DEV void dc_rsag_norm_rows_dt(const DcHeader& h, const DcSeg* seg, dc_u64 frame, const DcNormPlan& plan,
                                 DcNormRowRegs<NV>& regs) {
    const DcNormParams& p = plan.n;
    constexpr dc_u64 tile = (dc_u64)NV * 4u * DC_NORM_CHUNK;  // = h.tile_bytes
    dc_u64 v[NV];
    dc_protocol_row_vectors<NV>(v);
    const dc_u64 step = (dc_u64)h.grid * tile;
    for (dc_u32 i = 0; i < h.nphase2; ++i) {
        const DcSeg& s = seg[h.nstage + h.nphase1 + i];
        // Where the skipped copy (dc_run_segment's gather) would have read: the peer's frame.
        const dc_u8* from = (const dc_u8*)(h.data[s.peer] + frame);
        const dc_u64 end = s.frame_off + s.bytes, to_sum = s.ptr - p.sum - s.frame_off;
        dc_u64 at = dc_rsag_first_tile<NV>(h, s.frame_off) * tile;
        if (at >= end) continue;
        dc_u32x4 sum[NV], res[NV];
#pragma unroll
        for (int k = 0; k < NV; ++k) {
            sum[k] = dc_norm_ld16(from + at + v[k]);
            res[k] = dc_norm_ld16((const dc_u8*)p.residual + to_sum + at + v[k]);
        }
        for (; at < end; at += step) {
            const bool more = at + step < end;
            dc_u32x4 nsum[NV], nres[NV];
            if (more) {
#pragma unroll
                for (int k = 0; k < NV; ++k) {
                    nsum[k] = dc_norm_ld16(from + at + step + v[k]);
                    nres[k] = dc_norm_ld16((const dc_u8*)p.residual + to_sum + at + step + v[k]);
                }
            }
#pragma unroll
            for (int k = 0; k < NV; ++k) {
                regs.sum[k] = sum[k];
                regs.residual[k] = res[k];
            }
            dc_norm_row_in_regs<DT, NV>(p, regs, (to_sum + at) / tile);
            if (more) {
#pragma unroll
                for (int k = 0; k < NV; ++k) {
                    sum[k] = nsum[k];
                    res[k] = nres[k];
                }
            }
        }
    }
}
#endif

template <int W, int NV>
DC_DEV void dc_rsag_reduce_rows(const DcHeader& h, const DcSeg& s, dc_u64 frame, const DcNormPlan& plan,
                                DcNormRowRegs<NV>& regs) {
#if defined(DC_CUDA)
    if (h.dtype == DC_F16) dc_rsag_reduce_rows_dt<W, DC_F16, NV>(h, s, frame, plan, regs);
    else dc_rsag_reduce_rows_dt<W, DC_BF16, NV>(h, s, frame, plan, regs);
#else
    (void)h;
    (void)s;
    (void)frame;
    (void)plan;
    (void)regs;
    DC_UNSUPPORTED_WORLD();
#endif
}

template <int NV>
DC_DEV void dc_rsag_norm_rows(const DcHeader& h, const DcSeg* seg, dc_u64 frame, const DcNormPlan& plan,
                              DcNormRowRegs<NV>& regs) {
#if defined(DC_CUDA)
    if (h.dtype == DC_F16) dc_rsag_norm_rows_dt<DC_F16, NV>(h, seg, frame, plan, regs);
    else dc_rsag_norm_rows_dt<DC_BF16, NV>(h, seg, frame, plan, regs);
#else
    (void)h;
    (void)seg;
    (void)frame;
    (void)plan;
    (void)regs;
    DC_UNSUPPORTED_WORLD();
#endif
}

// The gathered-sum form's body: the dtype's instantiation (CUDA; on HIP the host never sets
// the flag, and a launch that had it would stop rather than leave the skipped copies' rows
// unwritten).
DC_DEV void dc_norm_gathered_any(const DcHeader& h, const DcSeg* seg, dc_u64 frame, const DcNormParams& p) {
#if defined(DC_CUDA)
    if (DC_NTID % 32u != 0u) DC_UNSUPPORTED_WORLD();
    switch (p.dtype) {
        case DC_F32: dc_norm_rows_gathered<DC_F32>(h, seg, frame, p); break;
        case DC_F16: dc_norm_rows_gathered<DC_F16>(h, seg, frame, p); break;
        case DC_BF16: dc_norm_rows_gathered<DC_BF16>(h, seg, frame, p); break;
        default: DC_UNSUPPORTED_WORLD();
    }
#else
    (void)h;
    (void)seg;
    (void)frame;
    (void)p;
    DC_UNSUPPORTED_WORLD();
#endif
}

// ---------------------------------------------------------------------------------------------
// The fused call: the all_reduce's collective kernel with the norm as its epilogue, one launch
// (DcCollectiveNormParams). Every block of the launch first runs its part of the protocol
// (blocks beyond the protocol's grid have none, see dc_collective_mode), then all meet at a
// grid barrier, after which every row's sum is in `sum` (the all_reduce's output, written by any
// block, or by the earlier chunks' launches on this stream), and the blocks normalise rows
// DC_BID, DC_BID + DC_NBLOCKS, ... exactly as the standalone kernel does.
//
// Without the barrier when the protocol's tiles are whole rows (dc_norm_local_group: a row
// divides the 8 KiB tile, e.g. hidden 4096 in f16/bf16, 2048 in f32, and the launch is the
// call's only one on the LL push or one-shot route): each block then normalises the rows it
// reduced, after a barrier of its own threads only. (A prefetch of the block's residual rows and
// the weight into L2 before the protocol was tried and measured: about 1 us slower per call on
// one H200, where both are in L2 already in a decode loop.)
//
// The barrier needs every block of the launch resident at once, as the protocol already does
// (its blocks wait on their peers' blocks; the host caps the grid). It is one 32-bit word of the
// own status line, in the form of a sense-reversing grid barrier: block 0 adds
// 2^31 - (blocks - 1), every other block 1, so the word's top bit flips exactly when the last
// block arrives and its low bits are back where they were (0: the word starts zeroed, and a
// barrier every block passed leaves them so). The add releases the block's stores (its part of
// the sum, ordered before it by the block's barrier) and acquires the ones of the blocks before
// it; a waiter's load of the flipped bit acquires the rest. The last block to arrive also ends
// the call (dc_call_ended): every block of the launch has started by then, and the launch then
// skips the end of the call's count, which would cost every block a second round trip after its
// rows. A launch runs only after the previous one on its stream ended (DC_GRID_DEP_WAIT), so
// the word is never shared by two calls; a failed call may leave it wrong, but the abort word it
// set stops every later call in its prologue, before it gets here.
//
// A waiter is bounded (the call's timeout) and also stops when the call fails (the abort word,
// polled every 64 reads). After a barrier every block passed, the norm runs even if the
// protocol failed in some block: h and y are then as undefined as the sum, and the call
// reports its error (checking the abort word there cost a round trip per block and call).
// ---------------------------------------------------------------------------------------------

#define DC_ST_NORM_BARRIER 4              // the fused launches' barrier (u32 in this word)
#define DC_NORM_BARRIER_FLIP 0x80000000u  // its sense bit

struct DcCollectiveNormParams {
    DcParams<DC_SEGS_SINGLE> c;
    DcNormParams n;
};

// The barrier of every block of a fused launch of more than one block: whether this block's
// wait ended with the last arrival (false: it timed out or the call failed; the norm is then
// skipped). Ends call g on the last arrival, with the prologue's `refresh_left` (thread 0's).
DC_DEV bool dc_norm_barrier(const DcHeader& h, dc_u64* status, dc_u32 g, dc_u64 refresh_left) {
    DC_SHARED int s_ok;
    DC_SYNC_BLOCK();
    if (DC_TID == 0) {
        int ok = 1;
        dc_u32* word = (dc_u32*)&status[DC_ST_NORM_BARRIER];
        const dc_u32 add = DC_BID == 0u ? DC_NORM_BARRIER_FLIP - (DC_NBLOCKS - 1u) : 1u;
        const dc_u32 before = dc_atom_add_acq_rel_dev(word, add);
        if (((before ^ (before + add)) & DC_NORM_BARRIER_FLIP) != 0u) {
            dc_call_ended(status, g, refresh_left);
        } else {
            const dc_u64 start = dc_globaltimer();
            for (dc_u32 iter = 1; ((dc_ld_acquire_dev(word) ^ before) & DC_NORM_BARRIER_FLIP) == 0u; ++iter) {
                if ((iter & 63u) != 0) continue;
                if (dc_ld_relaxed_sys(&status[DC_ST_ABORT]) != 0) {
                    ok = 0;
                    break;
                }
                if (dc_globaltimer() - start > h.timeout_ns) {
                    dc_fail(h, status, DC_ERR_TIMEOUT_PHASE2, h.rank, g, 0);
                    ok = 0;
                    break;
                }
            }
        }
        s_ok = ok;
    }
    DC_SYNC_BLOCK();
    return s_ok != 0;
}

// The rows per protocol tile when every block of this fused launch writes whole rows of the sum
// and nothing else writes it (dc_norm_whole_sum) and a row divides the tile, 0 otherwise. Then
// block b reduced rows k * group .. of units k = b, b + grid, ...: the rows dc_norm_for_rows
// gives it. The host makes the same decision for the grid (CollectiveNormParams::local_group);
// if they ever differed, the launch would only fall back to the barrier.
DC_DEV dc_u32 dc_norm_local_group(const DcHeader& h, const DcSeg* seg, const DcNormParams& p) {
    if (!dc_norm_whole_sum(h, seg, p)) return 0u;
    const dc_u64 row = (dc_u64)p.hidden * (p.dtype == DC_F32 ? 4u : 2u);
    if (row > h.tile_bytes) return 0u;
    // 32-bit division (row <= tile_bytes): a 64-bit one is a long software routine.
    const dc_u32 row32 = (dc_u32)row;
    return h.tile_bytes % row32 == 0u ? h.tile_bytes / row32 : 0u;
}

// The plan of a fused launch (declared in detcoll_protocol.h; dc_collective makes it before the
// protocol): the parameters, and which form the epilogue takes.
DC_DEV void dc_norm_prepare(const DcHeader& h, const DcSeg* seg, const DcNormParams& p, DcNormPlan& plan) {
    plan.n = p;
    plan.gathered = dc_norm_reads_gathered(h, seg) ? 1u : 0u;
    plan.group = plan.gathered ? 0u : dc_norm_local_group(h, seg, p);
    plan.row_in_regs = dc_norm_row_regs_ok(h, p, plan.group) ? 1u : 0u;
    plan.sum_is_y = p.sum == p.y ? 1u : 0u;
}

// The epilogue dc_collective_mode runs after the protocol in every block of a fused launch
// (declared in detcoll_protocol.h), from the plan in shared memory; not for the row form in
// registers, which the protocol body runs itself (dc_norm_row_in_regs_any). Returns whether the
// launch's barrier ended the call: in every block of a launch of more than one block that is
// not `local`.
DC_DEV_NOINLINE bool dc_norm_epilogue(const DcHeader& h, const DcSeg* seg, dc_u64* status, dc_u32 g,
                                      dc_u64 refresh_left, const DcNormPlan& plan) {
    const bool local = !plan.gathered && plan.group != 0u;
    const bool launch_barrier = !local && DC_NBLOCKS > 1u;
    // Without the launch's barrier (a block normalises only rows it reduced itself, or the
    // launch is one block), one of the block: its rows are normalised even after a failed
    // protocol step, from an output the failed call left undefined anyway; the call reports its
    // error all the same. With it, every block's phase-2 wait (each covers its own tiles) and
    // its stores of the sum are behind the barrier: then any row may read any tile.
    bool ok = true;
    if (launch_barrier) ok = dc_norm_barrier(h, status, g, refresh_left);
    else DC_SYNC_BLOCK();
    if (ok) {
        if (plan.gathered) dc_norm_gathered_any(h, seg, h.frame[g & 1u], plan.n);
        else dc_norm_any<true>(plan.n, plan.group);
    }
    return launch_barrier;
}

// The fused entry's body: the collective of the call's last launch, the norm as its epilogue.
DC_DEV void dc_collective_norm(const DcCollectiveNormParams& p) { dc_collective(p.c.h, p.c.seg, &p.n); }

#endif  // DETCOLL_NORM_H
