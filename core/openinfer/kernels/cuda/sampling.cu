// On-device sampling helpers over [S, vocab] logits: greedy argmax and top-k log-probabilities.
// Order is (value descending, index ascending), so ties pick the lowest index as numpy's argmax
// does, and top-k takes k passes that each find the best element ranked below the previous pick:
// no sort, and k is small (OpenAI allows at most 20).
#include "common.cuh"
#include "block_best.cuh"

// The best element of row[begin, end) ranked strictly below (pv, pi); (+inf, -1) for the first pick.
template <typename T>
__device__ void best_below(const T* row, int begin, int end, float pv, int pi, float& v, int& i) {
    v = NEG_INF;
    i = NO_INDEX;
    for (int j = begin + threadIdx.x; j < end; j += blockDim.x) {
        const float x = to_f32(row[j]);
        if (better(pv, pi, x, j) && better(x, j, v, i)) { v = x; i = j; }
    }
    block_best(v, i);
}

// The same over a candidate list (values cv, their indices ci).
__device__ void best_below_list(const float* cv, const int* ci, int m, float pv, int pi, float& v, int& i) {
    v = NEG_INF;
    i = NO_INDEX;
    for (int j = threadIdx.x; j < m; j += blockDim.x)
        if (better(pv, pi, cv[j], ci[j]) && better(cv[j], ci[j], v, i)) { v = cv[j]; i = ci[j]; }
    block_best(v, i);
}

// Two stages, so a row is spread over many blocks: stage 1 (grid: chunks x rows) reduces a chunk
// of `chunk` logits to candidates, stage 2 (grid: rows) merges a row's candidates.
#define SAMPLING_KERNELS(suffix, T)                                                                        \
    extern "C" __global__ void argmax_chunks_##suffix(const T* logits, long long stride, int n, int chunk,  \
                                                      float* cv, int* ci) { pdl_begin();                   \
        const int c = blockIdx.x, begin = c * chunk;                                                       \
        float v;                                                                                           \
        int i;                                                                                             \
        best_below<T>(logits + blockIdx.y * stride, begin, min(n, begin + chunk), POS_INF, -1, v, i);      \
        if (threadIdx.x == 0) { cv[blockIdx.y * gridDim.x + c] = v; ci[blockIdx.y * gridDim.x + c] = i; }  \
    }                                                                                                      \
    /* per chunk: its max, sum(exp(x - max)), and its top k (value, index) */                              \
    extern "C" __global__ void top_logprobs_chunks_##suffix(const T* logits, long long stride, int n,      \
                                                            int chunk, int k, float* cm, float* cs,        \
                                                            float* cv, int* ci) { pdl_begin();             \
        const T* row = logits + blockIdx.y * stride;                                                       \
        const int c = blockIdx.x, begin = c * chunk, end = min(n, begin + chunk);                          \
        const long long slot = (long long)blockIdx.y * gridDim.x + c;                                      \
        float v;                                                                                           \
        int i;                                                                                             \
        best_below<T>(row, begin, end, POS_INF, -1, v, i);                                                 \
        const float mx = v;                                                                                \
        float se = 0.f;                                                                                    \
        if (mx != NEG_INF) /* an all -inf chunk adds nothing */                                          \
            for (int j = begin + threadIdx.x; j < end; j += blockDim.x) se += expf(to_f32(row[j]) - mx);   \
        se = block_sum(se);                                                                                \
        if (threadIdx.x == 0) { cm[slot] = mx; cs[slot] = se; }                                            \
        for (int r = 0; r < k; ++r) {                                                                      \
            if (r > 0) best_below<T>(row, begin, end, v, i, v, i);                                         \
            if (threadIdx.x == 0) { cv[slot * k + r] = v; ci[slot * k + r] = i; }                          \
        }                                                                                                  \
    }

FOR_EACH_DTYPE(SAMPLING_KERNELS)

// A scored prompt row (one block each): the logprob of its target token, from the row's top-1 logprob
// (log-sum-exp = its logit - its logprob), and the target's rank, 1 + how many logits are larger.
#define SCORE_KERNELS(suffix, T)                                                                           \
    extern "C" __global__ void score_rows_##suffix(const T* logits, long long stride, int n,              \
                                                   const int* targets, const float* top_v, const int* top_i,\
                                                   int k, float* logprob, int* rank) { pdl_begin();      \
        const T* row = logits + blockIdx.x * stride;                                                       \
        const float xt = to_f32(row[targets[blockIdx.x]]);                                                 \
        float above = 0.f; /* exact: a vocabulary is far below 2^24 */                                     \
        for (int j = threadIdx.x; j < n; j += blockDim.x) above += to_f32(row[j]) > xt ? 1.f : 0.f;       \
        above = block_sum(above);                                                                          \
        if (threadIdx.x == 0) {                                                                            \
            const long long best = (long long)blockIdx.x * k;                                              \
            logprob[blockIdx.x] = xt - (to_f32(row[top_i[best]]) - top_v[best]);                           \
            rank[blockIdx.x] = 1 + (int)above;                                                             \
        }                                                                                                  \
    }

FOR_EACH_DTYPE(SCORE_KERNELS)

extern "C" __global__ void argmax_merge(const float* cv, const int* ci, int chunks, int* out) { pdl_begin();
    float v;
    int i;
    best_below_list(cv + blockIdx.x * chunks, ci + blockIdx.x * chunks, chunks, POS_INF, -1, v, i);
    if (threadIdx.x == 0) out[blockIdx.x] = i;
}

// log-sum-exp from the chunk partials, then the row's top k among chunks * k candidates.
extern "C" __global__ void top_logprobs_merge(const float* cm, const float* cs, const float* cv, const int* ci,
                                              int chunks, int k, float* values, int* indices) { pdl_begin();
    const long long r0 = (long long)blockIdx.x * chunks;
    float mx = NEG_INF;
    for (int c = 0; c < chunks; ++c) mx = fmaxf(mx, cm[r0 + c]);
    float se = 0.f;
    for (int c = threadIdx.x; c < chunks; c += blockDim.x) se += cs[r0 + c] > 0.f ? cs[r0 + c] * expf(cm[r0 + c] - mx) : 0.f;
    const float lse = mx + logf(block_sum(se));
    float v = POS_INF;
    int i = -1;
    for (int r = 0; r < k; ++r) {
        best_below_list(cv + r0 * k, ci + r0 * k, chunks * k, v, i, v, i);
        if (threadIdx.x == 0) {
            values[(long long)blockIdx.x * k + r] = v - lse;
            indices[(long long)blockIdx.x * k + r] = i;
        }
    }
}
