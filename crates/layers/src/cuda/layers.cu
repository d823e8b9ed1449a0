// Device code of detcoll-layers' GPU path: SiLU, SwiGLU's SiLU(gate) * up, the leaf fold and
// causal attention, for f32
// and bf16 (bf16 is carried as its 16 raw bits, so no CUDA header is needed).
//
// Compiled by NVRTC without fast math (`--ftz=false --prec-div=true --prec-sqrt=true
// --fmad=false`), and every f32 operation that matters is an explicit round-to-nearest
// intrinsic (`__fadd_rn`, `__fmul_rn`, `__fdiv_rn`), so no add is contracted into an FMA or
// reordered. `expf`/`logf` are CUDA's accurate library functions (not `__expf`): a fixed
// function of the value on a given toolkit.

typedef unsigned short bf16_bits;

struct F32 {
    typedef float T;
    static __device__ __forceinline__ float load(float x) { return x; }
    static __device__ __forceinline__ float store(float v) { return v; }
};

struct BF16 {
    typedef bf16_bits T;
    // Every bf16 value is an f32 value: the bits shifted up.
    static __device__ __forceinline__ float load(bf16_bits x) { return __uint_as_float(((unsigned int)x) << 16); }
    // f32 -> bf16, to nearest, ties to even (what `half::bf16::from_f32` does, NaN kept quiet).
    static __device__ __forceinline__ bf16_bits store(float v) {
        unsigned int x = __float_as_uint(v);
        if ((x & 0x7fffffffu) > 0x7f800000u) {
            return (bf16_bits)((x >> 16) | 0x0040u);
        }
        const unsigned int round_bit = 0x00008000u;
        if ((x & round_bit) != 0u && (x & (3u * round_bit - 1u)) != 0u) {
            return (bf16_bits)((x >> 16) + 1u);
        }
        return (bf16_bits)(x >> 16);
    }
};

// a + b in the element type: the f32 sum rounded once to nearest even (for bf16 the f32 add
// is followed by one rounding; 24 >= 2*8+2 bits makes that the correctly rounded bf16 sum, the
// same bits as fixed-tree's add and the collective's `add.rn.bf16`).
template <class E>
__device__ __forceinline__ typename E::T add(typename E::T a, typename E::T b) {
    return E::store(__fadd_rn(E::load(a), E::load(b)));
}

// SiLU in place: x / (1 + exp(-x)) in f32, rounded once to the element type.
template <class E>
__device__ void silu(typename E::T* x, unsigned long long n) {
    unsigned long long stride = (unsigned long long)gridDim.x * blockDim.x;
    for (unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        float v = E::load(x[i]);
        x[i] = E::store(__fdiv_rn(v, __fadd_rn(1.0f, expf(-v))));
    }
}

// SwiGLU's activation in place over the gate: SiLU of the gate as `silu` computes it, rounded
// once to the element type, times `up` in f32, rounded once (activation::silu_mul on the host:
// what `F.silu(gate) * up` computes on tensors of the type).
template <class E>
__device__ void silu_mul(typename E::T* gate, const typename E::T* up, unsigned long long n) {
    unsigned long long stride = (unsigned long long)gridDim.x * blockDim.x;
    for (unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        float v = E::load(gate[i]);
        float act = E::load(E::store(__fdiv_rn(v, __fadd_rn(1.0f, expf(-v)))));
        gate[i] = E::store(__fmul_rn(act, E::load(up[i])));
    }
}

// out = the balanced tree over `leaves` (1, 2, 4 or 8) products of `n` elements each, product
// `j` at `p + j * stride`: 1 = copy, 2 = p0+p1, 4 = (p0+p1)+(p2+p3), 8 = the tree of two 4s.
template <class E>
__device__ void leaf_fold(const typename E::T* p, typename E::T* out, unsigned int leaves, unsigned long long n,
                          unsigned long long stride) {
    typedef typename E::T T;
    unsigned long long step = (unsigned long long)gridDim.x * blockDim.x;
    for (unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += step) {
        T r;
        if (leaves == 1u) {
            r = p[i];
        } else if (leaves == 2u) {
            r = add<E>(p[i], p[stride + i]);
        } else if (leaves == 4u) {
            r = add<E>(add<E>(p[i], p[stride + i]), add<E>(p[2 * stride + i], p[3 * stride + i]));
        } else {
            T a = add<E>(add<E>(p[i], p[stride + i]), add<E>(p[2 * stride + i], p[3 * stride + i]));
            T b = add<E>(add<E>(p[4 * stride + i], p[5 * stride + i]), add<E>(p[6 * stride + i], p[7 * stride + i]));
            r = add<E>(a, b);
        }
        out[i] = r;
    }
}

#define ATT_WARPS 8      // queries (warps) per block, all of one head
#define ATT_KEYS 16      // keys staged in shared memory per step
#define ATT_MAX_PER 8    // head_dim / 32 at most (head_dim <= 256)

// Causal attention, one warp per (query, head). Lane `l` holds dims `t*32 + l`,
// t < per = head_dim/32. For every visible key j (kpos[j] <= qpos[i]), strictly in key order
// j = 0..n_k-1:
//   s   = (sum over t of q*k, in t order per lane, then the xor-shuffle tree 16,8,4,2,1 --
//          every lane ends with the same bits) * scale
//   m'  = max(m, s); c = exp(m - m'); p = exp(s - m')
//   l   = l*c + p;  acc[d] = acc[d]*c + p*v[j,d];  m = m'
// out = acc / l rounded to the element type, lse = m + log(l) (no visible key: 0 and -inf).
// Staging keys in tiles changes nothing in that order: it is fixed by the key index alone, so
// query i's bits depend only on q[i], qpos[i] and the gathered k, v, kpos -- not on CP.
template <class E>
__device__ void attention(const typename E::T* q, const typename E::T* k, const typename E::T* v,
                          const int* qpos, const int* kpos, typename E::T* out, float* lse,
                          unsigned int n_q, unsigned int n_k, unsigned int heads, unsigned int head_dim,
                          float scale) {
    typedef typename E::T T;
    __shared__ T ks[ATT_KEYS * ATT_MAX_PER * 32];
    __shared__ T vs[ATT_KEYS * ATT_MAX_PER * 32];
    __shared__ int kp[ATT_KEYS];
    __shared__ int q_max;
    const unsigned int lane = threadIdx.x & 31u;
    const unsigned int warp = threadIdx.x >> 5;
    const unsigned int h = blockIdx.y;
    const unsigned int per = head_dim >> 5;
    const unsigned long long row = (unsigned long long)heads * head_dim;
    const unsigned int qi = blockIdx.x * ATT_WARPS + warp;
    const bool active = qi < n_q;

    if (threadIdx.x == 0) {
        int mx = -2147483647 - 1;
        for (unsigned int w = 0; w < ATT_WARPS; ++w) {
            unsigned int i = blockIdx.x * ATT_WARPS + w;
            if (i < n_q && qpos[i] > mx) mx = qpos[i];
        }
        q_max = mx;
    }
    float qv[ATT_MAX_PER];
    float acc[ATT_MAX_PER];
    int my_pos = 0;
#pragma unroll
    for (unsigned int t = 0; t < ATT_MAX_PER; ++t) {
        qv[t] = 0.0f;
        acc[t] = 0.0f;
        if (active && t < per) qv[t] = E::load(q[qi * row + h * head_dim + t * 32u + lane]);
    }
    if (active) my_pos = qpos[qi];
    float m = -__int_as_float(0x7f800000);
    float l = 0.0f;
    bool seen = false;  // a visible key (not l > 0: a NaN or infinite score makes l NaN)
    __syncthreads();

    for (unsigned int start = 0; start < n_k; start += ATT_KEYS) {
        const unsigned int count = min((unsigned int)ATT_KEYS, n_k - start);
        for (unsigned int idx = threadIdx.x; idx < count * head_dim; idx += blockDim.x) {
            unsigned int kk = idx / head_dim;
            unsigned int d = idx - kk * head_dim;
            unsigned long long g = (unsigned long long)(start + kk) * row + (unsigned long long)h * head_dim + d;
            ks[kk * head_dim + d] = k[g];
            vs[kk * head_dim + d] = v[g];
        }
        int visible = 0;
        if (threadIdx.x < count) {
            int p = kpos[start + threadIdx.x];
            kp[threadIdx.x] = p;
            visible = p <= q_max;
        }
        // A tile no query of this block sees is skipped (the order of the rest is unchanged).
        if (!__syncthreads_or(visible)) {
            continue;
        }
        if (active) {
            for (unsigned int kk = 0; kk < count; ++kk) {
                if (kp[kk] > my_pos) continue;  // warp-uniform: one query per warp
                seen = true;
                float s = 0.0f;
#pragma unroll
                for (unsigned int t = 0; t < ATT_MAX_PER; ++t) {
                    if (t < per) s = __fadd_rn(s, __fmul_rn(qv[t], E::load(ks[kk * head_dim + t * 32u + lane])));
                }
#pragma unroll
                for (int off = 16; off > 0; off >>= 1) {
                    s = __fadd_rn(s, __shfl_xor_sync(0xffffffffu, s, off));
                }
                s = __fmul_rn(s, scale);
                // The update of the header comment, split on which of m, s is larger (warp-
                // uniform: every lane holds the same s). Bit for bit the same: when s > m,
                // p = exp(0) = 1 exactly and p*v = v; otherwise m' = m, c = exp(0) = 1 exactly
                // and l*1, acc*1 are exact. One exp per key instead of two.
                if (s > m) {
                    const float c = expf(__fadd_rn(m, -s));
                    m = s;
                    l = __fadd_rn(__fmul_rn(l, c), 1.0f);
#pragma unroll
                    for (unsigned int t = 0; t < ATT_MAX_PER; ++t) {
                        if (t < per) acc[t] = __fadd_rn(__fmul_rn(acc[t], c), E::load(vs[kk * head_dim + t * 32u + lane]));
                    }
                } else {
                    const float p = expf(__fadd_rn(s, -m));
                    l = __fadd_rn(l, p);
#pragma unroll
                    for (unsigned int t = 0; t < ATT_MAX_PER; ++t) {
                        if (t < per) acc[t] = __fadd_rn(acc[t], __fmul_rn(p, E::load(vs[kk * head_dim + t * 32u + lane])));
                    }
                }
            }
        }
        __syncthreads();
    }
    if (!active) return;
    const bool any = seen;
#pragma unroll
    for (unsigned int t = 0; t < ATT_MAX_PER; ++t) {
        if (t < per) out[qi * row + h * head_dim + t * 32u + lane] = E::store(any ? __fdiv_rn(acc[t], l) : 0.0f);
    }
    if (lane == 0) lse[(unsigned long long)qi * heads + h] = any ? __fadd_rn(m, logf(l)) : m;
}

extern "C" __global__ void detcoll_layers_silu_f32(float* x, unsigned long long n) { silu<F32>(x, n); }
extern "C" __global__ void detcoll_layers_silu_bf16(bf16_bits* x, unsigned long long n) { silu<BF16>(x, n); }

extern "C" __global__ void detcoll_layers_silu_mul_f32(float* gate, const float* up, unsigned long long n) {
    silu_mul<F32>(gate, up, n);
}
extern "C" __global__ void detcoll_layers_silu_mul_bf16(bf16_bits* gate, const bf16_bits* up, unsigned long long n) {
    silu_mul<BF16>(gate, up, n);
}

extern "C" __global__ void detcoll_layers_leaf_fold_f32(const float* p, float* out, unsigned int leaves,
                                                        unsigned long long n, unsigned long long stride) {
    leaf_fold<F32>(p, out, leaves, n, stride);
}
extern "C" __global__ void detcoll_layers_leaf_fold_bf16(const bf16_bits* p, bf16_bits* out, unsigned int leaves,
                                                         unsigned long long n, unsigned long long stride) {
    leaf_fold<BF16>(p, out, leaves, n, stride);
}

extern "C" __global__ void __launch_bounds__(ATT_WARPS * 32)
    detcoll_layers_attention_f32(const float* q, const float* k, const float* v, const int* qpos, const int* kpos,
                                 float* out, float* lse, unsigned int n_q, unsigned int n_k, unsigned int heads,
                                 unsigned int head_dim, float scale) {
    attention<F32>(q, k, v, qpos, kpos, out, lse, n_q, n_k, heads, head_dim, scale);
}
extern "C" __global__ void __launch_bounds__(ATT_WARPS * 32)
    detcoll_layers_attention_bf16(const bf16_bits* q, const bf16_bits* k, const bf16_bits* v, const int* qpos,
                                  const int* kpos, bf16_bits* out, float* lse, unsigned int n_q, unsigned int n_k,
                                  unsigned int heads, unsigned int head_dim, float scale) {
    attention<BF16>(q, k, v, qpos, kpos, out, lse, n_q, n_k, heads, head_dim, scale);
}
