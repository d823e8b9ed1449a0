// detcoll_tree.h — the fixed balanced rank tree and its building blocks, for CUDA and HIP.
//
// Every reduced element is evaluated as
//
//     ((r0 + r1) + (r2 + r3)) + ((r4 + r5) + (r6 + r7))      (prefixes for 1, 2, 4 ranks)
//
// with every add in the element's own dtype, rounded to nearest even, no flush to zero, no
// fused operation. Vector forms (f16x2/bf16x2 packed adds, 16-byte loads) only change how many
// elements one instruction carries: each lane of a packed add is the same scalar add.
//
// Why the adds are written in inline PTX on NVIDIA: `add.rn.f32`, `add.rn.f16x2`,
// `add.rn.bf16x2` carry their rounding mode explicitly, which forbids ptxas from contracting
// them into an FMA, and carry no `.ftz`, so subnormals are kept whatever flags (`--ftz=true`,
// `--use_fast_math`) the file is compiled with. The NVRTC flags (`--ftz=false --fmad=false
// --prec-div=true`) are a second line of defence. On sm_80..sm_89 there is no bf16 add
// instruction; `fma.rn.bf16x2 d, a, 1.0, c` is exactly the add (a * 1.0 is exact, so the one
// rounding is of a + c, signed zeros included) and bf16 FMA keeps subnormals.
//
// On AMD (gfx9: gfx90a, gfx942, gfx950) the hardware path is the packed instructions the
// compiler selects from clang vector types: f16x2 `v_pk_add_f16` (IEEE, round to nearest even
// from the MODE register's default, f16 denormals kept: `.amdhsa_float_denorm_mode_16_64 3`,
// which the compile test asserts); bf16x2 widens both lanes to f32 (exact), adds them with one
// `v_pk_add_f32` (RNE, f32 denormals kept: mode 3) and rounds once to bf16 — with
// `v_cvt_pk_bf16_f32` (RNE) on gfx950, with the software rounding below on parts without it.
// f32 + rounding once is the exact bf16 add (double rounding is innocuous: 24 >= 2 * 8 + 2).
//
// The software path (NVIDIA parts older than the instructions above, and every `SOFT = true`
// template) widens f16/bf16 to f32, adds once in f32 and rounds once to the dtype, which is the
// exact dtype add (see crates/fixed-tree/src/element.rs for the proof). Both platforms build a
// software-arithmetic tree kernel (`detcoll_tree_soft`), so the GPU tests check the hardware
// and the software paths against each other and against `fixed-tree` on either vendor.
//
// This header has no includes: NVRTC compiles it without a toolkit on disk.
#ifndef DETCOLL_TREE_H
#define DETCOLL_TREE_H

#if defined(__HIP_PLATFORM_AMD__) || defined(__HIPCC__)
#define DC_HIP 1
#else
#define DC_CUDA 1
#endif

#define DC_DEV __device__ __forceinline__

#if defined(DC_HIP)
// Clang vector types: arithmetic on them selects the packed gfx9 instructions.
typedef _Float16 dc_hip_f16x2 __attribute__((ext_vector_type(2)));
typedef float dc_hip_f32x2 __attribute__((ext_vector_type(2)));
#if defined(__gfx950__)
typedef __bf16 dc_hip_bf16x2 __attribute__((ext_vector_type(2)));
#endif
#endif

typedef unsigned long long dc_u64;
typedef unsigned int dc_u32;
typedef unsigned short dc_u16;
typedef unsigned char dc_u8;

// Sixteen bytes as four 32-bit words, 16-byte aligned: what the vector loads and stores move (4
// f32 or 8 f16/bf16 lanes). Our own type instead of CUDA's / HIP's `uint4`: the HIP entry is
// built both without HIP headers (offline, where it would have to define `uint4` itself) and by
// hiprtc (whose pre-included headers define `uint4` as HIP_vector_type), and one name of our
// own is the same plain struct in every build (CUDA, offline HIP, hiprtc).
struct __attribute__((aligned(16))) dc_u32x4 {
    dc_u32 x, y, z, w;
};

// dtype codes: the same numbers as collective_core::DType.
#define DC_F32 0
#define DC_F16 1
#define DC_BF16 2

// ---------------------------------------------------------------------------------------------
// Bit casts and the software arithmetic (exact by the fixed-tree argument).
// ---------------------------------------------------------------------------------------------

DC_DEV float dc_as_f32(dc_u32 u) { return __uint_as_float(u); }
DC_DEV dc_u32 dc_as_u32(float f) { return __float_as_uint(f); }

// One f32 add, round to nearest even, never flushing subnormals.
DC_DEV dc_u32 dc_add_f32_bits(dc_u32 a, dc_u32 b) {
#if defined(DC_CUDA)
    float r;
    asm("add.rn.f32 %0, %1, %2;" : "=f"(r) : "f"(dc_as_f32(a)), "f"(dc_as_f32(b)));
    return dc_as_u32(r);
#else
    // HIP: plain IEEE add; the HIP build must be compiled without -ffast-math/denormal flushing
    // (-fno-fast-math -fgpu-flush-denormals-to-zero=false), which the HIP entry file asserts.
    return dc_as_u32(__fadd_rn(dc_as_f32(a), dc_as_f32(b)));
#endif
}

DC_DEV float dc_bf16_to_f32(dc_u16 h) { return dc_as_f32((dc_u32)h << 16); }

// f32 -> bf16, round to nearest even; NaN stays NaN (payload not part of the contract).
DC_DEV dc_u16 dc_f32_to_bf16(float f) {
    dc_u32 u = dc_as_u32(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (dc_u16)((u >> 16) | 0x40u);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (dc_u16)(u >> 16);
}

DC_DEV float dc_f16_to_f32(dc_u16 h) {
    dc_u32 sign = (dc_u32)(h & 0x8000u) << 16;
    dc_u32 exp = (h >> 10) & 0x1fu;
    dc_u32 man = h & 0x3ffu;
    if (exp == 0x1fu) return dc_as_f32(sign | 0x7f800000u | (man << 13));
    if (exp == 0) {
        // Subnormal (or zero): man * 2^-24, exact in f32.
        float v = (float)man * 5.9604644775390625e-8f;
        return dc_as_f32(dc_as_u32(v) | sign);
    }
    return dc_as_f32(sign | ((exp + 112u) << 23) | (man << 13));
}

// f32 -> f16, round to nearest even, overflow to inf, subnormals exact.
DC_DEV dc_u16 dc_f32_to_f16(float f) {
    dc_u32 u = dc_as_u32(f);
    dc_u32 sign = (u >> 16) & 0x8000u;
    dc_u32 a = u & 0x7fffffffu;
    if (a > 0x7f800000u) return (dc_u16)(sign | 0x7e00u);
    if (a >= 0x477ff000u) return (dc_u16)(sign | 0x7c00u);  // >= 65520: rounds to inf
    if (a >= 0x38800000u) {                                   // normal f16 result
        dc_u32 odd = (a >> 13) & 1u;
        a -= 112u << 23;
        a += 0xfffu + odd;
        return (dc_u16)(sign | (a >> 13));
    }
    // |f| < 2^-14: f16 subnormal or zero. Adding 0.5 puts |f| where the f32 ulp is 2^-24, the
    // f16 subnormal spacing, so one RNE f32 add rounds it exactly as f16 would.
    dc_u32 r = dc_add_f32_bits(a, 0x3f000000u) - 0x3f000000u;
    return (dc_u16)(sign | r);
}

DC_DEV dc_u16 dc_soft_add_f16(dc_u16 a, dc_u16 b) {
    return dc_f32_to_f16(dc_as_f32(dc_add_f32_bits(dc_as_u32(dc_f16_to_f32(a)), dc_as_u32(dc_f16_to_f32(b)))));
}

DC_DEV dc_u16 dc_soft_add_bf16(dc_u16 a, dc_u16 b) {
    return dc_f32_to_bf16(dc_as_f32(dc_add_f32_bits(dc_as_u32(dc_bf16_to_f32(a)), dc_as_u32(dc_bf16_to_f32(b)))));
}

#if defined(DC_HIP)
// Two bf16 lanes (low half = lane 0): widened exactly, one packed f32 add, rounded once.
DC_DEV dc_u32 dc_hip_add_bf16x2(dc_u32 a, dc_u32 b) {
    dc_hip_f32x2 x = {dc_as_f32(a << 16), dc_as_f32(a & 0xffff0000u)};
    dc_hip_f32x2 y = {dc_as_f32(b << 16), dc_as_f32(b & 0xffff0000u)};
    dc_hip_f32x2 sum = x + y;
#if defined(__gfx950__)
    return __builtin_bit_cast(dc_u32, __builtin_convertvector(sum, dc_hip_bf16x2));
#else
    return (dc_u32)dc_f32_to_bf16(sum.x) | ((dc_u32)dc_f32_to_bf16(sum.y) << 16);
#endif
}
#endif

// ---------------------------------------------------------------------------------------------
// Scalar and packed adds per dtype. SOFT = true forces the software path.
// ---------------------------------------------------------------------------------------------

template <bool SOFT>
DC_DEV dc_u16 dc_add_f16(dc_u16 a, dc_u16 b) {
#if defined(DC_CUDA) && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 530
    if (!SOFT) {
        dc_u16 r;
        asm("add.rn.f16 %0, %1, %2;" : "=h"(r) : "h"(a), "h"(b));
        return r;
    }
#elif defined(DC_HIP)
    if (!SOFT) return __builtin_bit_cast(dc_u16, (_Float16)(__builtin_bit_cast(_Float16, a) + __builtin_bit_cast(_Float16, b)));
#endif
    return dc_soft_add_f16(a, b);
}

template <bool SOFT>
DC_DEV dc_u32 dc_add_f16x2(dc_u32 a, dc_u32 b) {
#if defined(DC_CUDA) && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 530
    if (!SOFT) {
        dc_u32 r;
        asm("add.rn.f16x2 %0, %1, %2;" : "=r"(r) : "r"(a), "r"(b));
        return r;
    }
#elif defined(DC_HIP)
    if (!SOFT) return __builtin_bit_cast(dc_u32, __builtin_bit_cast(dc_hip_f16x2, a) + __builtin_bit_cast(dc_hip_f16x2, b));
#endif
    return (dc_u32)dc_soft_add_f16((dc_u16)a, (dc_u16)b) |
           ((dc_u32)dc_soft_add_f16((dc_u16)(a >> 16), (dc_u16)(b >> 16)) << 16);
}

template <bool SOFT>
DC_DEV dc_u16 dc_add_bf16(dc_u16 a, dc_u16 b) {
#if defined(DC_CUDA) && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    if (!SOFT) {
        dc_u16 r;
        asm("add.rn.bf16 %0, %1, %2;" : "=h"(r) : "h"(a), "h"(b));
        return r;
    }
#elif defined(DC_CUDA) && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    if (!SOFT) {
        dc_u16 r;
        asm("{ .reg .b16 one; mov.b16 one, 0x3F80; fma.rn.bf16 %0, %1, one, %2; }" : "=h"(r) : "h"(a), "h"(b));
        return r;
    }
#elif defined(DC_HIP)
    if (!SOFT) return (dc_u16)dc_hip_add_bf16x2((dc_u32)a, (dc_u32)b);
#endif
    return dc_soft_add_bf16(a, b);
}

template <bool SOFT>
DC_DEV dc_u32 dc_add_bf16x2(dc_u32 a, dc_u32 b) {
#if defined(DC_CUDA) && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    if (!SOFT) {
        dc_u32 r;
        asm("add.rn.bf16x2 %0, %1, %2;" : "=r"(r) : "r"(a), "r"(b));
        return r;
    }
#elif defined(DC_CUDA) && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    if (!SOFT) {
        dc_u32 r;
        asm("{ .reg .b32 one; mov.b32 one, 0x3F803F80; fma.rn.bf16x2 %0, %1, one, %2; }" : "=r"(r) : "r"(a), "r"(b));
        return r;
    }
#elif defined(DC_HIP)
    if (!SOFT) return dc_hip_add_bf16x2(a, b);
#endif
    return (dc_u32)dc_soft_add_bf16((dc_u16)a, (dc_u16)b) |
           ((dc_u32)dc_soft_add_bf16((dc_u16)(a >> 16), (dc_u16)(b >> 16)) << 16);
}

// One 32-bit word of packed elements: 1 f32, or 2 f16/bf16.
template <int DT, bool SOFT>
DC_DEV dc_u32 dc_add_word(dc_u32 a, dc_u32 b) {
    if (DT == DC_F32) return dc_add_f32_bits(a, b);
    if (DT == DC_F16) return dc_add_f16x2<SOFT>(a, b);
    return dc_add_bf16x2<SOFT>(a, b);
}

// Sixteen bytes: 4 f32 or 8 f16/bf16, lane by lane.
template <int DT, bool SOFT>
DC_DEV dc_u32x4 dc_add_vec(dc_u32x4 a, dc_u32x4 b) {
    dc_u32x4 r;
    r.x = dc_add_word<DT, SOFT>(a.x, b.x);
    r.y = dc_add_word<DT, SOFT>(a.y, b.y);
    r.z = dc_add_word<DT, SOFT>(a.z, b.z);
    r.w = dc_add_word<DT, SOFT>(a.w, b.w);
    return r;
}

// ---------------------------------------------------------------------------------------------
// The tree. `v[0..W)` are the leaves in rank order; W is 1 to 8. Level s adds v[i] and
// v[i + s] for i = 0, 2s, 4s, ... while i + s < W: (0,1)(2,3)(4,5)(6,7), then (0,2)(4,6), then
// (0,4) — exactly ((r0+r1)+(r2+r3))+((r4+r5)+(r6+r7)) for 8. For any W this is the canonical
// tree (docs/contract.md): the last level adds v[0] (the balanced tree of the first m ranks, m
// the largest power of two below W) and v[m] (the tree of the rest, built the same way), e.g.
// ((r0+r1)+(r2+r3))+(r4+r5) for 6 and ((r0+r1)+(r2+r3))+((r4+r5)+r6) for 7.
// ---------------------------------------------------------------------------------------------

template <int W, int DT, bool SOFT>
DC_DEV dc_u32x4 dc_tree_vec(dc_u32x4 (&v)[W]) {
#pragma unroll
    for (int s = 1; s < W; s *= 2) {
#pragma unroll
        for (int i = 0; i + s < W; i += 2 * s) v[i] = dc_add_vec<DT, SOFT>(v[i], v[i + s]);
    }
    return v[0];
}

// Scalar element, as bits (f32 in 32 bits, f16/bf16 in the low 16).
template <int DT, bool SOFT>
DC_DEV dc_u32 dc_add_scalar(dc_u32 a, dc_u32 b) {
    if (DT == DC_F32) return dc_add_f32_bits(a, b);
    if (DT == DC_F16) return dc_add_f16<SOFT>((dc_u16)a, (dc_u16)b);
    return dc_add_bf16<SOFT>((dc_u16)a, (dc_u16)b);
}

template <int W, int DT, bool SOFT>
DC_DEV dc_u32 dc_tree_scalar(dc_u32 (&v)[W]) {
#pragma unroll
    for (int s = 1; s < W; s *= 2) {
#pragma unroll
        for (int i = 0; i + s < W; i += 2 * s) v[i] = dc_add_scalar<DT, SOFT>(v[i], v[i + s]);
    }
    return v[0];
}

template <int DT>
DC_DEV dc_u32 dc_load_elem(const dc_u8* p) {
    if (DT == DC_F32) return *(const dc_u32*)p;
    return *(const dc_u16*)p;
}

template <int DT>
DC_DEV void dc_store_elem(dc_u8* p, dc_u32 v) {
    if (DT == DC_F32) *(dc_u32*)p = v;
    else *(dc_u16*)p = (dc_u16)v;
}

// ---------------------------------------------------------------------------------------------
// Range kernels, executed by `nthreads` cooperating threads (thread `tid`). Pointers are byte
// addresses. The 16-byte path is taken only when every pointer sits at the same offset mod 16;
// the head before the first aligned vector and the tail after the last use scalar code, so an
// unaligned view gives the same bits, only slower.
//
// A range of exactly one aligned vector per thread (16 * nthreads bytes, every pointer 16-byte
// aligned) — a whole protocol tile, 8 KiB for 512 threads, the unit every route's blocks work
// in — takes a short path first: one vector per thread, the same loads, tree and stores as the
// vector body, without the general setup (alignment classes, head and tail loops, 64-bit
// strides) per tile. On one H200 that setup had cost the pull and bulk push routes 5-27 % of an
// all_reduce from 64 KiB up (benches/results/h200-2026-12-04-whole-tile-path.md).
// ---------------------------------------------------------------------------------------------

// Whether a range is one aligned 16-byte vector per thread (see above).
DC_DEV bool dc_whole_vectors(dc_u64 bytes, dc_u32 nthreads, dc_u64 any_address_bits) {
    return bytes == 16u * (dc_u64)nthreads && (any_address_bits & 15u) == 0u;
}

// The tree over W sources of the 16-byte vector at byte offset `off`, stored into dst (and wb
// when given): dc_reduce_range's vector body and its whole-tile path.
template <int W, int DT, bool SOFT>
DC_DEV void dc_reduce_vector(const dc_u8* const (&src)[W], dc_u8* dst, dc_u8* wb, dc_u64 off) {
    dc_u32x4 v[W];
#pragma unroll
    for (int i = 0; i < W; ++i) v[i] = *(const dc_u32x4*)(src[i] + off);
    const dc_u32x4 r = dc_tree_vec<W, DT, SOFT>(v);
    *(dc_u32x4*)(dst + off) = r;
    if (wb) *(dc_u32x4*)(wb + off) = r;
}

// Tree over W sources into dst (and optionally also into wb): `bytes` bytes of dtype DT.
template <int W, int DT, bool SOFT>
DC_DEV void dc_reduce_range(const dc_u8* const (&src)[W], dc_u8* dst, dc_u8* wb, dc_u64 bytes,
                            dc_u32 tid, dc_u32 nthreads) {
    dc_u64 any = (dc_u64)dst | (dc_u64)wb;
#pragma unroll
    for (int i = 0; i < W; ++i) any |= (dc_u64)src[i];
    if (dc_whole_vectors(bytes, nthreads, any)) {
        dc_reduce_vector<W, DT, SOFT>(src, dst, wb, 16u * (dc_u64)tid);
        return;
    }
    const dc_u32 esz = DT == DC_F32 ? 4u : 2u;
    dc_u64 mis = (dc_u64)src[0] & 15u;
    bool vec = (((dc_u64)dst & 15u) == mis) && (wb == 0 || (((dc_u64)wb & 15u) == mis));
#pragma unroll
    for (int i = 1; i < W; ++i) vec = vec && (((dc_u64)src[i] & 15u) == mis);
    dc_u64 head = vec ? ((16u - mis) & 15u) : bytes;
    if (head > bytes) head = bytes;
    dc_u64 nvec = vec ? (bytes - head) / 16u : 0;
    dc_u64 tail_start = head + nvec * 16u;
    // Scalar head.
    for (dc_u64 off = (dc_u64)tid * esz; off < head; off += (dc_u64)nthreads * esz) {
        dc_u32 v[W];
#pragma unroll
        for (int i = 0; i < W; ++i) v[i] = dc_load_elem<DT>(src[i] + off);
        dc_u32 r = dc_tree_scalar<W, DT, SOFT>(v);
        dc_store_elem<DT>(dst + off, r);
        if (wb) dc_store_elem<DT>(wb + off, r);
    }
    // Vector body.
    for (dc_u64 k = tid; k < nvec; k += nthreads) dc_reduce_vector<W, DT, SOFT>(src, dst, wb, head + k * 16u);
    // Scalar tail.
    for (dc_u64 off = tail_start + (dc_u64)tid * esz; off < bytes; off += (dc_u64)nthreads * esz) {
        dc_u32 v[W];
#pragma unroll
        for (int i = 0; i < W; ++i) v[i] = dc_load_elem<DT>(src[i] + off);
        dc_u32 r = dc_tree_scalar<W, DT, SOFT>(v);
        dc_store_elem<DT>(dst + off, r);
        if (wb) dc_store_elem<DT>(wb + off, r);
    }
}

// Byte copy with the widest granularity both pointers allow (16, 4 or 1 bytes).
DC_DEV void dc_copy_range(dc_u8* dst, const dc_u8* src, dc_u64 bytes, dc_u32 tid, dc_u32 nthreads) {
    if (dc_whole_vectors(bytes, nthreads, (dc_u64)dst | (dc_u64)src)) {
        *(dc_u32x4*)(dst + 16u * (dc_u64)tid) = *(const dc_u32x4*)(src + 16u * (dc_u64)tid);
        return;
    }
    dc_u64 rel = ((dc_u64)dst ^ (dc_u64)src);
    dc_u32 g = (rel & 15u) == 0 ? 16u : ((rel & 3u) == 0 ? 4u : 1u);
    dc_u64 head = g == 1u ? 0 : (((dc_u64)g - ((dc_u64)src & (g - 1u))) & (g - 1u));
    if (head > bytes) head = bytes;
    dc_u64 nwide = (bytes - head) / g;
    dc_u64 tail_start = head + nwide * g;
    for (dc_u64 i = tid; i < head; i += nthreads) dst[i] = src[i];
    if (g == 16u) {
        for (dc_u64 k = tid; k < nwide; k += nthreads)
            *(dc_u32x4*)(dst + head + k * 16u) = *(const dc_u32x4*)(src + head + k * 16u);
    } else if (g == 4u) {
        for (dc_u64 k = tid; k < nwide; k += nthreads)
            *(dc_u32*)(dst + head + k * 4u) = *(const dc_u32*)(src + head + k * 4u);
    } else {
        for (dc_u64 k = tid; k < nwide; k += nthreads) dst[k] = src[k];
    }
    for (dc_u64 i = tail_start + tid; i < bytes; i += nthreads) dst[i] = src[i];
}

// ---------------------------------------------------------------------------------------------
// Flags: system-scope release/acquire on 64-bit words, bounded spins.
// ---------------------------------------------------------------------------------------------

#if defined(DC_CUDA)
DC_DEV void dc_st_release_sys(dc_u64* p, dc_u64 v) {
    asm volatile("st.release.sys.global.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}
DC_DEV void dc_st_relaxed_sys(dc_u64* p, dc_u64 v) {
    asm volatile("st.relaxed.sys.global.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}
DC_DEV dc_u64 dc_ld_acquire_sys(const dc_u64* p) {
    dc_u64 v;
    asm volatile("ld.acquire.sys.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
    return v;
}
DC_DEV dc_u64 dc_ld_relaxed_sys(const dc_u64* p) {
    dc_u64 v;
    asm volatile("ld.relaxed.sys.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
    return v;
}
// Device-scope synchronisation between the blocks of one launch (the fused call's barrier):
// an add that releases the block's earlier stores and acquires the ones released before it,
// and an acquire load. Cheaper than a sequentially consistent fence around relaxed accesses.
DC_DEV dc_u32 dc_atom_add_acq_rel_dev(dc_u32* p, dc_u32 v) {
    dc_u32 old;
    asm volatile("atom.acq_rel.gpu.global.add.u32 %0, [%1], %2;" : "=r"(old) : "l"(p), "r"(v) : "memory");
    return old;
}
DC_DEV dc_u32 dc_ld_acquire_dev(const dc_u32* p) {
    dc_u32 v;
    asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    return v;
}
// Nanoseconds since an arbitrary epoch, the same on every SM of the device.
DC_DEV dc_u64 dc_globaltimer() {
    dc_u64 t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}
DC_DEV void dc_nanosleep(dc_u32 ns) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 700
    asm volatile("nanosleep.u32 %0;" ::"r"(ns));
#endif
}
#else
DC_DEV void dc_st_release_sys(dc_u64* p, dc_u64 v) {
    __hip_atomic_store(p, v, __ATOMIC_RELEASE, __HIP_MEMORY_SCOPE_SYSTEM);
}
DC_DEV void dc_st_relaxed_sys(dc_u64* p, dc_u64 v) {
    __hip_atomic_store(p, v, __ATOMIC_RELAXED, __HIP_MEMORY_SCOPE_SYSTEM);
}
DC_DEV dc_u64 dc_ld_acquire_sys(const dc_u64* p) {
    return __hip_atomic_load(p, __ATOMIC_ACQUIRE, __HIP_MEMORY_SCOPE_SYSTEM);
}
DC_DEV dc_u64 dc_ld_relaxed_sys(const dc_u64* p) {
    return __hip_atomic_load(p, __ATOMIC_RELAXED, __HIP_MEMORY_SCOPE_SYSTEM);
}
DC_DEV dc_u32 dc_atom_add_acq_rel_dev(dc_u32* p, dc_u32 v) {
    return __hip_atomic_fetch_add(p, v, __ATOMIC_ACQ_REL, __HIP_MEMORY_SCOPE_AGENT);
}
DC_DEV dc_u32 dc_ld_acquire_dev(const dc_u32* p) {
    return __hip_atomic_load(p, __ATOMIC_ACQUIRE, __HIP_MEMORY_SCOPE_AGENT);
}
// Raw s_memrealtime ticks (100 MHz on gfx942, 25 MHz on MI200, unpublished for gfx950): the host
// converts the wait bound into these ticks from hipDeviceAttributeWallClockRate (hip-ipc's
// HipDevice::wait_bound), so nothing here assumes a rate.
DC_DEV dc_u64 dc_globaltimer() { return (dc_u64)wall_clock64(); }
DC_DEV void dc_nanosleep(dc_u32) { __builtin_amdgcn_s_sleep(2); }
#endif

// ---------------------------------------------------------------------------------------------
// LL lines (the push route): 16 payload bytes travel as four 8-byte LL words, each a payload
// word in the low half and the arrival flag (the generation) in the high half. One naturally
// aligned 8-byte store carries a word and its flag, so a receiver that sees the flag has the
// payload: no separate flag, no fence. Every payload bit pattern is carried unchanged (the flag
// is beside the data, never a value sentinel). What the hardware must give: single-copy
// atomicity of aligned 8-byte stores to peer memory (NVLink/PCIe P2P on NVIDIA; xGMI to
// fine-grained memory on AMD), which both memory models guarantee for 8-byte atomics — the HIP
// path uses exactly those, the CUDA path 8-byte elements of a vector access.
// ---------------------------------------------------------------------------------------------

#if defined(DC_CUDA)
DC_DEV void dc_ll_store(dc_u8* line, dc_u32x4 v, dc_u32 flag) {
    dc_u64 f = (dc_u64)flag << 32;
    asm volatile("st.volatile.global.v2.u64 [%0], {%1, %2};" ::"l"(line), "l"(f | v.x), "l"(f | v.y) : "memory");
    asm volatile("st.volatile.global.v2.u64 [%0], {%1, %2};" ::"l"(line + 16), "l"(f | v.z), "l"(f | v.w) : "memory");
}
// Whether all four words of the line carry `flag`; their payload in `v` if so.
DC_DEV bool dc_ll_load(const dc_u8* line, dc_u32 flag, dc_u32x4& v) {
    dc_u64 a, b, c, d;
    asm volatile("ld.volatile.global.v2.u64 {%0, %1}, [%2];" : "=l"(a), "=l"(b) : "l"(line) : "memory");
    asm volatile("ld.volatile.global.v2.u64 {%0, %1}, [%2];" : "=l"(c), "=l"(d) : "l"(line + 16) : "memory");
    v.x = (dc_u32)a;
    v.y = (dc_u32)b;
    v.z = (dc_u32)c;
    v.w = (dc_u32)d;
    return (dc_u32)(a >> 32) == flag && (dc_u32)(b >> 32) == flag && (dc_u32)(c >> 32) == flag &&
           (dc_u32)(d >> 32) == flag;
}
#else
DC_DEV void dc_ll_store(dc_u8* line, dc_u32x4 v, dc_u32 flag) {
    dc_u64 f = (dc_u64)flag << 32;
    dc_u64* w = (dc_u64*)line;
    __hip_atomic_store(w + 0, f | v.x, __ATOMIC_RELAXED, __HIP_MEMORY_SCOPE_SYSTEM);
    __hip_atomic_store(w + 1, f | v.y, __ATOMIC_RELAXED, __HIP_MEMORY_SCOPE_SYSTEM);
    __hip_atomic_store(w + 2, f | v.z, __ATOMIC_RELAXED, __HIP_MEMORY_SCOPE_SYSTEM);
    __hip_atomic_store(w + 3, f | v.w, __ATOMIC_RELAXED, __HIP_MEMORY_SCOPE_SYSTEM);
}
DC_DEV bool dc_ll_load(const dc_u8* line, dc_u32 flag, dc_u32x4& v) {
    const dc_u64* w = (const dc_u64*)line;
    dc_u64 a = __hip_atomic_load(w + 0, __ATOMIC_RELAXED, __HIP_MEMORY_SCOPE_SYSTEM);
    dc_u64 b = __hip_atomic_load(w + 1, __ATOMIC_RELAXED, __HIP_MEMORY_SCOPE_SYSTEM);
    dc_u64 c = __hip_atomic_load(w + 2, __ATOMIC_RELAXED, __HIP_MEMORY_SCOPE_SYSTEM);
    dc_u64 d = __hip_atomic_load(w + 3, __ATOMIC_RELAXED, __HIP_MEMORY_SCOPE_SYSTEM);
    v.x = (dc_u32)a;
    v.y = (dc_u32)b;
    v.z = (dc_u32)c;
    v.w = (dc_u32)d;
    return (dc_u32)(a >> 32) == flag && (dc_u32)(b >> 32) == flag && (dc_u32)(c >> 32) == flag &&
           (dc_u32)(d >> 32) == flag;
}
#endif

// Up to 16 bytes at any address: one vector load when 16 bytes are there and aligned, bytes
// otherwise (unaligned views and the tail of a range; never reads past `n`, which is at most
// 16). The bytes go to their word by comparisons, not by an index into an array: an indexed
// array lives in local memory, and its stack frame took the row form's words of the fused
// launch (LL push) into local memory with it.
DC_DEV dc_u32x4 dc_load16(const dc_u8* p, dc_u64 n) {
    if (n == 16u && ((dc_u64)p & 15u) == 0) return *(const dc_u32x4*)p;
    dc_u32x4 v;
    v.x = v.y = v.z = v.w = 0u;
    for (dc_u32 i = 0; i < (dc_u32)n; ++i) {
        const dc_u32 b = (dc_u32)p[i] << (8u * (i & 3u));
        if (i < 4u) v.x |= b;
        else if (i < 8u) v.y |= b;
        else if (i < 12u) v.z |= b;
        else v.w |= b;
    }
    return v;
}

// The first `n` (<= 16) bytes of `v` to any address, as dc_load16.
DC_DEV void dc_store16(dc_u8* p, dc_u32x4 v, dc_u64 n) {
    if (n == 16u && ((dc_u64)p & 15u) == 0) {
        *(dc_u32x4*)p = v;
        return;
    }
    for (dc_u32 i = 0; i < (dc_u32)n; ++i) {
        const dc_u32 w = i < 4u ? v.x : i < 8u ? v.y : i < 12u ? v.z : v.w;
        p[i] = (dc_u8)(w >> (8u * (i & 3u)));
    }
}

// The waiter's classification of one observed flag word, as collective_core::FlagState.
#define DC_BEHIND 0
#define DC_READY 1
#define DC_PASSED 2
#define DC_MISMATCH 3
#define DC_CORRUPT 4

// FlagWord::check: generations wrap; a correct peer is at most one generation ahead.
DC_DEV int dc_flag_check(dc_u64 word, dc_u32 generation, dc_u32 digest) {
    int delta = (int)((dc_u32)(word >> 32) - generation);
    if (delta == 0) return (dc_u32)word == digest ? DC_READY : DC_MISMATCH;
    if (delta == 1) return DC_PASSED;
    if (delta < 0) return DC_BEHIND;
    return DC_CORRUPT;
}

DC_DEV dc_u64 dc_flag_word(dc_u32 generation, dc_u32 digest) {
    return ((dc_u64)generation << 32) | (dc_u64)digest;
}

#endif  // DETCOLL_TREE_H
