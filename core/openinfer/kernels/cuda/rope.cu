// Rotate-half RoPE on the first 2*half dims of every q and k head, optionally preceded by a
// per-head RMSNorm (Qwen3's QK-norm; weights of the activation type or float32) so the head is
// read once and written once. Dims past 2*half pass through (partial rotary: Qwen3.5 turns 64 of 256).
// One group of LANES lanes per (token, head); groups [0, T*nh) take q heads, the rest k heads.
// rope_write_kv also stores each k head straight into its paged-cache slot and copies v there
// (groups past the k heads), which saves the separate write_kv launch of every layer.
//
// Two variants (ops.py picks): name_<suffix> has a warp per head moving one element per lane
// access; name_v_<suffix> has 32 / VEC<T> lanes per head moving whole 16-byte words (d % 32 == 0,
// half a whole word, strides and pointers 16-byte aligned), which keeps far more bytes in flight
// per instruction at long prefills. They give the same bits: the same per-element expressions,
// and the sum of squares taken in the scalar order (see head_sumsq_v).
#include "common.cuh"

// One rotation pair, shared by both variants. Rounded intrinsics, because the compiler contracts a plain
// a * c - b * s into an FMA one way or the other depending on the surrounding code, and the variants
// must give the same bits (measured: 1-ulp differences in float32 without them).
__device__ __forceinline__ void rotate(float& a, float& b, float c, float s) {
    const float x = __fsub_rn(__fmul_rn(a, c), __fmul_rn(b, s)), y = __fadd_rn(__fmul_rn(b, c), __fmul_rn(a, s));
    a = x;
    b = y;
}

template <typename T, typename W>
__device__ void norm_rope_head(const T* __restrict__ x, T* __restrict__ out, const W* __restrict__ w,
                               float eps, int d, const float* __restrict__ c, const float* __restrict__ s,
                               int half) {
    const int lane = threadIdx.x & 31;
    float inv = 1.f;
    if (w != nullptr) {
        float ss = 0.f;
        for (int i = lane; i < d; i += 32) { float v = to_f32(x[i]); ss = __fmaf_rn(v, v, ss); }
        inv = 1.f / sqrtf(warp_sum(ss) / d + eps);
    }
    // the head is read fully above before any lane writes, so out may alias x
    __syncwarp();
    for (int p = lane; p < half; p += 32) {
        float a = to_f32(x[p]) * inv, b = to_f32(x[p + half]) * inv;
        if (w != nullptr) { a *= to_f32(w[p]); b *= to_f32(w[p + half]); }
        rotate(a, b, c[p], s[p]);
        out[p] = from_f32<T>(a);
        out[p + half] = from_f32<T>(b);
    }
    for (int i = 2 * half + lane; i < d; i += 32) {
        float v = to_f32(x[i]) * inv;
        if (w != nullptr) v *= to_f32(w[i]);
        out[i] = from_f32<T>(v);
    }
}

// The scalar kernel's warp_sum of its lanes' sums of squares, by a group of LPH = 32 / E lanes holding
// E-element words: scalar lane l sums elements l, l + 32, ... in turn, and those lie in word l / E + k * LPH,
// slot l % E, so group lane `sub` keeps scalar lanes E * sub .. E * sub + E - 1 as its E partial sums.
// The butterfly's offsets >= E then cross group lanes (a shuffle within the group), the rest stay in
// registers. fp addition is commutative, so every step gives the bits the scalar step gives.
template <typename T>
__device__ __forceinline__ float head_sumsq_v(const T* __restrict__ x, int d, int sub, unsigned int group) {
    constexpr int E = VEC<T>, LPH = 32 / E;
    float ss[E], f[E];
#pragma unroll
    for (int j = 0; j < E; ++j) ss[j] = 0.f;
    for (int i = sub * E; i < d; i += 32) {
        load_f32<E>(x + i, f);
#pragma unroll
        for (int j = 0; j < E; ++j) ss[j] = __fmaf_rn(f[j], f[j], ss[j]);   // as the scalar kernel, explicitly
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        if (o >= E) {
#pragma unroll
            for (int j = 0; j < E; ++j) ss[j] += __shfl_xor_sync(group, ss[j], o / E);
        } else {
            float t[E];
#pragma unroll
            for (int j = 0; j < E; ++j) t[j] = ss[j];
#pragma unroll
            for (int j = 0; j < E; ++j) ss[j] = t[j] + t[j ^ o];
        }
    }
    static_assert(LPH * E == 32, "a group covers the 32 scalar lanes");
    return ss[0];
}

// norm_rope_head in 16-byte words by the LPH lanes of a group (sub = this lane's index in it).
template <typename T, typename W>
__device__ void norm_rope_head_v(const T* __restrict__ x, T* __restrict__ out, const W* __restrict__ w,
                                 float eps, int d, const float* __restrict__ c, const float* __restrict__ s,
                                 int half) {
    constexpr int E = VEC<T>, LPH = 32 / E;
    const int sub = threadIdx.x & (LPH - 1);
    const unsigned int group = ((1u << LPH) - 1u) << ((threadIdx.x & 31) & ~(LPH - 1));
    const float inv = w != nullptr ? 1.f / sqrtf(head_sumsq_v(x, d, sub, group) / d + eps) : 1.f;
    // the group has read the head before any lane writes (without the norm each lane reads only the
    // words it writes), so out may alias x
    __syncwarp(group);
    float a[E], b[E], g[E], cw[E], sw[E];
    for (int p = sub * E; p < half; p += LPH * E) {
        load_f32<E>(x + p, a);
        load_f32<E>(x + p + half, b);
        load_f32<E>(c + p, cw);
        load_f32<E>(s + p, sw);
#pragma unroll
        for (int j = 0; j < E; ++j) { a[j] *= inv; b[j] *= inv; }
        if (w != nullptr) {
            load_f32<E>(w + p, g);
#pragma unroll
            for (int j = 0; j < E; ++j) a[j] *= g[j];
            load_f32<E>(w + p + half, g);
#pragma unroll
            for (int j = 0; j < E; ++j) b[j] *= g[j];
        }
#pragma unroll
        for (int j = 0; j < E; ++j) rotate(a[j], b[j], cw[j], sw[j]);
        store_f32<E>(out + p, a);
        store_f32<E>(out + p + half, b);
    }
    for (int i = 2 * half + sub * E; i < d; i += LPH * E) {
        load_f32<E>(x + i, a);
#pragma unroll
        for (int j = 0; j < E; ++j) a[j] *= inv;
        if (w != nullptr) {
            load_f32<E>(w + i, g);
#pragma unroll
            for (int j = 0; j < E; ++j) a[j] *= g[j];
        }
        store_f32<E>(out + i, a);
    }
}

// Lanes per head: a warp (scalar) or 32 / VEC<T> (16-byte words).
template <bool V, typename T> constexpr int LANES = V ? 32 / VEC<T> : 32;

template <bool V, typename T, typename W>
__device__ __forceinline__ void head_op(const T* x, T* out, const W* w, float eps, int d, const float* c,
                                        const float* s, int half) {
    if constexpr (V) norm_rope_head_v<T, W>(x, out, w, eps, d, c, s, half);
    else norm_rope_head<T, W>(x, out, w, eps, d, c, s, half);
}

template <bool V, typename T, typename W>
__device__ void qk_norm_rope_body(const T* q, long long q_stride, const T* k, long long k_stride, T* q_out,
                                  T* k_out, const W* q_w, const W* k_w, float eps, const int* positions,
                                  const float* cos_t, const float* sin_t, int half, int num_tokens, int nh,
                                  int nkv, int d) {
    pdl_begin();
    const long long head = ((long long)blockIdx.x * blockDim.x + threadIdx.x) / LANES<V, T>;
    const long long nq = (long long)num_tokens * nh;
    if (head >= nq + (long long)num_tokens * nkv) return;
    const bool is_q = head < nq;
    const long long hk = is_q ? head : head - nq;
    const int heads = is_q ? nh : nkv;
    const long long t = hk / heads, h = hk % heads;
    const T* src = (is_q ? q + t * q_stride : k + t * k_stride) + h * d;
    T* dst = (is_q ? q_out : k_out) + hk * d;
    const long long row = (long long)positions[t] * half;
    head_op<V, T, W>(src, dst, is_q ? q_w : k_w, eps, d, cos_t + row, sin_t + row, half);
}

#define ROPE_VARIANT(name, V, T, W)                                                                        \
    extern "C" __global__ void qk_norm_rope_##name(                                                        \
        const T* q, long long q_stride, const T* k, long long k_stride, T* q_out, T* k_out,                \
        const W* q_w, const W* k_w, float eps, const int* positions, const float* cos_t,                   \
        const float* sin_t, int half, int num_tokens, int nh, int nkv, int d) {                            \
        qk_norm_rope_body<V, T, W>(q, q_stride, k, k_stride, q_out, k_out, q_w, k_w, eps, positions,       \
                                   cos_t, sin_t, half, num_tokens, nh, nkv, d);                            \
    }
#define ROPE_KERNELS(suffix, T, W) ROPE_VARIANT(suffix, false, T, W) ROPE_VARIANT(v_##suffix, true, T, W)

FOR_EACH_NORM_DTYPE(ROPE_KERNELS)

// The caches are [num_blocks, block_size, nkv, d] views with an arbitrary block stride (kv.cu's
// layout); a negative slot (a padded token) stores nothing.
template <bool V, typename T>
__device__ void rope_write_kv_body(const T* q, long long q_stride, const T* k, long long k_stride, const T* v,
                                   long long v_stride, T* q_out, T* k_cache, T* v_cache, long long block_stride,
                                   int block_size, const long long* slots, const T* q_w, const T* k_w, float eps,
                                   const int* positions, const float* cos_t, const float* sin_t, int half,
                                   int num_tokens, int nh, int nkv, int d) {
    pdl_begin();
    constexpr int L = LANES<V, T>;
    const long long head = ((long long)blockIdx.x * blockDim.x + threadIdx.x) / L;
    const long long nq = (long long)num_tokens * nh, nk = (long long)num_tokens * nkv;
    if (head >= nq + 2 * nk) return;
    if (head < nq) {
        const long long t = head / nh, row = (long long)positions[t] * half;
        head_op<V, T, T>(q + t * q_stride + (head % nh) * d, q_out + head * d, q_w, eps, d, cos_t + row,
                         sin_t + row, half);
        return;
    }
    const bool is_k = head < nq + nk;
    const long long hk = head - nq - (is_k ? 0 : nk), t = hk / nkv, h = hk % nkv;
    const long long slot = slots[t];
    if (slot < 0) return;
    T* dst = (is_k ? k_cache : v_cache) + (slot / block_size) * block_stride +
             (slot % block_size) * (long long)nkv * d + h * d;
    if (is_k) {
        const long long row = (long long)positions[t] * half;
        head_op<V, T, T>(k + t * k_stride + h * d, dst, k_w, eps, d, cos_t + row, sin_t + row, half);
        return;
    }
    const T* src = v + t * v_stride + h * d;
    const int lane = threadIdx.x & (L - 1);
    if constexpr (V) {
        for (int i = lane; i < d / VEC<T>; i += L)
            reinterpret_cast<uint4*>(dst)[i] = reinterpret_cast<const uint4*>(src)[i];
    } else {
        for (int i = lane; i < d; i += L) dst[i] = src[i];
    }
}

#define ROPE_KV_VARIANT(name, V, T)                                                                        \
    extern "C" __global__ void rope_write_kv_##name(                                                       \
        const T* q, long long q_stride, const T* k, long long k_stride, const T* v, long long v_stride,    \
        T* q_out, T* k_cache, T* v_cache, long long block_stride, int block_size, const long long* slots,  \
        const T* q_w, const T* k_w, float eps, const int* positions, const float* cos_t,                   \
        const float* sin_t, int half, int num_tokens, int nh, int nkv, int d) {                            \
        rope_write_kv_body<V, T>(q, q_stride, k, k_stride, v, v_stride, q_out, k_cache, v_cache,           \
                                 block_stride, block_size, slots, q_w, k_w, eps, positions, cos_t, sin_t,  \
                                 half, num_tokens, nh, nkv, d);                                            \
    }
#define ROPE_KV_KERNELS(suffix, T) ROPE_KV_VARIANT(suffix, false, T) ROPE_KV_VARIANT(v_##suffix, true, T)

FOR_EACH_DTYPE(ROPE_KV_KERNELS)
