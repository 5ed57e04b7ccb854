// RMSNorm over the last axis, plain and with the residual add fused in; weights of the activation
// type or float32 (FOR_EACH_NORM_DTYPE). One block per row (the row code is in norm.cuh).
#include "norm.cuh"

// name_<suffix> moves one element at a time; name_v_<suffix> whole 16-byte words (ops.py picks).
#define NORM_VARIANT(name, V, T, W)                                                                       \
    extern "C" __global__ void rms_norm_##name(const T* x, long long x_stride, const W* w, T* out,       \
                                               int n, float eps) { pdl_begin();                          \
        rms_norm_row<V, T, W>(x + blockIdx.x * x_stride, w, out + (long long)blockIdx.x * n, n, eps);    \
    }                                                                                                     \
    extern "C" __global__ void add_rms_norm_##name(const T* x, long long x_stride, T* residual,           \
                                                   long long r_stride, const W* w, T* out, int n,         \
                                                   float eps) { pdl_begin();                              \
        add_rms_norm_row<V, T, W>(x + blockIdx.x * x_stride, residual + blockIdx.x * r_stride, w,         \
                                  out + (long long)blockIdx.x * n, n, eps);                               \
    }
#define NORM_KERNELS(suffix, T, W) NORM_VARIANT(suffix, 1, T, W) NORM_VARIANT(v_##suffix, VEC<T>, T, W)

FOR_EACH_NORM_DTYPE(NORM_KERNELS)
