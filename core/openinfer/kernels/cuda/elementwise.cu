// Row gathers (embedding lookup, picking the sampled rows) and the SwiGLU activation.
#include "common.cuh"

// dst[r] = src[ids[r]] (grid.x = r) for rows of `units` copy units of type U; dtype-agnostic, so the wrapper
// picks the widest unit that divides the row and keeps every access aligned.
#define GATHER_KERNEL(suffix, U)                                                                      \
    extern "C" __global__ void gather_rows_##suffix(const U* src, long long src_stride, const int* ids, \
                                                    U* dst, int units) { pdl_begin();                 \
        const U* row = src + ids[blockIdx.x] * src_stride;                                            \
        U* out = dst + (long long)blockIdx.x * units;                                                 \
        for (int i = blockIdx.y * blockDim.x + threadIdx.x; i < units; i += gridDim.y * blockDim.x)   \
            out[i] = row[i];                                                                          \
    }

GATHER_KERNEL(u16, uint4)
GATHER_KERNEL(u4, unsigned int)
GATHER_KERNEL(u2, unsigned short)
GATHER_KERNEL(u1, unsigned char)

// out[t, i] = silu(gate_up[t, i]) * gate_up[t, inter + i]; grid.x walks tokens (no 65535 cap there).
// V elements per thread per iteration: 1, or VEC<T> where inter, the stride and the pointers allow 16-byte words.
template <int V, typename T>
__device__ void silu_mul_row(const T* __restrict__ g, T* __restrict__ o, int inter) {
    float x[V], up[V];
    for (int i = (blockIdx.y * blockDim.x + threadIdx.x) * V; i < inter; i += gridDim.y * blockDim.x * V) {
        load_f32<V>(g + i, x);
        load_f32<V>(g + inter + i, up);
#pragma unroll
        for (int j = 0; j < V; ++j) x[j] = silu_mul_f32(x[j], up[j]);
        store_f32<V>(o + i, x);
    }
}

#define SILU_VARIANT(name, V, T)                                                                       \
    extern "C" __global__ void silu_mul_##name(const T* gate_up, long long stride, T* out, int inter) { pdl_begin(); \
        silu_mul_row<V, T>(gate_up + blockIdx.x * stride, out + (long long)blockIdx.x * inter, inter);  \
    }
#define SILU_KERNEL(suffix, T) SILU_VARIANT(suffix, 1, T) SILU_VARIANT(v_##suffix, VEC<T>, T)

FOR_EACH_DTYPE(SILU_KERNEL)
