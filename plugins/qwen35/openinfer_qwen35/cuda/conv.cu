// Causal depthwise conv1d + SiLU of the Gated DeltaNet over varlen runs. The conv state
// [R, K-1, C] (fp32, time-major, any row stride) holds the last K-1 inputs before a run.
// Prefill is two launches: the conv reads the old state rows, then conv_state_save overwrites
// them (in one kernel, a block at a run's end could overwrite a row a block at its start still reads);
// a checkpoint part-way through a run (kv/hybrid.py) is one more conv_state_save, before the last.
#include "common.cuh"
#include "gdn.cuh"

constexpr int CONV_K = 4;   // the conv width of every Qwen3.5 / Qwen3-Next checkpoint
constexpr int CONV_TOK = 16; // tokens per thread in prefill: the K-1 inputs of the window are re-read once per 16

template <typename T>
__device__ __forceinline__ void load_weights(const T* w, int c, float* wk) {
#pragma unroll
    for (int j = 0; j < CONV_K; ++j) wk[j] = to_f32(w[c * CONV_K + j]);
}

// grid (ceil(C / blockDim), ceil(max_query_len / CONV_TOK), B): thread = one channel, CONV_TOK tokens.
template <typename T>
__device__ void conv_prefill(const T* x, long long x_stride, const T* w, const float* state, long long state_stride,
                             const int* slots, const int* query_start, const int* context_lens, T* out, int C) {
    const int c = blockIdx.x * blockDim.x + threadIdx.x, b = blockIdx.z;
    const int s = query_start[b], n = query_start[b + 1] - s, t0 = blockIdx.y * CONV_TOK;
    if (c >= C || t0 >= n) return;
    const bool live = has_state(query_start, context_lens, b);
    const float* row = state + (long long)slots[b] * state_stride;
    float wk[CONV_K], win[CONV_K];
    load_weights(w, c, wk);
#pragma unroll
    for (int j = 0; j < CONV_K - 1; ++j) {   // the inputs at t0-K+1 .. t0-1
        const int p = t0 - (CONV_K - 1) + j;
        win[j] = p >= 0 ? to_f32(x[(s + p) * x_stride + c]) : (live ? row[(CONV_K - 1 + p) * C + c] : 0.f);
    }
    const int t1 = min(t0 + CONV_TOK, n);
    for (int t = t0; t < t1; ++t) {
        win[CONV_K - 1] = to_f32(x[(s + t) * x_stride + c]);
        float acc = 0.f;
#pragma unroll
        for (int j = 0; j < CONV_K; ++j) acc += wk[j] * win[j];
        out[(long long)(s + t) * C + c] = from_f32<T>(silu(acc));
#pragma unroll
        for (int j = 0; j < CONV_K - 1; ++j) win[j] = win[j + 1];
    }
}

// grid (ceil(C / blockDim), B): the state row becomes the last K-1 inputs up to the run's end
// (with a run shorter than K-1, partly the old row shifted, read before any write). With
// `ckpt_lens` (else null), a checkpoint part-way instead: row ckpt_rows[b] gets the last K-1 inputs
// before run position ckpt_lens[b] (0: none), launched before the slot rows it may read change.
template <typename T>
__device__ void conv_state_save(const T* x, long long x_stride, float* state, long long state_stride,
                                const int* slots, const int* query_start, const int* context_lens,
                                const int* ckpt_lens, const int* ckpt_rows, int C) {
    pdl_begin();
    const int c = blockIdx.x * blockDim.x + threadIdx.x, b = blockIdx.y;
    const int s = query_start[b], n = ckpt_lens != nullptr ? ckpt_lens[b] : query_start[b + 1] - s;
    if (c >= C || n == 0) return;
    const bool live = has_state(query_start, context_lens, b);
    const float* old = state + (long long)slots[b] * state_stride;
    float* row = state + (long long)(ckpt_lens != nullptr ? ckpt_rows[b] : slots[b]) * state_stride;
    float keep[CONV_K - 1];
#pragma unroll
    for (int i = 0; i < CONV_K - 1; ++i) {
        const int p = n - (CONV_K - 1) + i;   // position in the run of new state entry i
        keep[i] = p >= 0 ? to_f32(x[(s + p) * x_stride + c]) : (live ? old[(CONV_K - 1 + p) * C + c] : 0.f);
    }
#pragma unroll
    for (int i = 0; i < CONV_K - 1; ++i) row[i * C + c] = keep[i];
}

// grid (ceil(C / blockDim), B), one token per sequence (decode): x row b, state shifted in place.
template <typename T>
__device__ void conv_update(const T* x, long long x_stride, const T* w, float* state, long long state_stride,
                            const int* slots, const int* query_start, const int* context_lens, T* out, int C) {
    const int c = blockIdx.x * blockDim.x + threadIdx.x, b = blockIdx.y;
    if (c >= C) return;
    const bool live = has_state(query_start, context_lens, b);
    float* row = state + (long long)slots[b] * state_stride;
    float wk[CONV_K], win[CONV_K];
    // the weights and this layer's state row (last written by this kernel a step ago) are read before
    // griddepcontrol.wait, under PDL while the in_proj GEMV drains; x, that GEMV's output, after it
    load_weights(w, c, wk);
#pragma unroll
    for (int j = 0; j < CONV_K - 1; ++j) win[j] = live ? row[j * C + c] : 0.f;
    pdl_begin();
    win[CONV_K - 1] = to_f32(x[b * x_stride + c]);
    float acc = 0.f;
#pragma unroll
    for (int j = 0; j < CONV_K; ++j) acc += wk[j] * win[j];
    out[(long long)b * C + c] = from_f32<T>(silu(acc));
#pragma unroll
    for (int j = 0; j < CONV_K - 1; ++j) row[j * C + c] = win[j + 1];
}

#define CONV_KERNELS(suffix, T)                                                                               \
    extern "C" __global__ void conv_prefill_##suffix(const T* x, long long x_stride, const T* w,               \
                                                     const float* state, long long state_stride,              \
                                                     const int* slots, const int* qs, const int* ctx, T* out, \
                                                     int C) { pdl_begin();                                     \
        conv_prefill<T>(x, x_stride, w, state, state_stride, slots, qs, ctx, out, C);                          \
    }                                                                                                          \
    extern "C" __global__ void conv_state_save_##suffix(const T* x, long long x_stride, float* state,          \
                                                        long long state_stride, const int* slots,              \
                                                        const int* qs, const int* ctx, const int* ckpt_lens,   \
                                                        const int* ckpt_rows, int C) {                         \
        conv_state_save<T>(x, x_stride, state, state_stride, slots, qs, ctx, ckpt_lens, ckpt_rows, C);         \
    }                                                                                                          \
    extern "C" __global__ void conv_update_##suffix(const T* x, long long x_stride, const T* w, float* state,   \
                                                    long long state_stride, const int* slots, const int* qs,  \
                                                    const int* ctx, T* out, int C) {                           \
        conv_update<T>(x, x_stride, w, state, state_stride, slots, qs, ctx, out, C);                           \
    }

FOR_EACH_DTYPE(CONV_KERNELS)
