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
#include "cluster.cuh"   // cluster_sync, cluster_remote

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

// The exact top-k of one token's visible scores: out [T, topk] int32 key positions, ascending, -1 padded. At most
// topk visible keys: all of them. Else a radix select over order-preserving integer keys finds the k-th largest
// score; every larger one is taken, and of those equal to it the earliest, so ties at the cut go to the earlier
// position (the reference's rule). +0 and -0 are one value, as they compare equal.
// Three passes of 11, 11 and 10 bits. The first histograms every key by its top 11 bits (sign, exponent, two
// mantissa bits); only the keys of the digit that holds the cut go on, and the second pass, while it histograms
// them, copies them to a short candidate list, which the third pass reads instead of the segment (where they do
// not fit, it reads the segment again). Wide digits spread the keys over many counters, so a plain shared-memory
// atomic per key counts them (the keys of a warp seldom share one).
// A row is split over `ranks` CTAs, one thread-block cluster (sm_90+; ranks 1 is one block, any GPU): each rank
// takes a contiguous segment of the visible keys, histograms it in every pass, and all ranks sum the cluster's
// histograms over distributed shared memory, so every rank finds the same digit with no global workspace. The first
// pass keeps the segment's order keys in dynamic shared memory when it fits (staged_keys), and the later passes read
// them there instead of the row again. Then each warp counts the keys above and at the cut in its run of the
// segment (32 consecutive keys a step), learns the counts of the warps and ranks before it, and writes its taken
// keys at their final places in order, so the output comes out ascending.
// grid (T * ranks), cluster (ranks, 1, 1), SELECT_THREADS threads, 4 * staged_keys bytes of dynamic shared memory.
constexpr int SELECT_THREADS = 1024, SELECT_UNROLL = 8, MAX_SELECT_RANKS = 8;
constexpr int SELECT_BINS = 2048, SELECT_CANDIDATES = 2048;   // the widest digit's counters; a rank's candidates

__device__ __forceinline__ unsigned int order_key(float x) {
    const unsigned int u = __float_as_uint(x == 0.f ? 0.f : x);
    return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

// The cluster barrier and a load from rank `rank`'s copy of a shared variable; below sm_90 the launcher passes
// ranks 1, so they are the block barrier and a local load.
__device__ __forceinline__ void ranks_sync() {
#if __CUDA_ARCH__ >= 900
    cluster_sync();
#else
    __syncthreads();
#endif
}

__device__ __forceinline__ unsigned int ld_rank(const unsigned int* local, int rank) {
#if __CUDA_ARCH__ >= 900
    unsigned int v;
    asm volatile("ld.shared::cluster.u32 %0, [%1];" : "=r"(v) : "r"(cluster_remote(local, rank)) : "memory");
    return v;
#else
    return *local;
#endif
}

__device__ __forceinline__ unsigned long long ld_rank(const unsigned long long* local, int rank) {
#if __CUDA_ARCH__ >= 900
    unsigned long long v;
    asm volatile("ld.shared::cluster.u64 %0, [%1];" : "=l"(v) : "r"(cluster_remote(local, rank)) : "memory");
    return v;
#else
    return *local;
#endif
}

// Exclusive prefix sum of v over the block, and the block's total. blockDim.x a multiple of 32; every thread calls
// it (it syncs the block), as often as it likes.
template <typename U>
__device__ __forceinline__ U block_exclusive_sum(U v, U* total) {
    __shared__ U warp_sums[32];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
    U x = v;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
        const U y = __shfl_up_sync(0xffffffffu, x, o);
        if (lane >= o) x += y;
    }
    __syncthreads();   // a previous call's readers are done with warp_sums
    if (lane == 31) warp_sums[warp] = x;
    __syncthreads();
    if (warp == 0) {
        U w = lane < nwarps ? warp_sums[lane] : U(0);
#pragma unroll
        for (int o = 1; o < 32; o <<= 1) {
            const U y = __shfl_up_sync(0xffffffffu, w, o);
            if (lane >= o) w += y;
        }
        __syncwarp();
        warp_sums[lane] = w;   // inclusive sums of the warps
    }
    __syncthreads();
    *total = warp_sums[nwarps - 1];
    return (warp > 0 ? warp_sums[warp - 1] : U(0)) + x - v;
}

// The digit of a BINS-counter pass at which the cluster's counts, summed from the top digit down, reach `need`, and
// how many keys of that digit are still to take: found[0], found[1]. Each rank first sums its slice of the digits
// over the ranks' histograms `count` into `sums`, so each counter crosses distributed shared memory once, not
// once a rank (at 8 ranks that traffic, not the keys, set the select's time); then thread i reads digits
// BINS-1 - B i .. down (B = BINS / SELECT_THREADS) from their slices' ranks. The counts sum to at least
// need, so one thread finds it. Every thread of every rank calls it; read found after a __syncthreads.
template <int BINS>
__device__ __forceinline__ void threshold_digit(const unsigned int* count, unsigned int* sums, int ranks, int rank,
                                                unsigned int need, unsigned int* found) {
    constexpr int B = BINS / SELECT_THREADS;
    static_assert(B >= 1 && B * SELECT_THREADS == BINS, "whole digits a thread");
    const int slice = (BINS + ranks - 1) / ranks;
    if (ranks > 1) {
        for (int d = rank * slice + threadIdx.x; d < min(BINS, (rank + 1) * slice); d += blockDim.x) {
            unsigned int part[MAX_SELECT_RANKS], sum = 0;
#pragma unroll
            for (int r = 0; r < MAX_SELECT_RANKS; ++r) part[r] = r < ranks ? ld_rank(&count[d], r) : 0u;
#pragma unroll
            for (int r = 0; r < MAX_SELECT_RANKS; ++r) sum += part[r];
            sums[d] = sum;
        }
        ranks_sync();   // every slice summed
    }
    unsigned int c[B], mine = 0, total;
#pragma unroll
    for (int j = 0; j < B; ++j) {
        const int digit = BINS - 1 - B * (int)threadIdx.x - j;
        c[j] = ranks > 1 ? ld_rank(&sums[digit], digit / slice) : count[digit];
        mine += c[j];
    }
    unsigned int above = block_exclusive_sum(mine, &total);
    if (above < need && need <= above + mine) {
#pragma unroll
        for (int j = 0; j < B; ++j) {
            if (above + c[j] >= need) {
                found[0] = BINS - 1 - B * threadIdx.x - j;
                found[1] = need - above;
                break;
            }
            above += c[j];
        }
    }
}

extern "C" __global__ void __launch_bounds__(SELECT_THREADS)
indexer_topk_select(const float* scores, int width, const int* query_start, const int* context_lens, int num_seqs,
                    int topk, int ranks, int staged_keys, int* out) {
    extern __shared__ unsigned int seg_keys[];            // the segment's order keys, where it fits
    __shared__ unsigned int hist[2][SELECT_BINS];         // this rank's counts, a pass's and the next one's
    __shared__ unsigned int sums[SELECT_BINS];            // the cluster's counts of this rank's slice of the digits
    __shared__ unsigned int candidates[SELECT_CANDIDATES];
    __shared__ unsigned int num_candidates;
    __shared__ unsigned int found[2];                     // the pass's digit, the count still to take inside it
    __shared__ unsigned long long seg_counts;             // this rank's keys above the cut << 32 | keys at it
    pdl_begin();
    const int t = blockIdx.x / ranks, rank = blockIdx.x % ranks, tid = threadIdx.x, lane = tid & 31;
    const int visible = token_seq_pos(query_start, context_lens, num_seqs, t).y + 1;
    const float* row = scores + (long long)t * width;
    int* dst = out + (long long)t * topk;
    if (visible <= topk) {   // the whole cluster leaves here: visible is its row's
        for (int i = rank * blockDim.x + tid; i < topk; i += ranks * blockDim.x) dst[i] = i < visible ? i : -1;
        return;
    }
    const int seg = (visible + ranks - 1) / ranks;
    const int lo = min(rank * seg, visible), hi = min(lo + seg, visible);
    const bool staged = hi - lo <= staged_keys;
    auto key_at = [&](int s) { return staged ? seg_keys[s - lo] : order_key(row[s]); };
    for (int i = tid; i < 2 * SELECT_BINS; i += blockDim.x) (&hist[0][0])[i] = 0u;
    if (tid == 0) num_candidates = 0u;
    __syncthreads();
    const unsigned int lanes_before = (1u << lane) - 1u;
    unsigned int prefix = 0, mask = 0, need = topk;
    bool listed = false;   // the third pass reads the candidate list
    for (int pass = 0; pass < 3; ++pass) {
        const int shift = pass == 0 ? 21 : pass == 1 ? 10 : 0;
        const unsigned int digits = pass == 2 ? 1023u : 2047u;
        unsigned int* h = hist[pass & 1];
        if (pass == 2 && listed) {
            for (int i = tid; i < num_candidates; i += blockDim.x) {
                const unsigned int key = candidates[i];
                if ((key & mask) == prefix) atomicAdd(&h[key & digits], 1u);
            }
        } else {
            for (int base = lo; base < hi; base += SELECT_UNROLL * blockDim.x) {   // the same trip count everywhere
                unsigned int key[SELECT_UNROLL];
                if (pass == 0 || !staged) {
                    float v[SELECT_UNROLL];
#pragma unroll
                    for (int j = 0; j < SELECT_UNROLL; ++j) {
                        const int s = base + j * blockDim.x + tid;
                        v[j] = s < hi ? row[s] : 0.f;
                    }
#pragma unroll
                    for (int j = 0; j < SELECT_UNROLL; ++j) {
                        const int s = base + j * blockDim.x + tid;
                        key[j] = order_key(v[j]);
                        if (pass == 0 && staged && s < hi) seg_keys[s - lo] = key[j];   // read back by this thread
                    }
                } else {
#pragma unroll
                    for (int j = 0; j < SELECT_UNROLL; ++j) {
                        const int s = base + j * blockDim.x + tid;
                        key[j] = s < hi ? seg_keys[s - lo] : 0u;
                    }
                }
#pragma unroll
                for (int j = 0; j < SELECT_UNROLL; ++j) {
                    const bool in = base + j * (int)blockDim.x + tid < hi && (key[j] & mask) == prefix;
                    if (in) atomicAdd(&h[(key[j] >> shift) & digits], 1u);
                    if (pass == 1) {   // the cut's first digit: onto the candidate list, a warp's keys in one go
                        const unsigned int taken = __ballot_sync(0xffffffffu, in);
                        unsigned int at = 0;
                        if (lane == 0 && taken) at = atomicAdd(&num_candidates, __popc(taken));
                        at = __shfl_sync(0xffffffffu, at, 0) + __popc(taken & lanes_before);
                        if (in && at < SELECT_CANDIDATES) candidates[at] = key[j];
                    }
                }
            }
        }
        ranks_sync();   // every rank's counts of this pass are complete, and its reads of the last pass's sums done
        if (pass == 2) threshold_digit<SELECT_BINS / 2>(h, sums, ranks, rank, need, found);
        else threshold_digit<SELECT_BINS>(h, sums, ranks, rank, need, found);
        for (int i = tid; i < SELECT_BINS; i += blockDim.x)
            hist[(pass + 1) & 1][i] = 0u;   // the next pass's: every rank read it before the barrier above
        __syncthreads();
        prefix |= found[0] << shift;
        need = found[1];
        mask |= digits << shift;
        listed = num_candidates <= SELECT_CANDIDATES;
    }
    // prefix is the k-th largest key; `need` of the keys equal to it are taken, the earliest ones. A warp counts its
    // run's keys above and at the cut; their prefix over the warps and the ranks before places each taken key.
    const int nwarps = blockDim.x >> 5;
    const int wrun = ((hi - lo + nwarps - 1) / nwarps + 31) & ~31;
    const int first = lo + (tid >> 5) * wrun, last = min(first + wrun, hi);
    unsigned int above = 0, equal = 0;
    for (int base = first; base < last; base += 32) {   // warp-uniform trips
        const int s = base + lane;
        const unsigned int key = s < last ? key_at(s) : 0u;
        above += __popc(__ballot_sync(0xffffffffu, s < last && key > prefix));
        equal += __popc(__ballot_sync(0xffffffffu, s < last && key == prefix));
    }
    unsigned long long block_total;
    unsigned long long before = block_exclusive_sum(lane == 0 ? ((unsigned long long)above << 32) | equal : 0ull,
                                                    &block_total);
    before = __shfl_sync(0xffffffffu, before, 0);   // lane 0's: the warps before this one
    if (tid == 0) seg_counts = block_total;
    ranks_sync();
    for (int r = 0; r < rank; ++r) before += ld_rank(&seg_counts, r);
    above = (unsigned int)(before >> 32);
    equal = (unsigned int)before;
    for (int base = first; base < last; base += 32) {
        const int s = base + lane;
        const unsigned int key = s < last ? key_at(s) : 0u;
        const bool a = s < last && key > prefix, q = s < last && key == prefix;
        const unsigned int ab = __ballot_sync(0xffffffffu, a), qb = __ballot_sync(0xffffffffu, q);
        const unsigned int at_a = above + __popc(ab & lanes_before), at_q = equal + __popc(qb & lanes_before);
        if (a) dst[at_a + min(at_q, need)] = s;
        else if (q && at_q < need) dst[at_a + at_q] = s;
        above += __popc(ab);
        equal += __popc(qb);
    }
    ranks_sync();   // no rank leaves while another may still read its seg_counts
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
