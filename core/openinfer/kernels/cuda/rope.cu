// Rotate-half RoPE on the first 2*half dims of every q and k head, optionally preceded by a
// per-head RMSNorm (Qwen3's QK-norm; weights of the activation type or float32) so the head is
// read once and written once. Dims past 2*half pass through (partial rotary: Qwen3.5 turns 64 of 256).
// One warp per (token, head); warps [0, T*nh) take q heads, the rest k heads.
// rope_write_kv also stores each k head straight into its paged-cache slot and copies v there
// (warps past the k heads), which saves the separate write_kv launch of every layer.
#include "common.cuh"

template <typename T, typename W>
__device__ void norm_rope_head(const T* __restrict__ x, T* __restrict__ out, const W* __restrict__ w,
                               float eps, int d, const float* __restrict__ c, const float* __restrict__ s,
                               int half) {
    const int lane = threadIdx.x & 31;
    float inv = 1.f;
    if (w != nullptr) {
        float ss = 0.f;
        for (int i = lane; i < d; i += 32) { float v = to_f32(x[i]); ss += v * v; }
        inv = 1.f / sqrtf(warp_sum(ss) / d + eps);
    }
    // the head is read fully above before any lane writes, so out may alias x
    __syncwarp();
    for (int p = lane; p < half; p += 32) {
        float a = to_f32(x[p]) * inv, b = to_f32(x[p + half]) * inv;
        if (w != nullptr) { a *= to_f32(w[p]); b *= to_f32(w[p + half]); }
        out[p] = from_f32<T>(a * c[p] - b * s[p]);
        out[p + half] = from_f32<T>(b * c[p] + a * s[p]);
    }
    for (int i = 2 * half + lane; i < d; i += 32) {
        float v = to_f32(x[i]) * inv;
        if (w != nullptr) v *= to_f32(w[i]);
        out[i] = from_f32<T>(v);
    }
}

#define ROPE_KERNELS(suffix, T, W)                                                                         \
    extern "C" __global__ void qk_norm_rope_##suffix(                                                      \
        const T* q, long long q_stride, const T* k, long long k_stride, T* q_out, T* k_out,                \
        const W* q_w, const W* k_w, float eps, const int* positions, const float* cos_t,                   \
        const float* sin_t, int half, int num_tokens, int nh, int nkv, int d) { pdl_begin();               \
        const long long head = (long long)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);           \
        const long long nq = (long long)num_tokens * nh;                                                   \
        if (head >= nq + (long long)num_tokens * nkv) return;                                              \
        const bool is_q = head < nq;                                                                       \
        const long long hk = is_q ? head : head - nq;                                                      \
        const int heads = is_q ? nh : nkv;                                                                 \
        const long long t = hk / heads, h = hk % heads;                                                    \
        const T* src = (is_q ? q + t * q_stride : k + t * k_stride) + h * d;                               \
        T* dst = (is_q ? q_out : k_out) + hk * d;                                                          \
        const long long row = (long long)positions[t] * half;                                              \
        norm_rope_head<T, W>(src, dst, is_q ? q_w : k_w, eps, d, cos_t + row, sin_t + row, half);          \
    }

FOR_EACH_NORM_DTYPE(ROPE_KERNELS)

// The caches are [num_blocks, block_size, nkv, d] views with an arbitrary block stride (kv.cu's
// layout); a negative slot (a padded token) stores nothing.
#define ROPE_KV_KERNELS(suffix, T)                                                                        \
    extern "C" __global__ void rope_write_kv_##suffix(                                                     \
        const T* q, long long q_stride, const T* k, long long k_stride, const T* v, long long v_stride,    \
        T* q_out, T* k_cache, T* v_cache, long long block_stride, int block_size, const long long* slots,  \
        const T* q_w, const T* k_w, float eps, const int* positions, const float* cos_t,                   \
        const float* sin_t, int half, int num_tokens, int nh, int nkv, int d) { pdl_begin();               \
        const long long head = (long long)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);           \
        const long long nq = (long long)num_tokens * nh, nk = (long long)num_tokens * nkv;                 \
        if (head >= nq + 2 * nk) return;                                                                   \
        if (head < nq) {                                                                                   \
            const long long t = head / nh, row = (long long)positions[t] * half;                           \
            norm_rope_head<T>(q + t * q_stride + (head % nh) * d, q_out + head * d, q_w, eps, d,           \
                              cos_t + row, sin_t + row, half);                                             \
            return;                                                                                        \
        }                                                                                                  \
        const bool is_k = head < nq + nk;                                                                  \
        const long long hk = head - nq - (is_k ? 0 : nk), t = hk / nkv, h = hk % nkv;                      \
        const long long slot = slots[t];                                                                   \
        if (slot < 0) return;                                                                              \
        T* dst = (is_k ? k_cache : v_cache) + (slot / block_size) * block_stride +                         \
                 (slot % block_size) * (long long)nkv * d + h * d;                                         \
        if (is_k) {                                                                                        \
            const long long row = (long long)positions[t] * half;                                          \
            norm_rope_head<T>(k + t * k_stride + h * d, dst, k_w, eps, d, cos_t + row, sin_t + row, half); \
        } else {                                                                                           \
            const T* src = v + t * v_stride + h * d;                                                       \
            for (int i = threadIdx.x & 31; i < d; i += 32) dst[i] = src[i];                                \
        }                                                                                                  \
    }

FOR_EACH_DTYPE(ROPE_KV_KERNELS)
