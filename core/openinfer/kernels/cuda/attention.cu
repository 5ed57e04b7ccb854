// Causal GQA attention over paged KV. Query j of a run of n tokens sits at position L - n + j
// (L = context length) and sees keys 0 .. L - n + j (the numpy reference's rule).
//   prefill: flash-attention tiling with an online softmax; a block owns 32 (token, head) rows of
//            one KV head, so a K/V tile is loaded once for every query head of its group.
//   decode:  one query token per sequence; a block owns (group, KV head, sequence) and all query
//            heads of the group, and takes the sequence's splits group, group + groups, ... in turn
//            (cut by its key count alone, decode_split_len); the last block to finish merges the
//            splits in split order (decode_merge.cuh).
// Scores live in the log2 domain: q is pre-scaled by scale * log2(e) and exp2f is used.
#include "common.cuh"
#include "decode_merge.cuh"

constexpr int NWARPS = 4, BN = 32, ROWS = 8, GMAX = 8;

// Row starts are computed once per key (one block-table read each) and shared; rows then move
// as 16-byte loads into [BN][DW + PAD] words of shared memory (PAD = 1 breaks bank conflicts).
template <typename T, int D, int PAD>
__device__ __forceinline__ void store_row_chunk(unsigned int* dst, int row, int c, uint4 v) {
    unsigned int* d = dst + row * (D * (int)sizeof(T) / 4 + PAD) + 4 * c;
    d[0] = v.x; d[1] = v.y; d[2] = v.z; d[3] = v.w;
}

// One warp loads a K tile; lane j holds the row start of key j (valid == 0: a zero row).
template <typename T, int D>
__device__ __forceinline__ void warp_load_tile(unsigned int* dst, const T* cache, long long off, int valid) {
    constexpr int VW = D * (int)sizeof(T) / 16;  // 16-byte chunks per row
    const int lane = threadIdx.x & 31;
#pragma unroll 16  // 16 loads a lane in flight; all 64 of f32 d256 spilled beside the accumulators
    for (int it = 0; it < BN * VW / 32; ++it) {
        const int idx = it * 32 + lane, row = idx / VW, c = idx % VW;
        const long long o = __shfl_sync(0xffffffffu, off, row);
        const uint4 v = __shfl_sync(0xffffffffu, valid, row) ? ((const uint4*)(cache + o))[c] : make_uint4(0, 0, 0, 0);
        store_row_chunk<T, D, 1>(dst, row, c, v);
    }
}

template <typename T, int D>
__device__ void paged_prefill(const T* q, long long q_stride, const T* kc, const T* vc, KvLayout kv,
                              const int* tables, int table_stride, const int* qstart, const int* ctx,
                              T* out, int nh, int nkv, float scale) {
    constexpr int E = Pack<T>::N, DW = D / E, NWL = DW / 32, BM = NWARPS * ROWS;
    extern __shared__ float smem[];
    float* qsm = smem;                                        // [BM][D]
    unsigned int* ksm = (unsigned int*)(qsm + BM * D);        // [BN][DW + 1], padded against bank conflicts
    unsigned int* vsm = ksm + BN * (DW + 1);                  // [BN][DW]
    const int b = blockIdx.z, kvh = blockIdx.y, G = nh / nkv;
    const int q0 = qstart[b], n = qstart[b + 1] - q0, L = ctx[b];
    const int rows = n * G, row0 = blockIdx.x * BM;
    if (row0 >= rows) return;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int* table = tables + (long long)b * table_stride;

    for (int i = threadIdx.x; i < BM * DW; i += blockDim.x) {
        const int r = i / DW, w = i % DW, row = row0 + r;
        float f[E];
#pragma unroll
        for (int e = 0; e < E; ++e) f[e] = 0.f;
        if (row < rows) {
            const T* src = q + (long long)(q0 + row / G) * q_stride + (long long)(kvh * G + row % G) * D;
            Pack<T>::unpack(((const unsigned int*)src)[w], f);
        }
#pragma unroll
        for (int e = 0; e < E; ++e) qsm[r * D + w * E + e] = f[e] * scale;
    }
    const int kend = L - n + (min(row0 + BM, rows) - 1) / G + 1;  // keys any row of this block sees

    float m[ROWS], l[ROWS], acc[ROWS][NWL * E];
    int qpos[ROWS];
#pragma unroll
    for (int r = 0; r < ROWS; ++r) {
        const int row = row0 + warp * ROWS + r;
        qpos[r] = row < rows ? L - n + row / G : -1;
        m[r] = NEG_INF;
        l[r] = 0.f;
#pragma unroll
        for (int i = 0; i < NWL * E; ++i) acc[r][i] = 0.f;
    }
    __shared__ long long offs[BN];
    constexpr int VW = DW / 4;  // 16-byte chunks per row
    for (int k0 = 0; k0 < kend; k0 += BN) {
        __syncthreads();  // the previous tile is consumed (and, the first time, q is stored)
        if (threadIdx.x < BN) offs[threadIdx.x] = k0 + threadIdx.x < kend ? kv.offset(table, k0 + threadIdx.x, kvh, D) : -1;
        __syncthreads();
        for (int i = threadIdx.x; i < BN * VW; i += blockDim.x) {
            const int jj = i / VW, c = i % VW;
            const long long off = offs[jj];
            uint4 kw = make_uint4(0, 0, 0, 0), vw = kw;  // keys past kend are zeros: masked, and 0 * V stays finite
            if (off >= 0) {
                kw = ((const uint4*)(kc + off))[c];
                vw = ((const uint4*)(vc + off))[c];
            }
            store_row_chunk<T, D, 1>(ksm, jj, c, kw);
            ((uint4*)vsm)[jj * VW + c] = vw;
        }
        __syncthreads();
        float s[ROWS];
#pragma unroll
        for (int r = 0; r < ROWS; ++r) s[r] = 0.f;
        const unsigned int* krow = ksm + lane * (DW + 1);  // lane = key within the tile
        for (int w = 0; w < DW; ++w) {
            float kf[E];
            Pack<T>::unpack(krow[w], kf);
#pragma unroll
            for (int r = 0; r < ROWS; ++r)
#pragma unroll
                for (int e = 0; e < E; ++e) s[r] += qsm[(warp * ROWS + r) * D + w * E + e] * kf[e];
        }
        float p[ROWS];
#pragma unroll
        for (int r = 0; r < ROWS; ++r) {
            const float sr = k0 + lane <= qpos[r] ? s[r] : NEG_INF;
            const float mn = fmaxf(m[r], warp_max(sr));
            if (mn == NEG_INF) { p[r] = 0.f; continue; }  // warp-uniform: the row sees nothing yet
            p[r] = exp2f(sr - mn);
            const float alpha = exp2f(m[r] - mn);
            l[r] = l[r] * alpha + warp_sum(p[r]);
#pragma unroll
            for (int i = 0; i < NWL * E; ++i) acc[r][i] *= alpha;
            m[r] = mn;
        }
        const int kn = min(BN, kend - k0);
        for (int jj = 0; jj < kn; ++jj) {
            float pj[ROWS];
#pragma unroll
            for (int r = 0; r < ROWS; ++r) pj[r] = __shfl_sync(0xffffffffu, p[r], jj);
#pragma unroll
            for (int i = 0; i < NWL; ++i) {
                float vf[E];
                Pack<T>::unpack(vsm[jj * DW + lane + 32 * i], vf);
#pragma unroll
                for (int r = 0; r < ROWS; ++r)
#pragma unroll
                    for (int e = 0; e < E; ++e) acc[r][i * E + e] += pj[r] * vf[e];
            }
        }
    }
#pragma unroll
    for (int r = 0; r < ROWS; ++r) {
        const int row = row0 + warp * ROWS + r;
        if (row >= rows) continue;
        const float inv = 1.f / l[r];
        unsigned int* dst = (unsigned int*)(out + ((long long)(q0 + row / G) * nh + kvh * G + row % G) * D);
#pragma unroll
        for (int i = 0; i < NWL; ++i) {
            float f[E];
#pragma unroll
            for (int e = 0; e < E; ++e) f[e] = acc[r][i * E + e] * inv;
            dst[lane + 32 * i] = Pack<T>::pack(f);
        }
    }
}

template <typename T, int D>
__device__ void paged_decode(const T* q, long long q_stride, const T* kc, const T* vc, KvLayout kv,
                             const int* tables, int table_stride, const int* qstart, const int* ctx, T* out,
                             float* part_o, float* part_m, float* part_l, int* counters, int nh, int nkv,
                             float scale, int split_keys, int near, int cap, int slots) {
    constexpr int E = Pack<T>::N, DW = D / E, NWL = DW / 32;
    extern __shared__ float smem[];
    __shared__ float wm[NWARPS][GMAX], wl[NWARPS][GMAX];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    float* qsm = smem;                                                           // [GMAX][D]
    unsigned int* ksm = (unsigned int*)(qsm + GMAX * D) + warp * BN * (DW + 1);  // this warp's K tile
    const int b = blockIdx.z, G = nh / nkv, chunks = (G + GMAX - 1) / GMAX;
    const int kvh = blockIdx.y / chunks, g0 = (blockIdx.y % chunks) * GMAX, gc = min(GMAX, G - g0);
    const int q0 = qstart[b];
    if (qstart[b + 1] == q0) return;  // no query this step: every block of it leaves, none counts or merges
    // the sequence's splits (whole passes of the warps) from its key count alone, so any batch and any grid (a
    // CUDA graph's) give it the same bits; the grid's x only says how many blocks take them in turn
    const int L = ctx[b];
    int used;
    const int split_len = decode_split_len(L, split_keys, near, cap, slots, NWARPS * BN, used);
    if ((int)blockIdx.x >= used) return;
    const int* table = tables + (long long)b * table_stride;

    for (int i = threadIdx.x; i < GMAX * DW; i += blockDim.x) {
        const int g = i / DW, w = i % DW;
        float f[E];
#pragma unroll
        for (int e = 0; e < E; ++e) f[e] = 0.f;
        if (g < gc) Pack<T>::unpack(((const unsigned int*)(q + (long long)q0 * q_stride + (long long)(kvh * G + g0 + g) * D))[w], f);
#pragma unroll
        for (int e = 0; e < E; ++e) qsm[g * D + w * E + e] = f[e] * scale;
    }
    __syncthreads();

    for (int split = blockIdx.x; split < used; split += gridDim.x) {
        const int kbeg = split * split_len, kend = min(L, kbeg + split_len);
        float m[GMAX], l[GMAX], acc[GMAX][NWL * E];
#pragma unroll
        for (int g = 0; g < GMAX; ++g) {
            m[g] = NEG_INF;
            l[g] = 0.f;
#pragma unroll
            for (int i = 0; i < NWL * E; ++i) acc[g][i] = 0.f;
        }
        for (int k0 = kbeg + warp * BN; k0 < kend; k0 += NWARPS * BN) {
            const int valid = k0 + lane < kend;
            const long long off = valid ? kv.offset(table, k0 + lane, kvh, D) : 0;
            __syncwarp();  // the previous tile is consumed
            warp_load_tile<T, D>(ksm, kc, off, valid);
            __syncwarp();
            float s[GMAX];
#pragma unroll
            for (int g = 0; g < GMAX; ++g) s[g] = 0.f;
            const unsigned int* krow = ksm + lane * (DW + 1);
            for (int w = 0; w < DW; ++w) {
                float kf[E];
                Pack<T>::unpack(krow[w], kf);
#pragma unroll
                for (int g = 0; g < GMAX; ++g)
                    if (g < gc)
#pragma unroll
                        for (int e = 0; e < E; ++e) s[g] += qsm[g * D + w * E + e] * kf[e];
            }
            float p[GMAX];
#pragma unroll
            for (int g = 0; g < GMAX; ++g) {  // key k0 < kend is always valid, so mn is finite
                if (g >= gc) continue;        // gc is warp-uniform
                const float sr = valid ? s[g] : NEG_INF;
                const float mn = fmaxf(m[g], warp_max(sr));
                p[g] = exp2f(sr - mn);
                const float alpha = exp2f(m[g] - mn);
                l[g] = l[g] * alpha + warp_sum(p[g]);
#pragma unroll
                for (int i = 0; i < NWL * E; ++i) acc[g][i] *= alpha;
                m[g] = mn;
            }
            const int kn = min(BN, kend - k0);
#pragma unroll 8
            for (int jj = 0; jj < kn; ++jj) {  // V rows straight from global: each lane reads its words
                const unsigned int* vrow = (const unsigned int*)(vc + __shfl_sync(0xffffffffu, off, jj));
                float pj[GMAX];
#pragma unroll
                for (int g = 0; g < GMAX; ++g) pj[g] = g < gc ? __shfl_sync(0xffffffffu, p[g], jj) : 0.f;
#pragma unroll
                for (int i = 0; i < NWL; ++i) {
                    float vf[E];
                    Pack<T>::unpack(vrow[lane + 32 * i], vf);
#pragma unroll
                    for (int g = 0; g < GMAX; ++g)
                        if (g < gc)
#pragma unroll
                            for (int e = 0; e < E; ++e) acc[g][i * E + e] += pj[g] * vf[e];
                }
            }
        }
        // merge the warps: their K tiles are done, so that shared memory holds the accumulators now
        __syncthreads();
        float* asm_ = qsm + GMAX * D;  // [NWARPS][GMAX][D]
#pragma unroll
        for (int g = 0; g < GMAX; ++g) {
            if (g >= gc) continue;
#pragma unroll
            for (int i = 0; i < NWL; ++i)
#pragma unroll
                for (int e = 0; e < E; ++e) asm_[(warp * GMAX + g) * D + (lane + 32 * i) * E + e] = acc[g][i * E + e];
            if (lane == 0) { wm[warp][g] = m[g]; wl[warp][g] = l[g]; }
        }
        __syncthreads();
        store_merged_warps<T, NWARPS, GMAX, D>(&wm[0][0], &wl[0][0], asm_, gc, kvh * G + g0, nh, q0, b, split, used,
                                               slots, out, part_o, part_m, part_l);
        __syncthreads();  // the merge area is read before the next split's K tiles land over it
    }
    if (used > 1)  // arriving with the splits this block took
        merge_splits_if_last<T, D>(part_o, part_m, part_l, counters, smem, gc, kvh * G + g0, nh, q0, b, used,
                                   slots, out, 0, D, (used - blockIdx.x + gridDim.x - 1) / gridDim.x);
}

#define ATTN_ARGS(T) const T *q, long long q_stride, const T *kc, const T *vc, long long block_stride, \
    long long token_stride, int block_size, const int *tables, int table_stride, const int *qstart, \
    const int *ctx, T *out
#define KV_LAYOUT KvLayout{block_stride, token_stride, block_size}

// decode (threads, 1): without a residency floor ptxas held bf16 d64 to 128 registers and spilled
#define ATTN_HEAD_DIM(suffix, T, D)                                                                       \
    extern "C" __global__ void __launch_bounds__(NWARPS * 32)                                             \
        paged_prefill_##suffix##_d##D(ATTN_ARGS(T), int nh, int nkv, float scale) { pdl_begin();             \
        paged_prefill<T, D>(q, q_stride, kc, vc, KV_LAYOUT, tables, table_stride, qstart, ctx, out, nh,   \
                            nkv, scale);                                                                  \
    }                                                                                                     \
    extern "C" __global__ void __launch_bounds__(NWARPS * 32, 1)                                          \
        paged_decode_##suffix##_d##D(ATTN_ARGS(T), float* part_o, float* part_m, float* part_l,             \
                                     int* counters, int nh, int nkv, float scale, int split_keys,         \
                                     int near, int cap, int slots) {                                      \
        pdl_begin();                                                                                      \
        paged_decode<T, D>(q, q_stride, kc, vc, KV_LAYOUT, tables, table_stride, qstart, ctx, out,        \
                           part_o, part_m, part_l, counters, nh, nkv, scale, split_keys, near, cap, slots); \
    }

#define ATTN_KERNELS(suffix, T)                                                                           \
    ATTN_HEAD_DIM(suffix, T, 64) ATTN_HEAD_DIM(suffix, T, 128) ATTN_HEAD_DIM(suffix, T, 256)

FOR_EACH_DTYPE(ATTN_KERNELS)
