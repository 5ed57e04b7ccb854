// Row gathers (embedding lookup, picking the sampled rows) and the SwiGLU activation.
#include "common.cuh"

// dst[r] = src[ids[r]] (grid.x = r) for rows of `units` copy units of type U; dtype-agnostic, so the wrapper
// picks the widest unit that divides the row and keeps every access aligned.
#define GATHER_KERNEL(suffix, U)                                                                      \
    extern "C" __global__ void gather_rows_##suffix(const U* src, long long src_stride, const int* ids, \
                                                    U* dst, int units) {                              \
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
#define SILU_KERNEL(suffix, T)                                                                         \
    extern "C" __global__ void silu_mul_##suffix(const T* gate_up, long long stride, T* out, int inter) { \
        const T* g = gate_up + blockIdx.x * stride;                                                    \
        T* o = out + (long long)blockIdx.x * inter;                                                    \
        for (int i = blockIdx.y * blockDim.x + threadIdx.x; i < inter; i += gridDim.y * blockDim.x) {  \
            const float x = to_f32(g[i]), up = to_f32(g[inter + i]);                                   \
            o[i] = from_f32<T>(x / (1.f + expf(-x)) * up);                                             \
        }                                                                                              \
    }

FOR_EACH_DTYPE(SILU_KERNEL)
