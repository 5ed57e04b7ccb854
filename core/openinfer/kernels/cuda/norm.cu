// RMSNorm over the last axis, plain and with the residual add fused in; weights of the activation
// type or float32 (FOR_EACH_NORM_DTYPE). One block per row;
// the second pass re-reads the row (L1/L2 hits) rather than holding it in shared memory, so any
// hidden size works.
#include "common.cuh"

template <typename T, typename W>
__device__ void rms_norm_row(const T* __restrict__ x, const W* __restrict__ w, T* __restrict__ out,
                             int n, float eps) {
    float ss = 0.f;
    for (int i = threadIdx.x; i < n; i += blockDim.x) { float v = to_f32(x[i]); ss += v * v; }
    const float inv = 1.f / sqrtf(block_sum(ss) / n + eps);
    for (int i = threadIdx.x; i < n; i += blockDim.x) out[i] = from_f32<T>(to_f32(x[i]) * inv * to_f32(w[i]));
}

// residual = residual + x (rounded to T, as it is stored), out = rms_norm(residual) * w.
template <typename T, typename W>
__device__ void add_rms_norm_row(const T* __restrict__ x, T* __restrict__ residual, const W* __restrict__ w,
                                 T* __restrict__ out, int n, float eps) {
    float ss = 0.f;
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
        const T r = from_f32<T>(to_f32(x[i]) + to_f32(residual[i]));
        residual[i] = r;
        const float v = to_f32(r);
        ss += v * v;
    }
    const float inv = 1.f / sqrtf(block_sum(ss) / n + eps);
    // each thread re-reads only the elements it wrote itself, so no barrier is needed
    for (int i = threadIdx.x; i < n; i += blockDim.x) out[i] = from_f32<T>(to_f32(residual[i]) * inv * to_f32(w[i]));
}

#define NORM_KERNELS(suffix, T, W)                                                                       \
    extern "C" __global__ void rms_norm_##suffix(const T* x, long long x_stride, const W* w, T* out,      \
                                                 int n, float eps) {                                     \
        rms_norm_row<T, W>(x + blockIdx.x * x_stride, w, out + (long long)blockIdx.x * n, n, eps);       \
    }                                                                                                     \
    extern "C" __global__ void add_rms_norm_##suffix(const T* x, long long x_stride, T* residual,         \
                                                     long long r_stride, const W* w, T* out, int n,       \
                                                     float eps) {                                         \
        add_rms_norm_row<T, W>(x + blockIdx.x * x_stride, residual + blockIdx.x * r_stride, w,            \
                               out + (long long)blockIdx.x * n, n, eps);                                  \
    }

FOR_EACH_NORM_DTYPE(NORM_KERNELS)
