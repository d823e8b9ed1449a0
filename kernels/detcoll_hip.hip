// detcoll_hip.hip — HIP (AMD) entry points of detcoll: the same kernels as detcoll_cuda.cu, on
// the same portable headers (detcoll_protocol.h: protocol, fused tree, copy; detcoll_tree.h:
// arithmetic and flags). `cargo xtask build --arch gfx942,gfx950` compiles it to one code object
// per target (kernels/build/detcoll_hip.<gfx>.co), which crates/hip-ipc loads; without one,
// crates/hip-ipc compiles this file at run time with hiprtc (the same strict flags except the
// offline-driver ones; see the __HIPCC_RTC__ guard below).
//
// Compiled device-only and self-contained, with the same flags by hipcc or a plain clang:
//
//   -x hip --offload-arch=gfxNNN --offload-device-only -nogpulib -nogpuinc -O3 -std=c++17
//   -fno-fast-math -fno-gpu-flush-denormals-to-zero -ffp-contract=off
//
// `-nogpuinc` keeps the HIP headers out (this file needs none: the few HIP names the headers use
// are defined below from clang builtins), so a Debian clang or the clang bundled with zig
// builds exactly what hipcc builds; `-nogpulib` links no device library (nothing here calls one).
//
// Strict arithmetic on AMD. Reductions use the packed gfx9 instructions (detcoll_tree.h):
// f16x2 `v_pk_add_f16`; bf16x2 as two exact widenings, one `v_pk_add_f32` and one rounding to
// bf16 (`v_cvt_pk_bf16_f32` on gfx950, software round-to-nearest-even on gfx942/gfx90a) — each
// lane exactly the dtype add (the argument is in crates/fixed-tree/src/element.rs). Adds round
// to nearest even (the MODE register default, which nothing here changes) and keep denormals
// only without fast-math and without denormal flushing, which the flags above guarantee and the
// checks below and the compile test (denorm modes 3, the packed instructions present) assert.
// `detcoll_tree_soft` runs the software path (widen, one f32 add, round once), the same code the
// NVIDIA "soft" module runs on H200s, so the AMD GPU tests check hardware against software and
// both against `fixed-tree`. Packed 16-byte loads/stores (dc_u32x4) carry 4 f32 or 8 f16/bf16
// lanes; unaligned heads and tails take the scalar code.
//
// Flags. detcoll_tree.h publishes with `__hip_atomic_store(..., __ATOMIC_RELEASE,
// __HIP_MEMORY_SCOPE_SYSTEM)` and waits with `__hip_atomic_load(..., __ATOMIC_ACQUIRE,
// __HIP_MEMORY_SCOPE_SYSTEM)`. System-scope atomics are only coherent across GPUs on
// fine-grained or uncached memory: hip-ipc puts the control block there
// (hipExtMallocWithFlags(hipDeviceMallocFinegrained)); see docs/rocm.md.
//
// Bounded waits. `dc_globaltimer()` (detcoll_tree.h) is `wall_clock64()`, the raw ticks of
// `s_memrealtime`, the constant "REFCLK" counter. Its rate differs between parts (100 MHz on
// MI300X gfx942, 25 MHz on MI200, unpublished for MI355X gfx950), so the kernels assume none:
// `DcHeader::timeout_ns` holds the bound in ticks, computed on the host from
// hipDeviceAttributeWallClockRate (kHz; hip-ipc's HipDevice::wait_bound, 100 MHz assumed with a
// warning when the attribute reads 0). Spins sleep with `s_sleep` (`__builtin_amdgcn_s_sleep`)
// after the first few thousand polls.
#if !defined(__HIP__)
#error "detcoll_hip.hip must be compiled as HIP (-x hip)"
#endif
#if defined(__FAST_MATH__) || (defined(__FINITE_MATH_ONLY__) && __FINITE_MATH_ONLY__)
#error "detcoll_hip.hip must not be compiled with fast math: the reduction tree needs IEEE adds"
#endif
#if defined(__HIP_DEVICE_COMPILE__) && !defined(__GFX9__)
#error "detcoll_hip.hip targets gfx9 parts (gfx90a, gfx942, gfx950): s_memrealtime, s_sleep, packed adds"
#endif

// ---------------------------------------------------------------------------------------------
// The HIP names the headers use, from clang builtins (no HIP headers: -nogpuinc).
//
// Only when compiled offline: hiprtc (crates/hip-ipc's runtime compilation) pre-includes the
// HIP runtime headers and defines __HIPCC_RTC__, and those headers define every name below
// (redefining the functions would be a compile error there, the macros a redefinition). HIP's
// versions are the same operations: bit casts, one IEEE f32 add (round to nearest even), the
// s_memrealtime counter (as `long long`; dc_globaltimer() returns it as 64 unsigned bits).
// The 16-byte vectors are our own `dc_u32x4` (detcoll_tree.h), never HIP's `uint4`.
// ---------------------------------------------------------------------------------------------
// Contraction is off for this file (-ffp-contract=off and this pragma), in either build.
#pragma clang fp contract(off)
#if !defined(__HIPCC_RTC__)
#define __device__ __attribute__((device))
#define __global__ __attribute__((global))
#define __forceinline__ __inline__ __attribute__((always_inline))
#define __noinline__ __attribute__((noinline))

__device__ __forceinline__ float __uint_as_float(unsigned int u) { return __builtin_bit_cast(float, u); }
__device__ __forceinline__ unsigned int __float_as_uint(float f) { return __builtin_bit_cast(unsigned int, f); }
// One IEEE f32 add, round to nearest even (a lone add has nothing to fuse with anyway).
__device__ __forceinline__ float __fadd_rn(float a, float b) { return a + b; }
// The constant s_memrealtime counter, raw ticks (see the header comment).
__device__ __forceinline__ unsigned long long wall_clock64() { return __builtin_amdgcn_s_memrealtime(); }
#endif  // !__HIPCC_RTC__

// Execution model for detcoll_protocol.h.
#define DC_TID __builtin_amdgcn_workitem_id_x()
#define DC_BID __builtin_amdgcn_workgroup_id_x()
#define DC_NTID ((unsigned int)__builtin_amdgcn_workgroup_size_x())
#define DC_NBLOCKS (__builtin_amdgcn_grid_size_x() / DC_NTID)
// What HIP's __syncthreads() is: release to the workgroup, barrier, acquire from it.
#define DC_SYNC_BLOCK()                                      \
    do {                                                     \
        __builtin_amdgcn_fence(__ATOMIC_RELEASE, "workgroup"); \
        __builtin_amdgcn_s_barrier();                        \
        __builtin_amdgcn_fence(__ATOMIC_ACQUIRE, "workgroup"); \
    } while (0)
// __threadfence_system(): sequentially consistent at system scope.
#define DC_FENCE_SYSTEM() __builtin_amdgcn_fence(__ATOMIC_SEQ_CST, "")
#define DC_FENCE_RELEASE_SYSTEM() __builtin_amdgcn_fence(__ATOMIC_RELEASE, "")
#define DC_ATOMIC_CAS_U64(p, cmp, val) dc_hip_cas_u64((dc_u64*)(p), (cmp), (dc_u64)(val))
#define DC_ATOMIC_ADD_U32(p, v) \
    __hip_atomic_fetch_add((dc_u32*)(p), (dc_u32)(v), __ATOMIC_RELAXED, __HIP_MEMORY_SCOPE_AGENT)
#define DC_SHARED __attribute__((shared))
#define DC_DEV_NOINLINE __device__ __noinline__
// A launch for a world this image was not built for (never issued by the host): stop the kernel.
#define DC_UNSUPPORTED_WORLD() __builtin_trap()
// HIP has no programmatic dependent launch: every launch starts after the previous one ends.
#define DC_GRID_DEP_WAIT() ((void)0)
#define DC_GRID_DEP_TRIGGER() ((void)0)
// CUDA's __launch_bounds__(N): at most N work-items per workgroup.
#define DC_HIP_BOUNDS __attribute__((amdgpu_flat_work_group_size(1, DC_THREADS)))

#include "detcoll_tree.h"

#if !defined(DC_HIP)
#error "detcoll_tree.h did not select its HIP path"
#endif

// atomicCAS on a 64-bit word at device (agent) scope: only this rank's blocks race on it.
DC_DEV dc_u64 dc_hip_cas_u64(dc_u64* p, dc_u64 cmp, dc_u64 val) {
    __hip_atomic_compare_exchange_strong(p, &cmp, val, __ATOMIC_RELAXED, __ATOMIC_RELAXED,
                                         __HIP_MEMORY_SCOPE_AGENT);
    return cmp;  // the old value: `cmp` is overwritten with it on failure, equals it on success
}

#include "detcoll_protocol.h"
#include "detcoll_norm.h"

// One launch per collective call. Kernel arguments live in the kernarg segment; the body reads
// them by reference.
extern "C" __global__ void DC_HIP_BOUNDS detcoll_collective_s(const DcParams<DC_SEGS_SINGLE> p) {
    dc_collective(p.h, p.seg);
}

extern "C" __global__ void DC_HIP_BOUNDS detcoll_collective_m(const DcParams<DC_SEGS_MANY> p) {
    dc_collective(p.h, p.seg);
}

// The fused tree W inputs -> 1 output: the packed hardware arithmetic (what the collectives
// use), and the software arithmetic for the parity tests (see above).
extern "C" __global__ void DC_HIP_BOUNDS detcoll_tree(const DcTreeParams p) { dc_tree_any<false>(p); }
extern "C" __global__ void DC_HIP_BOUNDS detcoll_tree_soft(const DcTreeParams p) { dc_tree_any<true>(p); }

// An empty kernel: the launch-cost baseline of the latency bench.
extern "C" __global__ void detcoll_noop() {}

// One reading of the wait clock (s_memrealtime ticks) into host-mapped memory: the host
// calibrates the clock's rate from two readings when hipDeviceAttributeWallClockRate reads 0.
struct DcClockParams {
    dc_u64 out;
};
extern "C" __global__ void detcoll_clock(const DcClockParams p) {
    if (DC_TID == 0 && DC_BID == 0) *(volatile dc_u64*)p.out = dc_globaltimer();
}

// Byte copy over the whole grid (world 1 out of place).
extern "C" __global__ void DC_HIP_BOUNDS detcoll_copy(const DcCopyParams p) {
    dc_copy_range((dc_u8*)p.dst, (const dc_u8*)p.src, p.bytes, DC_BID * DC_NTID + DC_TID, DC_NBLOCKS * DC_NTID);
}

// Residual add + RMSNorm after an all_reduce (detcoll_norm.h): one workgroup of DC_NORM_THREADS
// per row, grid-stride over rows.
extern "C" __global__ void __attribute__((amdgpu_flat_work_group_size(1, DC_NORM_THREADS)))
detcoll_residual_rmsnorm(const DcNormParams p) {
    dc_residual_rmsnorm(p);
}

// The fused all_reduce + residual + RMSNorm (detcoll_norm.h, dc_collective_norm): the collective
// of the call's last launch with the norm as its epilogue.
extern "C" __global__ void DC_HIP_BOUNDS detcoll_collective_norm(const DcCollectiveNormParams p) {
    dc_collective_norm(p);
}
