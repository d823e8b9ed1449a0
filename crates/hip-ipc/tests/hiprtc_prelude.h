// hiprtc_prelude.h — a TEST STAND-IN for the HIP headers hiprtc pre-includes, used only by
// crates/hip-ipc/tests/kernels_compile.rs (`-D__HIPCC_RTC__ -include hiprtc_prelude.h`).
//
// hiprtc compiles kernels/detcoll_hip.hip with ROCm's HIP runtime headers already included and
// __HIPCC_RTC__ defined; those headers define the names below, which the entry file therefore
// defines only when compiled offline. This file defines the same names the way HIP does (the
// attribute macros; `uint4` as a 16-byte union of a native vector and x/y/z/w like
// HIP_vector_type<unsigned int, 4>; `static` bit casts; `__fadd_rn` as one add; `wall_clock64`
// returning `long long`), so that compiling the entry with it proves the guards are consistent:
// nothing the entry still defines under __HIPCC_RTC__ clashes with these, and nothing it needs
// is missing. It is not ROCm's headers and proves nothing about them.
#define __host__ __attribute__((host))
#define __device__ __attribute__((device))
#define __global__ __attribute__((global))
#define __forceinline__ inline __attribute__((always_inline))
#define __noinline__ __attribute__((noinline))

typedef unsigned int detcoll_test_native_u32x4 __attribute__((ext_vector_type(4)));
struct uint4 {
    union {
        detcoll_test_native_u32x4 data;
        struct {
            unsigned int x, y, z, w;
        };
    };
};
static_assert(sizeof(uint4) == 16 && alignof(uint4) == 16, "HIP's uint4 is 16 bytes, 16-byte aligned");

__device__ static inline float __uint_as_float(unsigned int x) {
    float f;
    __builtin_memcpy(&f, &x, sizeof(f));
    return f;
}
__device__ static inline unsigned int __float_as_uint(float x) {
    unsigned int u;
    __builtin_memcpy(&u, &x, sizeof(u));
    return u;
}
__device__ static inline float __fadd_rn(float x, float y) { return x + y; }
__device__ inline __attribute__((always_inline)) long long int wall_clock64() {
    return (long long int)__builtin_amdgcn_s_memrealtime();
}
