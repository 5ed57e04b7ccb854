// On-device sampling helpers over [S, vocab] logits: greedy argmax and top-k log-probabilities.
// One block per row. Order is (value descending, index ascending), so ties pick the lowest index
// as numpy's argmax does, and top-k takes k passes that each find the best element ranked below
// the previous pick: no sort and no per-row scratch, and k is small (OpenAI allows at most 20).
#include "common.cuh"

#define NEG_INF (-__int_as_float(0x7f800000))
#define NO_INDEX 0x7fffffff

__device__ __forceinline__ bool better(float v, int i, float bv, int bi) { return v > bv || (v == bv && i < bi); }

// The block's best (v, i); every thread gets it.
__device__ void block_best(float& v, int& i) {
    __shared__ float sv[32];
    __shared__ int si[32];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        const float ov = __shfl_xor_sync(0xffffffffu, v, o);
        const int oi = __shfl_xor_sync(0xffffffffu, i, o);
        if (better(ov, oi, v, i)) { v = ov; i = oi; }
    }
    __syncthreads();  // sv/si may still be read by a previous call
    if (lane == 0) { sv[warp] = v; si[warp] = i; }
    __syncthreads();
    v = lane < (int)(blockDim.x >> 5) ? sv[lane] : NEG_INF;
    i = lane < (int)(blockDim.x >> 5) ? si[lane] : NO_INDEX;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        const float ov = __shfl_xor_sync(0xffffffffu, v, o);
        const int oi = __shfl_xor_sync(0xffffffffu, i, o);
        if (better(ov, oi, v, i)) { v = ov; i = oi; }
    }
}

// The best element ranked strictly below (pv, pi); (+inf, -1) for the first pick.
template <typename T>
__device__ void best_below(const T* row, int n, float pv, int pi, float& v, int& i) {
    v = NEG_INF;
    i = NO_INDEX;
    for (int j = threadIdx.x; j < n; j += blockDim.x) {
        const float x = to_f32(row[j]);
        if (better(pv, pi, x, j) && better(x, j, v, i)) { v = x; i = j; }
    }
    block_best(v, i);
}

#define SAMPLING_KERNELS(suffix, T)                                                                     \
    extern "C" __global__ void argmax_##suffix(const T* logits, long long stride, int n, int* out) {   \
        float v;                                                                                        \
        int i;                                                                                          \
        best_below<T>(logits + blockIdx.x * stride, n, __int_as_float(0x7f800000), -1, v, i);           \
        if (threadIdx.x == 0) out[blockIdx.x] = i;                                                      \
    }                                                                                                   \
    extern "C" __global__ void top_logprobs_##suffix(const T* logits, long long stride, int n, int k,  \
                                                     float* values, int* indices) {                     \
        const T* row = logits + blockIdx.x * stride;                                                    \
        float v;                                                                                        \
        int i;                                                                                          \
        best_below<T>(row, n, __int_as_float(0x7f800000), -1, v, i);                                    \
        const float mx = v;                                                                             \
        float se = 0.f;                                                                                 \
        for (int j = threadIdx.x; j < n; j += blockDim.x) se += expf(to_f32(row[j]) - mx);              \
        const float lse = mx + logf(block_sum(se));                                                     \
        for (int r = 0; r < k; ++r) {                                                                   \
            if (r > 0) best_below<T>(row, n, v, i, v, i);                                               \
            if (threadIdx.x == 0) {                                                                     \
                values[(long long)blockIdx.x * k + r] = v - lse;                                        \
                indices[(long long)blockIdx.x * k + r] = i;                                             \
            }                                                                                           \
        }                                                                                               \
    }

FOR_EACH_DTYPE(SAMPLING_KERNELS)
