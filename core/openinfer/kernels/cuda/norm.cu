// RMSNorm over the last axis, plain and with the residual add fused in; weights of the activation
// type or float32 (FOR_EACH_NORM_DTYPE). One block per row.
#include "common.cuh"

// The rows are latency-bound at decode (one block per row): each thread keeps its first V elements (and their
// weights, loaded before griddepcontrol.wait: no kernel of the step writes them) in registers across the block
// sum, so a row the block covers in one pass is not read again; later passes re-read theirs (L1/L2 hits),
// so any hidden size works. Every pass does the same arithmetic in the same order: the same bits.
template <int V, typename W>
__device__ __forceinline__ void load_first_weights(const W* __restrict__ w, int n, float* g) {
    const int i = threadIdx.x * V;
    if (i < n) load_f32<V>(w + i, g);
}

// out = x * inv * w over the block's row; f, g: the thread's first V elements and weights, already loaded.
template <int V, typename T, typename W>
__device__ void scale_row(const T* __restrict__ x, const W* __restrict__ w, T* __restrict__ out, int n, float inv,
                          const float* f0, const float* g0) {
    float f[V], g[V];
    for (int i = threadIdx.x * V; i < n; i += blockDim.x * V) {
        if (i == threadIdx.x * V) {
#pragma unroll
            for (int j = 0; j < V; ++j) { f[j] = f0[j]; g[j] = g0[j]; }
        } else {
            load_f32<V>(x + i, f);
            load_f32<V>(w + i, g);
        }
#pragma unroll
        for (int j = 0; j < V; ++j) f[j] = f[j] * inv * g[j];
        store_f32<V>(out + i, f);
    }
}

template <int V, typename T, typename W>
__device__ void rms_norm_row(const T* __restrict__ x, const W* __restrict__ w, T* __restrict__ out,
                             int n, float eps) {
    float ss = 0.f, f[V], f0[V], g0[V];
    load_first_weights<V>(w, n, g0);
    pdl_begin();
    for (int i = threadIdx.x * V; i < n; i += blockDim.x * V) {
        load_f32<V>(x + i, f);
#pragma unroll
        for (int j = 0; j < V; ++j) ss += f[j] * f[j];
        if (i == threadIdx.x * V) {
#pragma unroll
            for (int j = 0; j < V; ++j) f0[j] = f[j];
        }
    }
    scale_row<V>(x, w, out, n, 1.f / sqrtf(block_sum(ss) / n + eps), f0, g0);
}

// residual = residual + x (rounded to T, as it is stored), out = rms_norm(residual) * w.
template <int V, typename T, typename W>
__device__ void add_rms_norm_row(const T* __restrict__ x, T* __restrict__ residual, const W* __restrict__ w,
                                 T* __restrict__ out, int n, float eps) {
    float ss = 0.f, f[V], g[V], f0[V], g0[V];
    load_first_weights<V>(w, n, g0);
    pdl_begin();
    for (int i = threadIdx.x * V; i < n; i += blockDim.x * V) {
        load_f32<V>(x + i, f);
        load_f32<V>(residual + i, g);
#pragma unroll
        for (int j = 0; j < V; ++j) {
            f[j] = to_f32(from_f32<T>(f[j] + g[j]));
            ss += f[j] * f[j];
        }
        store_f32<V>(residual + i, f);
        if (i == threadIdx.x * V) {
#pragma unroll
            for (int j = 0; j < V; ++j) f0[j] = f[j];
        }
    }
    // each thread re-reads only the elements it wrote itself, so no barrier is needed
    scale_row<V>(residual, w, out, n, 1.f / sqrtf(block_sum(ss) / n + eps), f0, g0);
}

// name_<suffix> moves one element at a time; name_v_<suffix> whole 16-byte words (ops.py picks).
#define NORM_VARIANT(name, V, T, W)                                                                       \
    extern "C" __global__ void rms_norm_##name(const T* x, long long x_stride, const W* w, T* out,       \
                                               int n, float eps) {                                       \
        rms_norm_row<V, T, W>(x + blockIdx.x * x_stride, w, out + (long long)blockIdx.x * n, n, eps);    \
    }                                                                                                     \
    extern "C" __global__ void add_rms_norm_##name(const T* x, long long x_stride, T* residual,           \
                                                   long long r_stride, const W* w, T* out, int n,         \
                                                   float eps) {                                           \
        add_rms_norm_row<V, T, W>(x + blockIdx.x * x_stride, residual + blockIdx.x * r_stride, w,         \
                                  out + (long long)blockIdx.x * n, n, eps);                               \
    }
#define NORM_KERNELS(suffix, T, W) NORM_VARIANT(suffix, 1, T, W) NORM_VARIANT(v_##suffix, VEC<T>, T, W)

FOR_EACH_NORM_DTYPE(NORM_KERNELS)
