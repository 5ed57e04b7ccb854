// The device sampler over the sampled rows of a step's [*, vocab] logits; sampling/reference.py
// is its numpy twin and documents the pipeline. Launch order (kernels/cuda/sampler.py):
//   sampling_rows_<T>  logits row params[ROW] -> float32 work row
//   apply_edits        penalties, logit_bias and min_tokens blocks (sampling/batch.py)
//   (top_logprobs over the work rows that ask for alternatives)
//   sample_rows_<T>    one block a row: argmax, or top-k/top-p/min-p then a Philox draw
// Top-k and top-p keep a prefix of the (e descending, index ascending) order, found without a
// sort by a 4-pass radix select over the bits of e (8 bits a pass, counts and fixed-point masses
// per bin, summed with integer atomics so the cut is deterministic), then a scan over the tied
// key for the index where the prefix ends. The draw is the exponential race argmax(e_j / E_j).
#include "common.cuh"
#include "block_best.cuh"
#include "philox.cuh"

// columns of the params rows (sampling/batch.py)
enum { ROW, LOGPROBS, TEMPERATURE, TOP_P, MIN_P, TOP_K, KEY_LO, KEY_HI, STREAM_LO, STREAM_HI, STEP, EDIT_BEGIN,
       EDIT_END, NUM_FIELDS = 16 };
#define SAMPLE_THREADS 512
#define BINS 256
#define NO_LIMIT 0xffffffffffffffffull

// x -> (x > 0 ? x / rep : x * rep) - sub + bias; e = [token, rep, sub, bias] (floats as bits)
__device__ __forceinline__ float edit(float x, const int* e) {
    const float rep = __int_as_float(e[1]);
    if (rep != 1.f) x = x > 0.f ? x / rep : x * rep;
    return (x - __int_as_float(e[2])) + __int_as_float(e[3]);
}

// e >= 0, so its bits order like its value; the complement ranks the largest first
__device__ __forceinline__ unsigned int rank_key(float e) { return ~__float_as_uint(e); }
// e * 2^40 is exact in float32 (e <= 1); truncation makes the fixed-point mass
__device__ __forceinline__ unsigned long long mass_of(float e) { return (unsigned long long)(e * 1099511627776.0f); }

__device__ unsigned long long block_sum_u64(unsigned long long v) {
    __shared__ unsigned long long partial[32];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    __syncthreads();
    if (lane == 0) partial[warp] = v;
    __syncthreads();
    v = lane < nwarps ? partial[lane] : 0ull;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

extern "C" __global__ void apply_edits(float* work, int n, const int* params, const int* edits) { pdl_begin();
    const int* p = params + blockIdx.x * NUM_FIELDS;
    float* row = work + (long long)blockIdx.x * n;
    for (int i = p[EDIT_BEGIN] + threadIdx.x; i < p[EDIT_END]; i += blockDim.x) {  // ids are unique in a row
        const int* e = edits + 4LL * i;
        row[e[0]] = edit(row[e[0]], e);
    }
}

// The last kept element of the (e desc, index asc) order under top-k `k` (1..n) and the top-p mass
// `limit`: a token is kept while fewer than k rank before it and the mass before it is < limit.
// Returns (key, index): kept <=> rank_key(e_j) < key or (== key and j <= index).
__device__ void radix_cut(const float* e, int n, unsigned int k, unsigned long long limit, unsigned int& cut_key,
                          int& cut_index) {
    __shared__ unsigned int count[BINS];
    __shared__ unsigned long long mass[BINS];
    __shared__ unsigned int s_prefix, s_before, s_ties;
    __shared__ unsigned long long s_mass_before;
    __shared__ int s_scan[SAMPLE_THREADS], s_index;
    const int tid = threadIdx.x;
    if (tid == 0) { s_prefix = 0; s_before = 0; s_mass_before = 0; s_index = n; }
    for (int shift = 24; shift >= 0; shift -= 8) {
        const unsigned int mask = shift == 24 ? 0u : 0xffffffffu << (shift + 8);
        for (int b = tid; b < BINS; b += blockDim.x) { count[b] = 0; mass[b] = 0; }
        __syncthreads();
        const unsigned int prefix = s_prefix;
        // whole warps every iteration, so the lanes of a warp that share a bin add their count with
        // one atomic (a low temperature puts most of the row in the e = 0 bin); zero masses add nothing
        for (int base = 0; base < n; base += blockDim.x) {
            const int j = base + tid;
            int b = -1;
            unsigned long long q = 0;
            if (j < n) {
                const float v = e[j];
                const unsigned int key = rank_key(v);
                if ((key & mask) == prefix) { b = (key >> shift) & (BINS - 1); q = mass_of(v); }
            }
            const unsigned int peers = __match_any_sync(0xffffffffu, b);
            if (b >= 0) {
                if (__ffs(peers) - 1 == (tid & 31)) atomicAdd(&count[b], (unsigned int)__popc(peers));
                if (q) atomicAdd(&mass[b], q);
            }
        }
        __syncthreads();
        if (tid == 0) {
            // the first bin holding the cut: it ends the k-th element, or the mass after it reaches
            // the limit; one always does (the counts of all bins reach k <= n)
            unsigned int c = s_before;
            unsigned long long m = s_mass_before;
            int b = 0;
            for (; b < BINS - 1; ++b) {
                if (c + count[b] >= k || m + mass[b] >= limit) break;
                c += count[b];
                m += mass[b];
            }
            s_prefix = prefix | ((unsigned int)b << shift);
            s_before = c;
            s_mass_before = m;
            s_ties = count[b];
        }
        __syncthreads();
    }
    cut_key = s_prefix;
    // how many of the tied elements (equal key, index order) are kept
    const unsigned int ties = s_ties;
    unsigned long long keep = k - s_before;
    const unsigned long long q = mass_of(__uint_as_float(~cut_key));
    if (limit != NO_LIMIT && q) keep = min(keep, (limit - s_mass_before + q - 1) / q);
    if (keep < ties) {
        const int per = (n + blockDim.x - 1) / blockDim.x, lo = min(n, tid * per), hi = min(n, lo + per);
        int mine = 0;
        for (int j = lo; j < hi; ++j) mine += rank_key(e[j]) == cut_key;
        s_scan[tid] = mine;
        __syncthreads();
        if (tid == 0)
            for (int t = 0, run = 0; t < (int)blockDim.x; ++t) { const int c = s_scan[t]; s_scan[t] = run; run += c; }
        __syncthreads();
        const long long before = s_scan[tid];
        if (before < (long long)keep && (long long)keep <= before + mine)
            for (int j = lo, seen = (int)before; j < hi; ++j)
                if (rank_key(e[j]) == cut_key && ++seen == (int)keep) s_index = j;
    }
    __syncthreads();
    cut_index = s_index;
}

// e_j = exp(x_j / T - max / T) in place, filters, then the race; returns the token (every thread)
__device__ int draw(float* x, int n, float m, const int* p) {
    const float T = __int_as_float(p[TEMPERATURE]), my = m / T;
    unsigned long long total = 0;
    for (int j = threadIdx.x; j < n; j += blockDim.x) {
        const float e = (float)exp((double)(x[j] / T - my));
        x[j] = e;
        total += mass_of(e);
    }
    total = block_sum_u64(total);
    const float top_p = __int_as_float(p[TOP_P]), min_p = __int_as_float(p[MIN_P]);
    const unsigned int k = min((unsigned int)p[TOP_K], (unsigned int)n);  // 1..n; n: no top-k
    const unsigned long long limit = top_p >= 1.f ? NO_LIMIT : __double2ull_rz((double)top_p * (double)total);
    unsigned int cut_key = 0xffffffffu;
    int cut_index = n;
    __syncthreads();  // every e is written before the radix passes read them
    if (k < (unsigned int)n || limit != NO_LIMIT) radix_cut(x, n, k, limit, cut_key, cut_index);
    const unsigned int k0 = p[KEY_LO], k1 = p[KEY_HI], s0 = p[STREAM_LO], s1 = p[STREAM_HI], step = p[STEP];
    float best = NEG_INF;
    int bi = NO_INDEX;
    for (int g = threadIdx.x; 4 * g < n; g += blockDim.x) {
        float ev[4];
        bool any = false;
#pragma unroll
        for (int t = 0; t < 4; ++t) {
            const int j = 4 * g + t;
            float v = j < n ? x[j] : 0.f;
            const unsigned int key = rank_key(v);
            if (!(key < cut_key || (key == cut_key && j <= cut_index)) || v < min_p) v = 0.f;
            ev[t] = v;
            any |= v > 0.f;
        }
        if (!any) continue;
        const Philox4 w = philox4x32_10((unsigned int)g, step, s0, s1, k0, k1);
#pragma unroll
        for (int t = 0; t < 4; ++t) {
            if (ev[t] > 0.f) {
                const double u = ((double)(w.v[t] >> 9) + 0.5) * 1.1920928955078125e-07;  // (0, 1)
                const float score = ev[t] / (float)(-log(u));
                if (better(score, 4 * g + t, best, bi)) { best = score; bi = 4 * g + t; }
            }
        }
    }
    block_best(best, bi);
    return bi;
}

#define SAMPLE_KERNELS(suffix, T)                                                                          \
    extern "C" __global__ void sampling_rows_##suffix(const T* logits, long long stride, const int* params, \
                                                      int n, float* work) { pdl_begin();                   \
        const T* row = logits + (long long)params[blockIdx.y * NUM_FIELDS + ROW] * stride;                 \
        float* out = work + (long long)blockIdx.y * n;                                                     \
        for (int j = blockIdx.x * blockDim.x + threadIdx.x; j < n; j += gridDim.x * blockDim.x)            \
            out[j] = to_f32(row[j]);                                                                       \
    }                                                                                                      \
    extern "C" __global__ void __launch_bounds__(SAMPLE_THREADS)                                           \
        sample_rows_##suffix(float* work, int n, const T* logits, long long stride, const int* params,    \
                             const int* edits, int* tokens, float* logprobs) { pdl_begin();                \
        const int* p = params + blockIdx.x * NUM_FIELDS;                                                   \
        float* x = work + (long long)blockIdx.x * n;                                                       \
        float m = NEG_INF;                                                                                 \
        int am = NO_INDEX;                                                                                 \
        for (int j = threadIdx.x; j < n; j += blockDim.x)                                                  \
            if (better(x[j], j, m, am)) { m = x[j]; am = j; }                                              \
        block_best(m, am);                                                                                 \
        const bool want = p[LOGPROBS] >= 0;                                                                \
        float s = 0.f;                                                                                     \
        if (want) {                                                                                        \
            for (int j = threadIdx.x; j < n; j += blockDim.x) s += expf(x[j] - m);                         \
            s = block_sum(s);                                                                              \
        }                                                                                                  \
        const bool greedy = __int_as_float(p[TEMPERATURE]) == 0.f;                                         \
        const int tok = greedy ? am : draw(x, n, m, p);                                                    \
        if (!want) {                                                                                       \
            if (threadIdx.x == 0) tokens[blockIdx.x] = tok;                                                \
            return;                                                                                        \
        }                                                                                                  \
        /* draw() overwrote x with e: the chosen logit is rebuilt from the logits and its edit */          \
        __shared__ float xt;                                                                               \
        if (threadIdx.x == 0) xt = greedy ? m : to_f32(logits[(long long)p[ROW] * stride + tok]);          \
        __syncthreads();                                                                                   \
        if (!greedy)                                                                                       \
            for (int i = p[EDIT_BEGIN] + threadIdx.x; i < p[EDIT_END]; i += blockDim.x)                    \
                if (edits[4LL * i] == tok) xt = edit(xt, edits + 4LL * i);                                 \
        __syncthreads();                                                                                   \
        if (threadIdx.x == 0) {                                                                            \
            tokens[blockIdx.x] = tok;                                                                      \
            logprobs[blockIdx.x] = (xt - m) - logf(s);                                                     \
        }                                                                                                  \
    }

FOR_EACH_DTYPE(SAMPLE_KERNELS)
