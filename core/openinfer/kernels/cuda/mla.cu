// Multi-head latent attention (DeepSeek MLA, absorbed form) over the paged latent cache, on the tensor cores
// (bf16 in, fp32 accumulate); the cache's writes and the queries' rope are mla_latent.cu's.
//
// Cache row of a token (mla_row.cuh): MLA_D = 576 bf16, the normalised compressed KV c in [0, 512) then the rotated
// k_pe in [512, 576). The attention is MQA over that one "KV head": score(row, key) = q_row . cache_key (q_latent ||
// q_pe, 576 wide) * scale, out_row = softmax . c_key (the first 512 columns: V is K's latent part).
//
//   rows   a row is a (token, head) pair of a sequence's run, row = token * nh + head, so a decode step's rows
//          are its heads. A block takes 16 MT rows (MT m16 tiles; zero-padded past the run). Query j of a run of
//          n sits at position L - n + j and sees keys 0 .. L - n + j (numpy paged_attention's rule).
//   grid   (cluster x rank, row tile, sequence). Decode (runs of one token; mla_attention_bf16, MT = 1) cuts
//          each context by its own key count alone: clusters of cs CTAs (cs fixed per device), n =
//          max(min(near, ceil(keys / (cs * split_keys))), min(cap, ceil(keys / (cs * near * split_keys))))
//          clusters (up to `near` clusters of split_keys-key CTAs, then CTAs of near * split_keys keys up to `cap`
//          clusters, then longer), the keys shared evenly over their n * cs CTAs in whole tiles
//          (the last ones may hold none), so a sequence's arithmetic is the same whatever batch or grid it runs
//          in (batching and CUDA graphs never change a token). The grid's x holds `groups` clusters a sequence
//          (x = group * cs + rank), chosen for speed alone: cluster `group` takes the sequence's clusters group,
//          group + groups, ... in turn (the Q rows loaded once); a grid with more groups than the sequence's
//          clusters leaves the rest at once. Longer runs (mla_prefill_bf16, MT = 2: each K/V tile read from L2
//          serves twice the rows) take one CTA, a cluster of one (cap 1).
//   tile   MLA_BN = 32 keys, double-buffered by cp.async (tile t + 1 loads while tile t computes). 4 MT warps:
//          warp w computes S of m tile w / 4 for keys 8 (w % 4) .. + 7 of the tile over all 576 columns (Q from
//          shared memory by ldmatrix); the row maxima meet in shared memory, so every warp holds the same
//          running max of every row; P goes to shared memory as bf16 and warp w accumulates O's columns
//          512 / (4 MT) w .. of every m tile (V by ldmatrix.trans of the cached rows, each fragment feeding MT
//          m tiles). The key warps keep partial row sums (same max, same rescale), summed at the end. Softmax in
//          the log2 domain (scale * log2(e) folded into `scale`), as attention_mma.cu. The decode kernel's
//          eight-warp form (mla_attention_w8_bf16, KS = 2; mla.py gives it small batches) puts each S tile's two
//          accumulator chains on a warp each, the second's sums added by the first through shared memory in the
//          same order, and O's columns 512 / 8 a warp: the same arithmetic, so the same bits, in twice the warps.
//   merge  each CTA leaves its state (O unnormalised, m, l of every row) in its shared memory; the cluster's CTAs
//          merge them over distributed shared memory, rank r taking columns r * 512 / cs .. of every row, so no
//          single CTA reads every split's 512 columns. With one cluster those are the output; with n, rank r
//          stores its columns as cluster c's partial (slot c of `slots` a row), and the last rank-r CTA of the
//          sequence to arrive merges rank r's columns of the n partials in cluster order (decode_merge.cuh,
//          its own counter, m and l), so the bits do not depend on which cluster finished last.
//
// Mirrored in mla.py: the rows and threads of each kernel, MLA_BN, the shared-memory size, the kernel names, the
// largest cluster, the split rule (decode_clusters), the partials' layout.
#include "common.cuh"
#include "mma.cuh"
#include "decode_merge.cuh"
#include "mla_row.cuh"     // MLA_R, MLA_D, MLA_CHUNKS
#include "mla_merge.cuh"   // MLA_MAX_CLUSTER, the cluster merge

constexpr int MLA_BN = 32, MLA_KEY_WARPS = MLA_BN / 8;   // keys of a tile; warps sharing an m tile's S (8 keys each)
constexpr int MLA_LD = MLA_D + 8;          // smem row stride (bf16): 1168 bytes, ldmatrix rows on distinct banks
constexpr int MLA_PLD = MLA_BN + 8;        // P row stride (bf16)
constexpr int MLA_STAGE = MLA_BN * MLA_LD;     // one K/V tile, bf16 elements

// MT m16 tiles of rows a block (1: decode, split and merged; 2: longer runs, one split); KS warps share each S (1:
// a warp runs both of its accumulator chains; 2: a warp each, the second's sums passed through shared memory),
// 4 MT KS warps; O's columns are spread over all of them.
template <int MT, int KS = 1> struct Mla {
    static constexpr int SWARPS = MLA_KEY_WARPS * MT, WARPS = SWARPS * KS, ROWS = 16 * MT, VCOLS = MLA_R / WARPS;
    // shared memory (bytes): Q rows, two K/V stages, P, the warps' row maxima, the second chains' sums (KS = 2)
    static constexpr int SMEM = ROWS * MLA_LD * 2 + 2 * MLA_STAGE * 2 + ROWS * MLA_PLD * 2 + MLA_KEY_WARPS * ROWS * 4 +
                                (KS - 1) * SWARPS * 32 * 4 * 4;
    // the merge area over the K/V stages: O, m, l, the key warps' l, the cluster's weights and sums of each row
    static constexpr int MERGE = ROWS * MLA_R + 2 * ROWS + MLA_KEY_WARPS * ROWS + ROWS * MLA_MAX_CLUSTER + ROWS;
    static_assert(MERGE * 4 <= 2 * MLA_STAGE * 2, "the merge area must fit over the K/V stages");
};

// Keys k0 .. k0 + MLA_BN - 1 of a sequence into a stage; keys at or past kend are zero rows (masked; 0 * V = 0).
// Lane l of every warp looks up key k0 + l's row (one block-table read, MLA_BN = 32 keys: one a lane) and a chunk's
// copy takes its row's offset by shuffle, so a thread's copies issue back to back instead of each behind a table
// read and a division by the block size.
template <int THREADS>
__device__ __forceinline__ void mla_load_tile(bf16* stage, const bf16* cache, const KvLayout& kv, const int* table,
                                              int k0, int kend) {
    static_assert(MLA_BN == 32 && MLA_BN * MLA_CHUNKS % THREADS == 0, "a key a lane; whole passes of the block");
    const int lane = threadIdx.x & 31;
    const long long off = k0 + lane < kend ? kv.offset(table, k0 + lane, 0, MLA_D) : -1;
#pragma unroll
    for (int p = 0; p < MLA_BN * MLA_CHUNKS / THREADS; ++p) {
        const int i = p * THREADS + threadIdx.x, r = i / MLA_CHUNKS, c = i % MLA_CHUNKS;
        const long long o = __shfl_sync(0xffffffffu, off, r);
        cp_async16(stage + r * MLA_LD + c * 8, o >= 0 ? cache + o + c * 8 : cache, o >= 0 ? 16 : 0);
    }
}

// Warp w computes S of m tile w / 4 for keys 8 (w % 4) .. + 7 of each tile and accumulates O's columns
// VCOLS w .. + VCOLS - 1 of every m tile: each V fragment feeds MT m tiles.
// Partials (a sequence of several clusters): part_o [B, nh, slots, 512] (a cluster's merged rows, normalised),
// part_m / part_l [cs, B, nh, slots] (rank r's copy; M in log2 units and the sum), counters [cs, B, row tiles].
template <int MT, int KS>
__device__ void mla_attention(const bf16* ql, long long ql_stride, const bf16* qp, long long qp_stride,
                              const bf16* cache, long long block_stride, int block_size, const int* tables,
                              int table_stride, const int* qstart, const int* ctx, bf16* out, float* part_o,
                              float* part_m, float* part_l, int* counters, int nh, float scale, int split_keys,
                              int near, int cap, int slots, int cs) {
    using C = Mla<MT, KS>;
    constexpr int ROWS = C::ROWS, VCOLS = C::VCOLS;
    extern __shared__ __align__(16) unsigned char smem_raw[];
    bf16* qs = (bf16*)smem_raw;                        // [ROWS][MLA_LD]
    bf16* kvs = qs + ROWS * MLA_LD;                    // [2][MLA_BN][MLA_LD]
    bf16* ps = kvs + 2 * MLA_STAGE;                    // [ROWS][MLA_PLD]
    float* red = (float*)(ps + ROWS * MLA_PLD);        // [MLA_KEY_WARPS][ROWS]
    float* xch = red + MLA_KEY_WARPS * ROWS;           // [SWARPS][32 lanes][4]: the second chains' sums (KS = 2)
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, gid = lane >> 2, tq = lane & 3;
    // the warp's S: m tile, key group, and accumulator chain (0: columns 32 kk .. + 15 of each 32, 1: + 16 .. + 31;
    // with KS = 1 a warp runs both); chain 0 holds the whole S after the exchange and runs the softmax
    const int sw = KS == 1 ? warp : warp % C::SWARPS, chain = KS == 1 ? 0 : warp / C::SWARPS;
    const int smt = sw / MLA_KEY_WARPS, skw = sw % MLA_KEY_WARPS;
    const int b = blockIdx.z;
    const int q0 = qstart[b], n = qstart[b + 1] - q0, L = ctx[b];
    const int rows = n * nh, row0 = blockIdx.y * ROWS;
    if (row0 >= rows) return;   // the whole cluster (it spans x only); empty runs too (CTA 0 of run 0 stays)
    const int gc = min(ROWS, rows - row0);
    const int kall = L - n + (row0 + gc - 1) / nh + 1;   // keys any row of the block sees
    const int rank = blockIdx.x % cs, groups = gridDim.x / cs, group = blockIdx.x / cs;   // clusters (cs, 1, 1)
    // the sequence's clusters and keys a CTA, from its key count alone (mla.py decode_clusters)
    const int short_n = min(near, (kall + cs * split_keys - 1) / (cs * split_keys));
    const int long_n = min(cap, (kall + cs * split_keys * near - 1) / (cs * split_keys * near));
    const int clusters = max(1, min(slots, max(short_n, long_n)));
    const int split_len = ((kall + clusters * cs - 1) / (clusters * cs) + MLA_BN - 1) / MLA_BN * MLA_BN;
    const int used = (kall + cs * split_len - 1) / (cs * split_len);   // clusters holding keys
    if (group >= used) return;   // the whole cluster
    const KvLayout kv{block_stride, MLA_D, block_size};
    const int* table = tables + (long long)b * table_stride;
    // The first cluster's first tile goes out before griddepcontrol.wait (under PDL, while the kernel before this one
    // still runs) where all its keys were written by earlier steps (common.cuh's rule); a tile holding any of this
    // step's keys (L - n on, written by mla_rope_write) is copied after the wait.
    const int kbeg0 = min(kall, (group * cs + rank) * split_len);
    const bool early = kbeg0 < kall && kbeg0 + MLA_BN <= L - n;
    if (early) mla_load_tile<C::WARPS * 32>(kvs, cache, kv, table, kbeg0, min(kall, kbeg0 + split_len));
    pdl_begin();

    // Q rows (q_latent || q_pe; zeros past the block's rows): cp.async group 0 with the first cluster's first tile
    for (int i = threadIdx.x; i < ROWS * MLA_CHUNKS; i += blockDim.x) {
        const int r = i / MLA_CHUNKS, c = i % MLA_CHUNKS, row = row0 + r;
        const bf16* src = ql;
        if (r < gc) {
            const long long tok = q0 + row / nh, head = row % nh;
            src = c < MLA_R / 8 ? ql + tok * ql_stride + head * MLA_R + c * 8
                                : qp + tok * qp_stride + head * MLA_P + (c - MLA_R / 8) * 8;
        }
        cp_async16(qs + r * MLA_LD + c * 8, src, r < gc ? 16 : 0);
    }
    // this lane's S rows: smt * 16 + gid, + 8 (h = 0, 1), and their positions (-1: a padding row, sees nothing)
    int qpos[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        const int r = smt * 16 + gid + 8 * h;
        qpos[h] = r < gc ? L - n + (row0 + r) / nh : -1;
    }
    const int aoff = (smt * 16 + (lane & 7) + ((lane >> 3) & 1) * 8) * MLA_LD + (lane >> 4) * 8;   // A rows (Q)
    const int poff = ((lane & 7) + ((lane >> 3) & 1) * 8) * MLA_PLD + (lane >> 4) * 8;             // A rows (P)
    const int koff = (8 * skw + (lane & 7)) * MLA_LD + (lane >> 3) * 8;                             // B: 8 keys x 32
    const int voff = ((lane & 7) + ((lane >> 3) & 1) * 8) * MLA_LD + (lane >> 4) * 8 + warp * VCOLS;
    // rank r's copies of m and l, and its counters: [cs][B][...]
    const long long ml_off = (long long)rank * gridDim.z * nh * slots;
    int arrivals = 0;   // this CTA's clusters of the sequence

    for (int clu = group; clu < used; clu += groups, ++arrivals) {
        const int kbeg = min(kall, (clu * cs + rank) * split_len), kend = min(kall, kbeg + split_len);
        const int ntiles = (kend - kbeg + MLA_BN - 1) / MLA_BN;   // 0: a CTA past the keys (its state stays empty)
        if (!(early && clu == group)) mla_load_tile<C::WARPS * 32>(kvs, cache, kv, table, kbeg, kend);
        cp_async_commit();
        // m: the running max of rows mt * 16 + gid (+ 8) of every m tile (all warps agree); l: of the S rows only
        float o[MT][VCOLS / 8][4], m[MT][2], l[2] = {0.f, 0.f};
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
            m[mt][0] = m[mt][1] = NEG_INF;
#pragma unroll
            for (int j = 0; j < VCOLS / 8; ++j) o[mt][j][0] = o[mt][j][1] = o[mt][j][2] = o[mt][j][3] = 0.f;
        }

        for (int t = 0; t < ntiles; ++t) {
            cp_async_wait<0>();
            __syncthreads();   // tile t landed for every thread; every warp is done with tile t - 1's stage and P
            if (t + 1 < ntiles)
                mla_load_tile<C::WARPS * 32>(kvs + ((t + 1) & 1) * MLA_STAGE, cache, kv, table, kbeg + (t + 1) * MLA_BN,
                                             kend);
            cp_async_commit();
            const bf16* kt = kvs + (t & 1) * MLA_STAGE;
            const int k0 = kbeg + t * MLA_BN;

            // S for this warp's 8 keys: rows gid (s[0], s[1]) and gid + 8 (s[2], s[3]), keys 8 skw + 2 tq + {0, 1}
            // two accumulators (columns 32 kk .. + 15 and + 16 .. + 31): half the chain of dependent mmas
            float s[4] = {0.f, 0.f, 0.f, 0.f}, s2[4] = {0.f, 0.f, 0.f, 0.f};
            if constexpr (KS == 1) {
#pragma unroll 6
                for (int kk = 0; kk < MLA_D / 32; ++kk) {
                    unsigned int bk[4], a[4];
                    ldmatrix_x4(bk, kt + koff + kk * 32);
                    ldmatrix_x4(a, qs + aoff + kk * 32);
                    mma_bf16(s, a, bk[0], bk[1]);
                    ldmatrix_x4(a, qs + aoff + kk * 32 + 16);
                    mma_bf16(s2, a, bk[2], bk[3]);
                }
            } else if (chain == 0) {   // this warp's chain alone; chain 1 hands its sums to chain 0
#pragma unroll 6
                for (int kk = 0; kk < MLA_D / 32; ++kk) {
                    unsigned int bk[4], a[4];
                    ldmatrix_x4(bk, kt + koff + kk * 32);
                    ldmatrix_x4(a, qs + aoff + kk * 32);
                    mma_bf16(s, a, bk[0], bk[1]);
                }
            } else {
#pragma unroll 6
                for (int kk = 0; kk < MLA_D / 32; ++kk) {
                    unsigned int bk[4], a[4];
                    ldmatrix_x4(bk, kt + koff + kk * 32);
                    ldmatrix_x4(a, qs + aoff + kk * 32 + 16);
                    mma_bf16(s2, a, bk[2], bk[3]);
                }
            }
            if constexpr (KS == 2) {
                if (chain) *(float4*)(xch + (sw * 32 + lane) * 4) = make_float4(s2[0], s2[1], s2[2], s2[3]);
                __syncthreads();
                if (!chain) {
                    const float4 x = *(const float4*)(xch + (sw * 32 + lane) * 4);
                    s2[0] = x.x, s2[1] = x.y, s2[2] = x.z, s2[3] = x.w;
                }
            }
#pragma unroll
            for (int e = 0; e < 4; ++e) s[e] += s2[e];
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const int key = k0 + 8 * skw + 2 * tq + (e & 1);
                if (key >= kend || key > qpos[e >> 1]) s[e] = NEG_INF;
            }
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                float mx = fmaxf(s[2 * h], s[2 * h + 1]);
                mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
                mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
                if (tq == 0 && chain == 0) red[skw * ROWS + smt * 16 + gid + 8 * h] = mx;
            }
            __syncthreads();
            float alpha[MT][2], base[2], salpha[2];
#pragma unroll
            for (int mt = 0; mt < MT; ++mt)
#pragma unroll
                for (int h = 0; h < 2; ++h) {
                    float mn = m[mt][h];
#pragma unroll
                    for (int w = 0; w < MLA_KEY_WARPS; ++w) mn = fmaxf(mn, red[w * ROWS + mt * 16 + gid + 8 * h]);
                    const float bs = mn == NEG_INF ? 0.f : mn * scale;   // a row that has seen nothing yet
                    alpha[mt][h] = fast_exp2(m[mt][h] * scale - bs);     // m = -inf: 0
                    m[mt][h] = mn;
                    if (mt == smt) { base[h] = bs; salpha[h] = alpha[mt][h]; }
                }
#pragma unroll
            for (int h = 0; h < 2; ++h) l[h] *= salpha[h];
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                s[e] = fast_exp2(fmaf(s[e], scale, -base[e >> 1]));
                l[e >> 1] += s[e];
            }
            if (chain == 0) {
                unsigned int* prow = (unsigned int*)ps;
                prow[(((smt * 16 + gid) * MLA_PLD) + 8 * skw + 2 * tq) / 2] = pack_bf16x2(s[0], s[1]);
                prow[(((smt * 16 + gid + 8) * MLA_PLD) + 8 * skw + 2 * tq) / 2] = pack_bf16x2(s[2], s[3]);
            }
#pragma unroll
            for (int mt = 0; mt < MT; ++mt)
#pragma unroll
                for (int j = 0; j < VCOLS / 8; ++j) {
                    o[mt][j][0] *= alpha[mt][0]; o[mt][j][1] *= alpha[mt][0];
                    o[mt][j][2] *= alpha[mt][1]; o[mt][j][3] *= alpha[mt][1];
                }
            __syncthreads();   // P complete
            // O[:, VCOLS warp ..] += P V over the tile's 32 keys (two k-steps of 16)
#pragma unroll
            for (int kk = 0; kk < MLA_BN / 16; ++kk) {
                unsigned int a[MT][4];
#pragma unroll
                for (int mt = 0; mt < MT; ++mt) ldmatrix_x4(a[mt], ps + poff + mt * 16 * MLA_PLD + kk * 16);
#pragma unroll
                for (int dp = 0; dp < VCOLS / 16; ++dp) {
                    unsigned int bv[4];
                    ldmatrix_x4_trans(bv, kt + voff + kk * 16 * MLA_LD + dp * 16);
#pragma unroll
                    for (int mt = 0; mt < MT; ++mt) {
                        mma_bf16(o[mt][2 * dp], a[mt], bv[0], bv[1]);
                        mma_bf16(o[mt][2 * dp + 1], a[mt], bv[2], bv[3]);
                    }
                }
            }
        }
        cp_async_wait<0>();
        __syncthreads();   // every warp is done with the stages: the merge area goes over them

        // the block's state: O [row][512] unnormalised, m (log2 units) per row, l summed over the key warps
        float* mo = (float*)kvs;
        float* mm = mo + ROWS * MLA_R;
        float* ml = mm + ROWS;
        float* wl = ml + ROWS;                        // [MLA_KEY_WARPS][ROWS]
        float* cw = wl + MLA_KEY_WARPS * ROWS;        // [ROWS][MLA_MAX_CLUSTER]: mla_merge_cluster's weights
        float* cl = cw + ROWS * MLA_MAX_CLUSTER;      // [ROWS]: and sums
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            l[h] += __shfl_xor_sync(0xffffffffu, l[h], 1);
            l[h] += __shfl_xor_sync(0xffffffffu, l[h], 2);
            if (tq == 0 && chain == 0) wl[skw * ROWS + smt * 16 + gid + 8 * h] = l[h];
#pragma unroll
            for (int mt = 0; mt < MT; ++mt) {
                const int r = mt * 16 + gid + 8 * h;
#pragma unroll
                for (int j = 0; j < VCOLS / 8; ++j)
                    *(float2*)(mo + r * MLA_R + warp * VCOLS + 8 * j + 2 * tq) =
                        make_float2(o[mt][j][2 * h], o[mt][j][2 * h + 1]);
                if (tq == 0 && warp == 0) mm[r] = m[mt][h] == NEG_INF ? NEG_INF : m[mt][h] * scale;
            }
        }
        __syncthreads();
        if (threadIdx.x < ROWS) {
            float sum = 0.f;
#pragma unroll
            for (int w = 0; w < MLA_KEY_WARPS; ++w) sum += wl[w * ROWS + threadIdx.x];
            ml[threadIdx.x] = sum;
        }
        mla_cluster_sync(cs);   // every CTA of the cluster holds its state
        const MlaStore st{out, part_o, part_m + ml_off, part_l + ml_off, q0, row0, nh, b, clu, slots, used};
        if constexpr (MT == 1) {
            switch (cs) {
                case 1: mla_merge_cluster<ROWS, 1>(mo, mm, ml, cw, cl, gc, rank, st); break;
                case 2: mla_merge_cluster<ROWS, 2>(mo, mm, ml, cw, cl, gc, rank, st); break;
                case 4: mla_merge_cluster<ROWS, 4>(mo, mm, ml, cw, cl, gc, rank, st); break;
                default: mla_merge_cluster<ROWS, MLA_MAX_CLUSTER>(mo, mm, ml, cw, cl, gc, rank, st);
            }
        } else {   // runs of several tokens: one CTA
            mla_merge_cluster<ROWS, 1>(mo, mm, ml, cw, cl, gc, rank, st);
        }
        mla_cluster_sync(cs);   // the others have read this CTA's state: its shared memory is free
    }
    if constexpr (MT == 1) {   // only decode splits (the merge keeps 16 rows)
        if (used == 1) return;
        const int width = MLA_R / cs;
        merge_splits_if_last<bf16, MLA_R>(part_o, part_m + ml_off, part_l + ml_off,
                                          counters + rank * gridDim.z * gridDim.y, (float*)smem_raw, gc, row0, nh, q0,
                                          b, used, slots, out, rank * width, width, arrivals);
    }
}

#define MLA_KERNEL(NAME, MT, KS)                                                                                   \
    extern "C" __global__ void __launch_bounds__(Mla<MT, KS>::WARPS * 32) NAME(                                     \
        const bf16* ql, long long ql_stride, const bf16* qp, long long qp_stride, const bf16* cache,                \
        long long block_stride, int block_size, const int* tables, int table_stride, const int* qstart,            \
        const int* ctx, bf16* out, float* part_o, float* part_m, float* part_l, int* counters, int nh, float scale, \
        int split_keys, int near, int cap, int slots, int cs) {                                                    \
        mla_attention<MT, KS>(ql, ql_stride, qp, qp_stride, cache, block_stride, block_size, tables, table_stride, \
                          qstart, ctx, out, part_o, part_m, part_l, counters, nh, scale, split_keys, near, cap,    \
                          slots, cs);                                                                              \
    }

MLA_KERNEL(mla_attention_bf16, 1, 1)
MLA_KERNEL(mla_attention_w8_bf16, 1, 2)   // the same bits as mla_attention_bf16, twice the warps: small batches
MLA_KERNEL(mla_prefill_bf16, 2, 1)
