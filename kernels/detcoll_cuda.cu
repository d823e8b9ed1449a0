// detcoll_cuda.cu — CUDA entry points of detcoll (crates/cuda-ipc compiles this with NVRTC, or
// loads a cubin/PTX that `cargo xtask build --arch sm_XX` made from it).
//
// The kernel bodies (the one-launch collective protocol, the fused tree, the copy) live in
// detcoll_protocol.h, shared with the HIP entry (detcoll_hip.hip); the arithmetic and flags in
// detcoll_tree.h; the residual + RMSNorm in detcoll_norm.h. This file maps the protocol header's execution-model macros onto CUDA's
// built-ins and declares the `extern "C"` kernels (the ABI table `detcoll_abi` comes with the header).

// Execution model for detcoll_protocol.h: CUDA's built-in variables and intrinsics.
#define DC_TID threadIdx.x
#define DC_BID blockIdx.x
#define DC_NTID blockDim.x
#define DC_NBLOCKS gridDim.x
#define DC_SYNC_BLOCK() __syncthreads()
#define DC_FENCE_SYSTEM() __threadfence_system()
#define DC_FENCE_RELEASE_SYSTEM() asm volatile("fence.acq_rel.sys;" ::: "memory")
#define DC_ATOMIC_CAS_U64(p, cmp, val) atomicCAS((unsigned long long*)(p), (cmp), (unsigned long long)(val))
#define DC_ATOMIC_ADD_U32(p, v) atomicAdd((dc_u32*)(p), (v))
#define DC_SHARED __shared__
#define DC_DEV_NOINLINE __device__ __noinline__
// A launch for a world this image was not built for (never issued by the host): stop the kernel
// with an error the stream reports, rather than return with the output unwritten.
#define DC_UNSUPPORTED_WORLD() __trap()
// Programmatic dependent launch (sm_90+): the wait blocks until the grids this launch depends on
// have completed and their memory is visible (it returns at once for a launch without the
// programmatic attribute); the trigger lets a dependent launch start its blocks early.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#define DC_GRID_DEP_WAIT() asm volatile("griddepcontrol.wait;" ::: "memory")
#define DC_GRID_DEP_TRIGGER() asm volatile("griddepcontrol.launch_dependents;" ::: "memory")
#else
#define DC_GRID_DEP_WAIT() ((void)0)
#define DC_GRID_DEP_TRIGGER() ((void)0)
#endif

#include "detcoll_protocol.h"
#include "detcoll_norm.h"

// One launch per collective call; `h` and `seg` are read in place from parameter space.
#ifndef DETCOLL_SOFT_MODULE
extern "C" __global__ void __launch_bounds__(DC_THREADS) detcoll_collective_s(const __grid_constant__ DcParams<DC_SEGS_SINGLE> p) {
    dc_collective(p.h, p.seg);
}

extern "C" __global__ void __launch_bounds__(DC_THREADS) detcoll_collective_m(const __grid_constant__ DcParams<DC_SEGS_MANY> p) {
    dc_collective(p.h, p.seg);
}
#endif

// The fused tree W inputs -> 1 output (transport route, bandwidth bench), the launch-cost
// baseline, and the world-1 copy.
#ifndef DETCOLL_SOFT_MODULE
extern "C" __global__ void __launch_bounds__(DC_THREADS) detcoll_tree(const DcTreeParams p) { dc_tree_any<false>(p); }

// An empty kernel: the launch-cost baseline of the latency bench.
extern "C" __global__ void detcoll_noop() {}

// Byte copy over the whole grid (world 1 out of place).
extern "C" __global__ void __launch_bounds__(DC_THREADS) detcoll_copy(const DcCopyParams p) {
    dc_copy_range((dc_u8*)p.dst, (const dc_u8*)p.src, p.bytes, blockIdx.x * blockDim.x + threadIdx.x, gridDim.x * blockDim.x);
}

// Residual add + RMSNorm after an all_reduce (detcoll_norm.h): one block of DC_NORM_THREADS per
// row, grid-stride over rows. Independent of the world: in every image.
extern "C" __global__ void __launch_bounds__(DC_NORM_THREADS) detcoll_residual_rmsnorm(const DcNormParams p) {
    dc_residual_rmsnorm(p);
}

// The fused all_reduce + residual + RMSNorm (detcoll_norm.h, dc_collective_norm): the collective
// of the call's last launch with the norm as its epilogue, DC_THREADS per block.
extern "C" __global__ void __launch_bounds__(DC_THREADS)
    detcoll_collective_norm(const __grid_constant__ DcCollectiveNormParams p) {
    dc_collective_norm(p);
}
#else
// Built only into the separate "soft" module (-DDETCOLL_SOFT_MODULE), loaded on demand: the
// software arithmetic triples the compile time and only tests and HIP-parity checks need it.
extern "C" __global__ void __launch_bounds__(DC_THREADS) detcoll_tree_soft(const DcTreeParams p) { dc_tree_any<true>(p); }
#endif
