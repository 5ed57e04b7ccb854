// The split rule and the last steps of both split-KV decode kernels (attention.cu, attention_decode.cu), grid
// (group, head chunk, sequence). decode_split_len cuts a sequence's keys into splits by its key count alone; a
// block takes the sequence's splits group, group + groups, ... in turn. store_merged_warps merges the block's NW
// warps' online-softmax states of its gc query heads and stores the normalised rows (one split) or this split's
// partials (o, m, l). merge_splits_if_last then, with several splits, counts the splits the block took at its
// (sequence, head chunk); the last block to arrive merges the partials of every split in split order, so no
// separate combine kernel is launched and the bits do not depend on which block came last.
// Partials: (sequence b, head, split s < used) at p = (b * nh + head) * slots + s, part_o[p * D ..], part_m[p]
// (log2 units), part_l[p]. They are stored and loaded through L2 (__stcg / __ldcg): the merging block reads what
// other SMs wrote, never a stale line of its own L1.
#pragma once

// A decode sequence of L keys (attention_decode.py decode_split): n = max(1, min(near, ceil(L / split_keys)),
// min(cap, ceil(L / (near * split_keys)))) splits (up to `near` of split_keys keys, then up to `cap` of
// near * split_keys, then longer), clamped to the launch's `slots` (the split count of its longest context, so a
// context past it cannot write past the partials), the keys shared evenly in whole passes of `pass` keys. Returns
// the keys a split; `used`: the splits holding keys (0 for L = 0).
__device__ __forceinline__ int decode_split_len(int L, int split_keys, int near, int cap, int slots, int pass,
                                                int& used) {
    const int short_n = min(near, (L + split_keys - 1) / split_keys);
    const int long_n = min(cap, (L + near * split_keys - 1) / (near * split_keys));
    const int n = max(1, min(slots, max(short_n, long_n)));
    const int len = max(pass, ((L + n - 1) / n + pass - 1) / pass * pass);
    used = (L + len - 1) / len;
    return len;
}

// Where a warp's output row keeps head dim dd: at dd (a kernel may keep its dims in another order: its own Cols).
struct SameCols {
    __device__ static int of(int dd) { return dd; }
};

// The online-softmax states of NW warps, combined: warp w's state of head g sits at row w * ROWS + g: max
// wm (log2 units), sum wl, unnormalised output wo[row * D + Cols::of(dd)] of head dim dd. Gives head g's max M,
// sum lsum and unnormalised output column dd, all relative to M (M = -inf, lsum = o = 0 where no warp saw a key).
template <int NW, int ROWS, int D, typename Cols = SameCols>
__device__ __forceinline__ void merge_warps(const float* wm, const float* wl, const float* wo, int g, int dd,
                                            float& M, float& lsum, float& o) {
    M = NEG_INF, lsum = 0.f, o = 0.f;
#pragma unroll
    for (int w = 0; w < NW; ++w) M = fmaxf(M, wm[w * ROWS + g]);
    if (M != NEG_INF)
#pragma unroll
        for (int w = 0; w < NW; ++w) {
            const float f = exp2f(wm[w * ROWS + g] - M);
            lsum += f * wl[w * ROWS + g];
            o += f * wo[(w * ROWS + g) * D + Cols::of(dd)];
        }
}

// The warps' states merged (merge_warps), then stored: the normalised rows when the sequence has one split,
// else this split's partials. Call after a __syncthreads().
template <typename T, int NW, int ROWS, int D, typename Cols = SameCols>
__device__ __forceinline__ void store_merged_warps(const float* wm, const float* wl, const float* wo, int gc,
                                                   int head0, int nh, int q0, int b, int split, int used,
                                                   int slots, T* out, float* part_o, float* part_m,
                                                   float* part_l) {
    for (int idx = threadIdx.x; idx < gc * D; idx += blockDim.x) {
        const int g = idx / D, dd = idx % D, head = head0 + g;
        float M, lsum, o;
        merge_warps<NW, ROWS, D, Cols>(wm, wl, wo, g, dd, M, lsum, o);
        if (used == 1) {
            out[((long long)q0 * nh + head) * D + dd] = from_f32<T>(o / lsum);
        } else {
            const long long p = ((long long)b * nh + head) * slots + split;
            __stcg(part_o + p * D + dd, lsum > 0.f ? o / lsum : 0.f);
            if (dd == 0) { __stcg(part_m + p, M); __stcg(part_l + p, lsum); }
        }
    }
}

constexpr int MERGE_UNROLL = 16;   // splits whose partial float4s a thread loads at once (L2 round trips)

// Float4 col4 of partial row `row` (head head0 + row) in the partials of splits s0 .. s0 + MERGE_UNROLL - 1;
// past the last used split nothing is loaded (those slots are never used).
template <int D>
__device__ __forceinline__ void load_partial_rows(float4* v, const float* part_o, long long base, int row, int col4,
                                                  int s0, int used, int slots) {
    const float4* po = reinterpret_cast<const float4*>(part_o + (base + (long long)row * slots) * D) + col4;
#pragma unroll
    for (int u = 0; u < MERGE_UNROLL; ++u)
        v[u] = s0 + u < used ? __ldcg(po + (long long)(s0 + u) * (D / 4)) : make_float4(0.f, 0.f, 0.f, 0.f);
}

// Every block that took splits of a sequence calls this once their partials are stored (used > 1), counting the
// `arrivals` splits it took in turn (mla.cu: clusters; the last block brings the count to used). It merges columns
// c0 .. c0 + width - 1 of the rows (all D by default; mla.cu gives each CTA of a cluster its own slice, its own
// counters and its own m and l). counters: one int per (sequence, head chunk), zero on entry and left zero (the
// last block resets its own), so a CUDA graph replays cleanly. scratch: shared memory for
// 2 * gc * used floats, free once the partials are stored (attention_decode.py checks the rule's splits fit).
// The merge: weights w_s = exp2(m_s - M) l_s (M the heads' max),
// out = sum_s w_s o_s / sum_s w_s summed in split order, so the output is the same bits
// whichever block came last. Each thread owns float4s of the gc output rows and keeps MERGE_UNROLL
// splits' loads in flight.
template <typename T, int D, bool EARLY = false>
__device__ void merge_splits_if_last(const float* part_o, const float* part_m, const float* part_l, int* counters,
                                     float* scratch, int gc, int head0, int nh, int q0, int b, int used,
                                     int slots, T* out, int c0 = 0, int width = D, int arrivals = 1) {
    __shared__ int last;
    __shared__ float head_max[16];   // gc <= 16 (DEC_ROWS; attention.cu's GMAX is 8)
    __threadfence();                 // this thread's partials are visible device-wide before the block counts
    __syncthreads();
    if (threadIdx.x == 0) {
        int* counter = counters + (long long)blockIdx.z * gridDim.y + blockIdx.y;
        last = atomicAdd(counter, arrivals) + arrivals == used;
        if (last) *counter = 0;      // every split has arrived: nobody else touches it in this launch
    }
    __syncthreads();
    if (!last) return;
    __threadfence();
    // (head0 + g, split s) is partial p = base + g * slots + s
    const long long base = ((long long)b * nh + head0) * slots;
    const int n = gc * used;
    const int V = width / 4;         // float4s of a row's slice
    // EARLY: the thread's first MERGE_UNROLL partial rows are loaded with the m and l below (they do not depend
    // on them), one round trip for both where a thread's output float4 takes one pass (gc * V <= blockDim, used
    // <= 16). It holds 64 more registers through the m and l pass, so only kernels with registers to spare ask.
    float4 first[MERGE_UNROLL];
    if (EARLY && threadIdx.x < gc * V)
        load_partial_rows<D>(first, part_o, base, threadIdx.x / V, c0 / 4 + threadIdx.x % V, 0, used, slots);
    float* wsm = scratch;            // [gc][used]: m, then the weight
    float* lsm = scratch + n;        // [gc][used]: l
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
        const long long p = base + (long long)(i / used) * slots + i % used;
        wsm[i] = __ldcg(part_m + p);
        lsm[i] = __ldcg(part_l + p);
    }
    __syncthreads();
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    for (int g = warp; g < gc; g += blockDim.x >> 5) {
        float M = NEG_INF;
        for (int s = lane; s < used; s += 32) M = fmaxf(M, wsm[g * used + s]);
        M = warp_max(M);  // finite: split 0 holds key 0 (a decode query sees at least itself)
        if (lane == 0) head_max[g] = M;
    }
    __syncthreads();
    for (int i = threadIdx.x; i < n; i += blockDim.x)
        wsm[i] = exp2f(wsm[i] - head_max[i / used]) * lsm[i];
    __syncthreads();
    for (int idx = threadIdx.x; idx < gc * V; idx += blockDim.x) {
        const int g = idx / V;
        const float* w = wsm + g * used;
        float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
        float lsum = 0.f;
        for (int s0 = 0; s0 < used; s0 += MERGE_UNROLL) {
            float4 v[MERGE_UNROLL];
            if (EARLY && idx == threadIdx.x && s0 == 0) {
#pragma unroll
                for (int u = 0; u < MERGE_UNROLL; ++u) v[u] = first[u];
            } else {
                load_partial_rows<D>(v, part_o, base, g, c0 / 4 + idx % V, s0, used, slots);
            }
#pragma unroll
            for (int u = 0; u < MERGE_UNROLL; ++u) {
                if (s0 + u >= used) break;
                const float wu = w[s0 + u];
                lsum += wu;
                acc.x = fmaf(wu, v[u].x, acc.x);
                acc.y = fmaf(wu, v[u].y, acc.y);
                acc.z = fmaf(wu, v[u].z, acc.z);
                acc.w = fmaf(wu, v[u].w, acc.w);
            }
        }
        T* o = out + ((long long)q0 * nh + head0 + g) * D + c0 + 4 * (idx % V);
        o[0] = from_f32<T>(acc.x / lsum);
        o[1] = from_f32<T>(acc.y / lsum);
        o[2] = from_f32<T>(acc.z / lsum);
        o[3] = from_f32<T>(acc.w / lsum);
    }
}
