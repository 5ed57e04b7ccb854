// The elementwise ops of the Qwen3.5 line: the GDN gating (log-decay g and beta), the GDN output
// norm rms_norm(x) * w * silu(z), and the gated-attention output gate x * sigmoid(gate).
#include "common.cuh"
#include "gdn.cuh"

// a, b [T, nv] (row strides: slices of the fused in_proj output) -> g, beta [T, nv] fp32, packed.
// grid ceil(T * nv / blockDim).
template <typename T>
__device__ void gdn_gating(const T* a, long long a_stride, const T* b, long long b_stride, const float* A_log,
                           const float* dt_bias, float* g, float* beta, int tokens, int nv) {
    const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (long long)tokens * nv) return;
    const long long t = i / nv;
    const int h = (int)(i % nv);
    const float2 gb = gdn_gate(to_f32(a[t * a_stride + h]), to_f32(b[t * b_stride + h]), A_log[h], dt_bias[h]);
    g[i] = gb.x;
    beta[i] = gb.y;
}

// x, z [T, nh, d] (heads packed, any token stride) -> out [T, nh, d] packed; w [d], d <= 32 * GN_PER_LANE.
// One warp per (token, head) row, 4 rows a block. A lane loads its entries of x, z and w at once, into
// registers: one round trip after the wait (a second pass over x, then z and w, took two).
constexpr int GN_PER_LANE = 8;
template <typename T>
__device__ void gated_rms_norm(const T* x, long long x_stride, const T* z, long long z_stride, const T* w,
                               T* out, int rows, int nh, int d, float eps) {
    const int row = blockIdx.x * 4 + (threadIdx.x >> 5), lane = threadIdx.x & 31;
    if (row >= rows) return;
    const long long t = row / nh, h = row % nh;
    const T* xr = x + t * x_stride + h * d;
    const T* zr = z + t * z_stride + h * d;
    T* o = out + (long long)row * d;
    float xv[GN_PER_LANE], zv[GN_PER_LANE], wv[GN_PER_LANE];
#pragma unroll
    for (int u = 0; u < GN_PER_LANE; ++u) {
        const int i = lane + 32 * u;
        xv[u] = i < d ? to_f32(xr[i]) : 0.f;
        zv[u] = i < d ? to_f32(zr[i]) : 0.f;
        wv[u] = i < d ? to_f32(w[i]) : 0.f;
    }
    float ss = 0.f;
#pragma unroll
    for (int u = 0; u < GN_PER_LANE; ++u)
        if (lane + 32 * u < d) ss += xv[u] * xv[u];
    const float inv = 1.f / sqrtf(warp_sum(ss) / d + eps);
#pragma unroll
    for (int u = 0; u < GN_PER_LANE; ++u)
        if (lane + 32 * u < d) o[lane + 32 * u] = from_f32<T>(xv[u] * inv * wv[u] * silu(zv[u]));
}

// x, gate [T, n] (any row strides) -> out [T, n] packed. grid (T, column blocks), a grid-stride loop.
template <typename T>
__device__ void sigmoid_gate(const T* x, long long x_stride, const T* gate, long long g_stride, T* out, int n) {
    const long long t = blockIdx.x;
    for (int i = blockIdx.y * blockDim.x + threadIdx.x; i < n; i += gridDim.y * blockDim.x)
        out[t * n + i] = from_f32<T>(to_f32(x[t * x_stride + i]) / (1.f + expf(-to_f32(gate[t * g_stride + i]))));
}

#define GATE_KERNELS(suffix, T)                                                                                \
    extern "C" __global__ void gdn_gating_##suffix(const T* a, long long a_stride, const T* b,                  \
                                                   long long b_stride, const float* A_log,                     \
                                                   const float* dt_bias, float* g, float* beta, int tokens,    \
                                                   int nv) { pdl_begin();                                       \
        gdn_gating<T>(a, a_stride, b, b_stride, A_log, dt_bias, g, beta, tokens, nv);                           \
    }                                                                                                           \
    extern "C" __global__ void gated_rms_norm_##suffix(const T* x, long long x_stride, const T* z,              \
                                                       long long z_stride, const T* w, T* out, int rows,        \
                                                       int nh, int d, float eps) { pdl_begin();                 \
        gated_rms_norm<T>(x, x_stride, z, z_stride, w, out, rows, nh, d, eps);                                  \
    }                                                                                                           \
    extern "C" __global__ void sigmoid_gate_##suffix(const T* x, long long x_stride, const T* gate,             \
                                                     long long g_stride, T* out, int n) { pdl_begin();          \
        sigmoid_gate<T>(x, x_stride, gate, g_stride, out, n);                                                   \
    }

FOR_EACH_DTYPE(GATE_KERNELS)
