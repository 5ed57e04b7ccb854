// Row RMSNorm device code, shared by norm.cu's kernels and the GEMV epilogue (gemv.cu): one block per
// row; the second pass re-reads the row (L1/L2 hits) rather than holding it in shared memory, so any
// hidden size works.
#pragma once
#include "common.cuh"

// out = x * inv * w over the block's row; V elements per thread per iteration: 1 (any n) or VEC<T> (n,
// strides and pointers a whole 16-byte word).
template <int V, typename T, typename W>
__device__ void scale_row(const T* __restrict__ x, const W* __restrict__ w, T* __restrict__ out, int n, float inv) {
    float f[V], g[V];
    for (int i = threadIdx.x * V; i < n; i += blockDim.x * V) {
        load_f32<V>(x + i, f);
        load_f32<V>(w + i, g);
#pragma unroll
        for (int j = 0; j < V; ++j) f[j] = f[j] * inv * g[j];
        store_f32<V>(out + i, f);
    }
}

template <int V, typename T, typename W>
__device__ void rms_norm_row(const T* __restrict__ x, const W* __restrict__ w, T* __restrict__ out,
                             int n, float eps) {
    float ss = 0.f, f[V];
    for (int i = threadIdx.x * V; i < n; i += blockDim.x * V) {
        load_f32<V>(x + i, f);
#pragma unroll
        for (int j = 0; j < V; ++j) ss += f[j] * f[j];
    }
    scale_row<V>(x, w, out, n, 1.f / sqrtf(block_sum(ss) / n + eps));
}

// residual = residual + x (rounded to T, as it is stored), out = rms_norm(residual) * w. X_L2: x is read
// through L2 only (whole words), for an x that other blocks of the running grid wrote.
template <int V, typename T, typename W, bool X_L2 = false>
__device__ void add_rms_norm_row(const T* __restrict__ x, T* __restrict__ residual, const W* __restrict__ w,
                                 T* __restrict__ out, int n, float eps) {
    float ss = 0.f, f[V], g[V];
    for (int i = threadIdx.x * V; i < n; i += blockDim.x * V) {
        load_f32<V, X_L2>(x + i, f);
        load_f32<V>(residual + i, g);
#pragma unroll
        for (int j = 0; j < V; ++j) {
            f[j] = to_f32(from_f32<T>(f[j] + g[j]));
            ss += f[j] * f[j];
        }
        store_f32<V>(residual + i, f);
    }
    // each thread re-reads only the elements it wrote itself, so no barrier is needed
    scale_row<V>(residual, w, out, n, 1.f / sqrtf(block_sum(ss) / n + eps));
}
