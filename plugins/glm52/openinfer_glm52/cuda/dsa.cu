// DeepSeek Sparse Attention as GLM-5.x runs it: the lightning indexer's key write (LayerNorm + RoPE into its
// paged cache), its scores, the exact causal top-k, and absorbed MLA attention over the selected latents.
// The numpy references are ../ops.py; every rule here (selection order, tie rule, masking) is theirs.
//
// Batch layout (openinfer.engine.batch): T tokens of B sequences; sequence i owns tokens query_start[i] ..
// query_start[i+1]-1 and holds context_lens[i] keys after the step, so token j of a run of n sits at
// position L - n + j and sees keys 0 .. L - n + j. Paged caches are layer views [num_blocks, block_size, D]
// with rows packed in a block and any block stride; a key at position s of sequence i lives in block
// block_tables[i * table_stride + s / block_size], row s % block_size.
#include "common.cuh"

// The sequence of token t (binary search over query_start) and the token's position.
__device__ __forceinline__ int2 token_seq_pos(const int* query_start, const int* context_lens, int num_seqs, int t) {
    int lo = 0, hi = num_seqs - 1;
    while (lo < hi) {
        const int mid = (lo + hi + 1) >> 1;
        if (query_start[mid] <= t) lo = mid; else hi = mid - 1;
    }
    const int n = query_start[lo + 1] - query_start[lo];
    return make_int2(lo, context_lens[lo] - n + (t - query_start[lo]));
}

__device__ __forceinline__ long long cache_row(const int* block_tables, int table_stride, int seq, int pos,
                                               int block_size, long long block_stride, int dim) {
    return (long long)block_tables[(long long)seq * table_stride + pos / block_size] * block_stride +
           (long long)(pos % block_size) * dim;
}

// RoPE of element o of a rotated row x (dims 0 .. 2*half-1 turn, the rest pass): interleaved pairs
// (x0, x1), (x2, x3) ... come out as [even..., odd...]; rotate-half pairs (x_i, x_{i+half}) stay in place.
template <typename Load>
__device__ __forceinline__ float rope_at(Load x, int o, int half, const float* c, const float* s, int interleave) {
    if (o >= 2 * half) return x(o);
    const int i = o < half ? o : o - half;
    const float a = x(interleave ? 2 * i : i), b = x(interleave ? 2 * i + 1 : i + half);
    return o < half ? a * c[i] - b * s[i] : b * c[i] + a * s[i];
}

// One token a block: k [dim] -> LayerNorm(eps 1e-6, weight and bias) -> RoPE -> cache at slot_mapping[t] (>= 0);
// q [heads, dim] -> RoPE -> q_out [T, heads, dim] packed. cos/sin [max_pos, half] float32. dim <= 1024.
template <typename T>
__device__ void indexer_rope_write(const T* q, long long q_stride, const T* k, long long k_stride, const T* norm_w,
                                   const T* norm_b, const int* positions, const float* cos, const float* sin, int half,
                                   T* cache, long long block_stride, int block_size, const long long* slot_mapping,
                                   T* q_out, int heads, int dim, int interleave) {
    __shared__ float kn[1024];
    pdl_begin();
    const int t = blockIdx.x;
    const float* c = cos + (long long)positions[t] * half;
    const float* s = sin + (long long)positions[t] * half;
    const T* kr = k + t * k_stride;
    float part = 0.f;
    for (int i = threadIdx.x; i < dim; i += blockDim.x) part += to_f32(kr[i]);
    const float mean = block_sum(part) / dim;
    part = 0.f;
    for (int i = threadIdx.x; i < dim; i += blockDim.x) {
        const float d = to_f32(kr[i]) - mean;
        part += d * d;
    }
    const float inv = rsqrtf(block_sum(part) / dim + 1e-6f);
    for (int i = threadIdx.x; i < dim; i += blockDim.x)
        kn[i] = (to_f32(kr[i]) - mean) * inv * to_f32(norm_w[i]) + to_f32(norm_b[i]);
    __syncthreads();
    const long long slot = slot_mapping[t];
    if (slot >= 0) {   // a negative slot (a padded token) stores nothing, as every KV write kernel does
        T* dst = cache + (slot / block_size) * block_stride + (slot % block_size) * dim;
        for (int o = threadIdx.x; o < dim; o += blockDim.x)
            dst[o] = from_f32<T>(rope_at([&](int i) { return kn[i]; }, o, half, c, s, interleave));
    }
    for (int e = threadIdx.x; e < heads * dim; e += blockDim.x) {
        const int h = e / dim, o = e % dim;
        const T* qr = q + t * q_stride + (long long)h * dim;
        q_out[((long long)t * heads + h) * dim + o] =
            from_f32<T>(rope_at([&](int i) { return to_f32(qr[i]); }, o, half, c, s, interleave));
    }
}

// Scores I(t, s) = sum_h w[t, h] * relu(q[t, h] . k_s * scale) for keys s of a KEYS-wide tile (one per
// thread); -inf where s is not visible to t. q [T, heads, dim] packed, w [T, heads] float32, scores
// [T, width] float32. grid (T, ceil(width / blockDim)); q and w of the token in dynamic shared memory.
constexpr int MAX_INDEX_HEADS = 64;
template <typename T>
__device__ void indexer_scores(const T* q, const float* w, const T* cache, long long block_stride, int block_size,
                               const int* block_tables, int table_stride, const int* query_start,
                               const int* context_lens, int num_seqs, float* scores, int width, int heads, int dim,
                               float scale) {
    extern __shared__ float qs[];   // [heads * dim] then [heads] weights
    pdl_begin();
    const int t = blockIdx.x;
    for (int e = threadIdx.x; e < heads * dim; e += blockDim.x) qs[e] = to_f32(q[(long long)t * heads * dim + e]);
    for (int h = threadIdx.x; h < heads; h += blockDim.x) qs[heads * dim + h] = w[(long long)t * heads + h];
    __syncthreads();
    const int2 sp = token_seq_pos(query_start, context_lens, num_seqs, t);
    const int key = blockIdx.y * blockDim.x + threadIdx.x;
    if (key >= width) return;
    float score = NEG_INF;
    if (key <= sp.y) {
        const T* kr = cache + cache_row(block_tables, table_stride, sp.x, key, block_size, block_stride, dim);
        float acc[MAX_INDEX_HEADS];
#pragma unroll
        for (int h = 0; h < MAX_INDEX_HEADS; ++h) acc[h] = 0.f;
        for (int d = 0; d < dim; ++d) {
            const float kv = to_f32(kr[d]);
#pragma unroll
            for (int h = 0; h < MAX_INDEX_HEADS; ++h)
                if (h < heads) acc[h] += qs[h * dim + d] * kv;
        }
        score = 0.f;
#pragma unroll
        for (int h = 0; h < MAX_INDEX_HEADS; ++h)
            if (h < heads) score += qs[heads * dim + h] * fmaxf(acc[h] * scale, 0.f);
    }
    scores[(long long)t * width + key] = score;
}

// The exact top-k of one token's visible scores (a block a token): out [T, topk] int32 key positions,
// ascending, -1 padded. At most topk visible keys: all of them. Else a radix select (4 passes of 8 bits over
// order-preserving integer keys) finds the k-th largest score; every larger one is taken, and of those equal
// to it the earliest, so ties at the cut go to the earlier position (the reference's rule). +0 and -0 are one
// value, as they compare equal. blockDim.x a multiple of 32, at most 1024.
__device__ __forceinline__ unsigned int order_key(float x) {
    const unsigned int u = __float_as_uint(x == 0.f ? 0.f : x);
    return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

// Exclusive prefix count of `flag` over the block, and the block's total (every thread gets it).
__device__ __forceinline__ int block_exclusive_count(bool flag, int* total) {
    __shared__ int warp_counts[32];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
    const unsigned int ballot = __ballot_sync(0xffffffffu, flag);
    __syncthreads();   // warp_counts may still be read by a previous call
    if (lane == 0) warp_counts[warp] = __popc(ballot);
    __syncthreads();
    int before = 0, all = 0;
    for (int i = 0; i < nwarps; ++i) {
        before += i < warp ? warp_counts[i] : 0;
        all += warp_counts[i];
    }
    *total = all;
    return before + __popc(ballot & ((1u << lane) - 1u));
}

extern "C" __global__ void indexer_topk_select(const float* scores, int width, const int* query_start,
                                               const int* context_lens, int num_seqs, int topk, int* out) {
    __shared__ int hist[256];
    __shared__ unsigned int found[2];   // the prefix fixed so far, the count still to take inside it
    pdl_begin();
    const int t = blockIdx.x;
    const int visible = token_seq_pos(query_start, context_lens, num_seqs, t).y + 1;
    const float* row = scores + (long long)t * width;
    int* dst = out + (long long)t * topk;
    if (visible <= topk) {
        for (int i = threadIdx.x; i < topk; i += blockDim.x) dst[i] = i < visible ? i : -1;
        return;
    }
    unsigned int prefix = 0, mask = 0, need = topk;
    for (int shift = 24; shift >= 0; shift -= 8) {
        for (int b = threadIdx.x; b < 256; b += blockDim.x) hist[b] = 0;
        __syncthreads();
        for (int s = threadIdx.x; s < visible; s += blockDim.x) {
            const unsigned int key = order_key(row[s]);
            if ((key & mask) == prefix) atomicAdd(&hist[(key >> shift) & 255u], 1);
        }
        __syncthreads();
        if (threadIdx.x == 0) {
            unsigned int above = 0;
            int b = 255;
            for (; b > 0 && above + hist[b] < need; --b) above += hist[b];
            found[0] = prefix | ((unsigned int)b << shift);
            found[1] = need - above;
        }
        __syncthreads();
        prefix = found[0];
        need = found[1];
        mask |= 0xffu << shift;
        __syncthreads();   // found[] is rewritten by the next pass
    }
    // prefix is the k-th largest key; `need` of the keys equal to it are taken, the earliest ones.
    int taken = 0, equal_seen = 0;
    for (int base = 0; base < visible; base += blockDim.x) {
        const int s = base + threadIdx.x;
        const unsigned int key = s < visible ? order_key(row[s]) : 0u;
        int equal_total, take_total;
        const int equal_rank = block_exclusive_count(s < visible && key == prefix, &equal_total);
        const bool take = s < visible && (key > prefix || (key == prefix && equal_seen + equal_rank < (int)need));
        const int rank = block_exclusive_count(take, &take_total);
        if (take && taken + rank < topk) dst[taken + rank] = s;
        taken += take_total;
        equal_seen += equal_total;
    }
    for (int i = taken + threadIdx.x; i < topk; i += blockDim.x) dst[i] = -1;
}

// Absorbed MLA attention of one token over its selected keys, HG heads a block: score_h(s) = (q_latent_h . c_s
// + q_pe_h . kpe_s) * scale over s in indices[t] (-1 and positions past the token's own skipped); out_h =
// softmax . c. Keys go through shared memory in tiles of KT latent rows; each head's softmax runs online.
// q_latent [T, heads, R], q_pe [T, heads, P], out [T, heads, R] packed; cache rows [R + P]. R <= 32 * 16,
// P <= 64. grid (T, ceil(heads / HG)), SPARSE_THREADS threads, dynamic shared memory sparse_mla_smem(R, P).
constexpr int HG = 16, KT = 32, SPARSE_THREADS = 256, R_PER_THREAD = 32;
template <typename T>
__device__ void sparse_mla_attention(const T* q_latent, const T* q_pe, const T* cache, long long block_stride,
                                     int block_size, const int* block_tables, int table_stride,
                                     const int* query_start, const int* context_lens, int num_seqs,
                                     const int* indices, int topk, T* out, int heads, int R, int P, float scale) {
    extern __shared__ float smem[];
    const int D = R + P, LD = D + 1;     // latent rows padded by one float: the score loop's lanes read rows
                                         // D apart, and D (576) is a multiple of the 32 banks
    float* qs = smem;                    // [HG][D]
    float* lat = qs + HG * D;            // [KT][LD]
    float* p = lat + KT * LD;            // [HG][KT] scores, then probabilities
    float* run_max = p + HG * KT;        // [HG]
    float* run_sum = run_max + HG;       // [HG]
    float* factor = run_sum + HG;        // [HG]
    __shared__ int rows[KT];
    pdl_begin();
    const int t = blockIdx.x, h0 = blockIdx.y * HG, tid = threadIdx.x;
    const int hcount = min(HG, heads - h0);
    for (int e = tid; e < HG * D; e += blockDim.x) {
        const int h = e / D, d = e % D;
        float v = 0.f;
        if (h < hcount)
            v = d < R ? to_f32(q_latent[((long long)t * heads + h0 + h) * R + d])
                      : to_f32(q_pe[((long long)t * heads + h0 + h) * P + d - R]);
        qs[e] = v;
    }
    if (tid < HG) {
        run_max[tid] = NEG_INF;
        run_sum[tid] = 0.f;
    }
    const int2 sp = token_seq_pos(query_start, context_lens, num_seqs, t);
    // accumulators: head tid / 16, latent dims (tid % 16) + 16 u
    const int ah = tid / 16, ar = tid % 16;
    float acc[R_PER_THREAD];
#pragma unroll
    for (int u = 0; u < R_PER_THREAD; ++u) acc[u] = 0.f;
    const int* sel = indices + (long long)t * topk;
    for (int base = 0; base < topk; base += KT) {
        __syncthreads();
        if (tid < KT) {
            const int s = base + tid < topk ? sel[base + tid] : -1;
            rows[tid] = (s >= 0 && s <= sp.y) ? s : -1;
        }
        __syncthreads();
        for (int e = tid; e < KT * D; e += blockDim.x) {
            const int j = e / D, d = e % D, s = rows[j];
            lat[j * LD + d] = s < 0 ? 0.f : to_f32(cache[cache_row(block_tables, table_stride, sp.x, s, block_size,
                                                                    block_stride, D) + d]);
        }
        __syncthreads();
        for (int e = tid; e < HG * KT; e += blockDim.x) {
            const int h = e / KT, j = e % KT;
            float dot = 0.f;
            for (int d = 0; d < D; ++d) dot += qs[h * D + d] * lat[j * LD + d];
            p[e] = rows[j] < 0 || h >= hcount ? NEG_INF : dot * scale;
        }
        __syncthreads();
        // online softmax: a warp per head (KT == 32 keys, a lane each)
        for (int h = tid >> 5; h < HG; h += blockDim.x >> 5) {
            const int lane = tid & 31;
            const float x = p[h * KT + lane];
            const float m_new = fmaxf(run_max[h], warp_max(x));
            const float e = m_new == NEG_INF ? 0.f : __expf(x - m_new);
            const float total = warp_sum(e);
            p[h * KT + lane] = e;
            __syncwarp();
            if (lane == 0) {
                const float f = run_max[h] == NEG_INF ? 0.f : __expf(run_max[h] - m_new);
                factor[h] = f;
                run_sum[h] = run_sum[h] * f + total;
                run_max[h] = m_new;
            }
        }
        __syncthreads();
        const float f = factor[ah];
#pragma unroll
        for (int u = 0; u < R_PER_THREAD; ++u) {
            const int r = ar + 16 * u;
            if (r < R) {
                float v = acc[u] * f;
                for (int j = 0; j < KT; ++j) v += p[ah * KT + j] * lat[j * LD + r];
                acc[u] = v;
            }
        }
    }
    __syncthreads();
    if (ah < hcount) {
        const float l = run_sum[ah], inv = l > 0.f ? 1.f / l : 0.f;
        T* o = out + ((long long)t * heads + h0 + ah) * R;
#pragma unroll
        for (int u = 0; u < R_PER_THREAD; ++u) {
            const int r = ar + 16 * u;
            if (r < R) o[r] = from_f32<T>(acc[u] * inv);
        }
    }
}

#define DSA_KERNELS(suffix, T)                                                                                   \
    extern "C" __global__ void indexer_rope_write_##suffix(                                                      \
        const T* q, long long q_stride, const T* k, long long k_stride, const T* norm_w, const T* norm_b,        \
        const int* positions, const float* cos, const float* sin, int half, T* cache, long long block_stride,    \
        int block_size, const long long* slot_mapping, T* q_out, int heads, int dim, int interleave) {           \
        indexer_rope_write<T>(q, q_stride, k, k_stride, norm_w, norm_b, positions, cos, sin, half, cache,        \
                              block_stride, block_size, slot_mapping, q_out, heads, dim, interleave);            \
    }                                                                                                            \
    extern "C" __global__ void indexer_scores_##suffix(                                                          \
        const T* q, const float* w, const T* cache, long long block_stride, int block_size,                     \
        const int* block_tables, int table_stride, const int* query_start, const int* context_lens,             \
        int num_seqs, float* scores, int width, int heads, int dim, float scale) {                               \
        indexer_scores<T>(q, w, cache, block_stride, block_size, block_tables, table_stride, query_start,        \
                          context_lens, num_seqs, scores, width, heads, dim, scale);                             \
    }                                                                                                            \
    extern "C" __global__ void __launch_bounds__(SPARSE_THREADS) sparse_mla_attention_##suffix(                 \
        const T* q_latent, const T* q_pe, const T* cache, long long block_stride, int block_size,               \
        const int* block_tables, int table_stride, const int* query_start, const int* context_lens,             \
        int num_seqs, const int* indices, int topk, T* out, int heads, int R, int P, float scale) {             \
        sparse_mla_attention<T>(q_latent, q_pe, cache, block_stride, block_size, block_tables, table_stride,     \
                                query_start, context_lens, num_seqs, indices, topk, out, heads, R, P, scale);   \
    }

DSA_KERNELS(bf16, bf16)
DSA_KERNELS(f32, float)
