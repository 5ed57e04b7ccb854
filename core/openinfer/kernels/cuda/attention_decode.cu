// GQA decode attention over paged KV on the tensor cores (bf16 activations; bf16 or fp8 caches, DecTile): one
// query token per sequence, which sees keys 0 .. L - 1 (L = its context length). Same contract as paged_decode
// in attention.cu (which still serves float32), and the same split rule and in-kernel merge (decode_merge.cuh).
//
//   grid   (group, kv head * head chunk, sequence); DEC_WARPS warps a block. A block owns one KV head
//          and up to 16 of its query heads (the rows of one m16 tile, zero-padded past the group), so
//          each K/V byte is read from HBM once per step, whatever the GQA ratio. Each sequence cuts its
//          own keys into splits by its key count alone (decode_split_len: split_keys, near, cap), in whole
//          passes (DEC_WARPS * DEC_BN keys), so its arithmetic is the same in any batch and any grid (a
//          CUDA graph's, sized for the model's length); block `group` takes the sequence's splits group,
//          group + groups, ... in turn (Q loaded once), so the grid's x changes the speed, never the bits.
//          Groups past the sequence's `used` splits leave at once, and the merge waits for and reads only those.
//   warp   takes every DEC_WARPS-th tile of DEC_BN = 16 keys of the split and streams them through its
//          own STAGES-deep cp.async ring in shared memory: no block barrier in the loop, STAGES - 1
//          tiles of every warp in flight, which is what keeps HBM busy. S = Q K^T and O += P V by
//          mma.sync m16n8k16 (fragments by ldmatrix, .trans for V; Q fragments straight from global; over
//          fp8 caches read from the bytes, kv8_scores / kv8_pv), online softmax in the log2 domain (S scaled
//          by scale * log2(e) in fp32), as attention_mma.cu.
//   merge  the warps' (m, l, O) meet in shared memory (over the rings once all are drained; fp8: past them,
//          while the block's next split's copies land); the block
//          stores the normalized row (the context has one split) or its split's partial, and the last
//          block of a (sequence, head chunk) to finish merges the partials in split order (merge_splits_if_last).
//          Merging the splits of a thread-block cluster over distributed shared memory instead measured
//          slower in the engine's decode step on the H100 and the H200, and is not built.
//
// Mirrored in attention_decode.py: DEC_WARPS, DEC_BN, DEC_ROWS, STAGES per head dim, the smem size, the split rule.
#include "common.cuh"
#include "mma.cuh"
#include "decode_merge.cuh"
#include "fp8.cuh"

constexpr int DEC_WARPS = 4, DEC_BN = 16, DEC_ROWS = 16;

// E: the cache's element, bf16 or an fp8 byte (fp8.cuh). An fp8 ring holds the tiles as stored (rows of D bytes,
// 16-byte chunks swizzled: kv8_chunk), half a bf16 ring's bytes a stage. Its lanes read their tensor-core
// fragments from it directly, converting each byte pair to f16 (kv8_scores, kv8_pv), and its products run in f16
// (Q rounded to f16).
template <int D, typename E = bf16> struct DecTile {
    static constexpr bool KV8 = sizeof(E) == 1;
    static constexpr int LD = D + 8;                      // smem row stride (bf16): the pad keeps ldmatrix conflict-free
    static constexpr int ROW = KV8 ? D : LD;              // a ring row's elements
    // keys a tile: fp8 rows up to d128 take 32 (a tile's fixed work, the softmax and O's rescale, over twice the keys)
    static constexpr int BN = KV8 && D <= 128 ? 32 : DEC_BN;
    // bf16 d256: two blocks of three stages would not fit an SM; fp8: the bytes of three 16-key stages
    static constexpr int STAGES = KV8 ? (BN == 32 ? 2 : 3) : D <= 128 ? 3 : 2;
    static constexpr int STAGE = 2 * BN * ROW;            // K rows then V rows of one tile
    static constexpr int RING = STAGES * STAGE;           // one warp's ring, elements
    static constexpr int WARP_BYTES = RING * sizeof(E);
    static constexpr bool Q_IN_REGS = D <= 128;           // d256: o[] alone takes 128 registers
    // fp8: the warps' merge area lies past the rings (two blocks still share an SM), so a block's next split's
    // copies go out before it merges the current one; bf16: laid over the rings (apart, one block an SM).
    static constexpr int MERGE_AT = KV8 ? DEC_WARPS * WARP_BYTES : 0;
};

// Where an fp8 ring row r (0 .. 15 of its K or V rows) keeps its 16-byte chunk c: the chunk index XOR-ed with bits
// of r, so that the fragment reads of kv8_scores (rows 2p, 2p + 1, chunks 4 q .. 4 q + 3 a quarter-warp) and of
// kv8_pv (rows 0, 2, 4, 6 or 1, 3, 5, 7, chunks 2p, 2p + 1) meet no bank twice.
template <int D> __device__ __forceinline__ int kv8_chunk(int r, int c) {
    return c ^ ((((r & 1) << 2) ^ (r & 6)) & (D / 16 - 1));
}

// One warp copies the K and V rows of keys k0 .. k0 + 15 into a stage. Lane l (and l + 16) looks up
// key k0 + l % 16 (one block-table read); rows then move as 16-byte cp.async. Keys at or past kend are
// zero rows (masked below; 0 * V stays finite).
template <int D, typename E>
__device__ __forceinline__ void warp_load_kv(E* stage, const E* kc, const E* vc, const KvLayout& kv,
                                             const int* table, int kvh, int k0, int kend) {
    constexpr int LD = DecTile<D, E>::ROW, CH = 16 / sizeof(E), VW = D / CH;   // CH elements a 16-byte chunk
    constexpr int BN = DecTile<D, E>::BN;
    static_assert((BN * VW) % 32 == 0 && BN <= 32, "a tile's chunks must split evenly over the lanes");
    const int lane = threadIdx.x & 31, key = k0 + (lane & (BN - 1));
    const long long off = key < kend ? kv.offset(table, key, kvh, D) : -1;
#pragma unroll
    for (int it = 0; it < BN * VW / 32; ++it) {
        const int idx = it * 32 + lane, r = idx / VW, c = idx % VW;
        const long long o = __shfl_sync(0xffffffffu, off, r);
        const int bytes = o >= 0 ? 16 : 0;
        const long long src = o >= 0 ? o + c * CH : 0;
        const int at = (sizeof(E) == 1 ? kv8_chunk<D>(r, c) : c) * CH;
        cp_async16(stage + r * LD + at, kc + src, bytes);
        cp_async16(stage + (BN + r) * LD + at, vc + src, bytes);
    }
}

// Key `key` (row r of a stage the prologue filled before griddepcontrol.wait) copied again, by plain
// coherent loads once the copies in flight have landed: the kernel before this one wrote it.
template <int D, typename E>
__device__ __forceinline__ void warp_reload_key(E* stage, const E* kc, const E* vc, const KvLayout& kv,
                                                const int* table, int kvh, int key, int r) {
    constexpr int LD = DecTile<D, E>::ROW, CH = 16 / sizeof(E), VW = D / CH;
    const int lane = threadIdx.x & 31;
    const long long off = kv.offset(table, key, kvh, D);
    cp_async_wait<0>();
    __syncwarp();
    for (int idx = lane; idx < 2 * VW; idx += 32) {
        const int c = idx % VW;
        const bool is_v = idx >= VW;
        const uint4 val = __ldcg(reinterpret_cast<const uint4*>((is_v ? vc : kc) + off + c * CH));
        const int at = (sizeof(E) == 1 ? kv8_chunk<D>(r, c) : c) * CH;
        *reinterpret_cast<uint4*>(stage + ((is_v ? DecTile<D, E>::BN : 0) + r) * LD + at) = val;
    }
    __syncwarp();
}

// This warp's tiles of keys kbeg .. kend - 1 (tiles of BN keys, every DEC_WARPS-th from tile `warp`), and
// the first STAGES - 1 of them copied into its ring (one commit group a stage, empty past the last tile).
template <int D, typename E>
__device__ __forceinline__ int warp_prologue(E* ring, const E* kc, const E* vc, const KvLayout& kv,
                                             const int* table, int kvh, int kbeg, int kend, int warp) {
    constexpr int STAGE = DecTile<D, E>::STAGE, STAGES = DecTile<D, E>::STAGES;
    constexpr int BN = DecTile<D, E>::BN;
    const int nall = kend > kbeg ? (kend - kbeg + BN - 1) / BN : 0;
    const int ntiles = nall > warp ? (nall - warp + DEC_WARPS - 1) / DEC_WARPS : 0;
#pragma unroll
    for (int s = 0; s < STAGES - 1; ++s) {
        if (s < ntiles)
            warp_load_kv<D, E>(ring + s * STAGE, kc, vc, kv, table, kvh, kbeg + (warp + s * DEC_WARPS) * BN, kend);
        cp_async_commit();  // possibly empty: wait<STAGES - 1> below always means "tile t has landed"
    }
    return ntiles;
}

// The A fragment of Q rows (heads) for k-step kk: this lane's words of rows gid and gid + 8
// (null: a padding row, zeros), columns 16 kk + 2 tq (+ 8).
__device__ __forceinline__ void q_fragment(unsigned int* a, const unsigned int* lo, const unsigned int* hi, int kk,
                                           int tq) {
    a[0] = lo ? lo[kk * 8 + tq] : 0u;
    a[1] = hi ? hi[kk * 8 + tq] : 0u;
    a[2] = lo ? lo[kk * 8 + 4 + tq] : 0u;
    a[3] = hi ? hi[kk * 8 + 4 + tq] : 0u;
}

// Over an fp8 ring the head dims of S = Q K^T are taken in the order that gives each lane whole words of a key row:
// k-step kk = 4 q + i of the products takes, at its positions 2 tq, 2 tq + 1, 2 tq + 8, 2 tq + 9, dims
// 64 q + 16 tq + 4 i + 0 .. 3 (a sum over all of them in another order: the same S up to rounding). The A fragment
// of Q rows (heads) for k-step kk in that order, rounded to f16.
__device__ __forceinline__ void q_fragment_kv8(unsigned int* a, const unsigned int* lo, const unsigned int* hi,
                                               int kk, int tq) {
    const int w = (kk >> 2) * 32 + tq * 8 + (kk & 3) * 2;
    a[0] = lo ? bf16x2_to_f16x2(lo[w]) : 0u;
    a[1] = hi ? bf16x2_to_f16x2(hi[w]) : 0u;
    a[2] = lo ? bf16x2_to_f16x2(lo[w + 1]) : 0u;
    a[3] = hi ? bf16x2_to_f16x2(hi[w + 1]) : 0u;
}

// s[j] += Q K^T over an fp8 stage's keys 8 j .. 8 j + 7, j < NJ (lane: key gid + 8 j): one 16-byte read a 64-dim
// quarter of a key row gives four k-steps' B fragments, two conversions each. qf: Q's fragments (Q_IN_REGS), else
// read from qlo / qhi.
template <int D, int NJ, bool Q_IN_REGS>
__device__ __forceinline__ void kv8_scores(float (*s)[4], const unsigned char* kt, const unsigned int (*qf)[4],
                                           const unsigned int* qlo, const unsigned int* qhi, int gid, int tq) {
#pragma unroll
    for (int qd = 0; qd < D / 64; ++qd) {
        const int at = kv8_chunk<D>(gid, 4 * qd + tq) * 16;   // rows gid + 8 j share gid's swizzle
        unsigned int w[NJ][4];
#pragma unroll
        for (int j = 0; j < NJ; ++j) {
            const uint4 k = *reinterpret_cast<const uint4*>(kt + (gid + 8 * j) * D + at);
            w[j][0] = k.x; w[j][1] = k.y; w[j][2] = k.z; w[j][3] = k.w;
        }
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            unsigned int a[4], b0, b1;
            if constexpr (Q_IN_REGS) {
                a[0] = qf[4 * qd + i][0]; a[1] = qf[4 * qd + i][1]; a[2] = qf[4 * qd + i][2]; a[3] = qf[4 * qd + i][3];
            } else {
                q_fragment_kv8(a, qlo, qhi, 4 * qd + i, tq);
            }
#pragma unroll
            for (int j = 0; j < NJ; ++j) {
                e4m3x4_to_f16x4(w[j][i], b0, b1);
                mma_f16(s[j], a, b0, b1);
            }
        }
    }
}

// Over an fp8 ring O's head dims are spread over the n-tiles so that a lane reads whole words of value rows: lane
// gid reads W bytes (dims 8 W b + W gid ..) of rows 2 tq, 2 tq + 1, 2 tq + 8, 2 tq + 9, and byte e of them is
// n-tile W b + e's column gid (DecCols).
template <int D> struct Kv8Pv {
    static constexpr int W = D >= 128 ? 16 : 8;   // bytes a lane reads of a value row, per 8 W dims
};

// Where the warp merge keeps head dim dd of a row (decode_merge.cuh): a lane stores n-tile t's columns n = 2 tq,
// 2 tq + 1 at 8 t + n, which over a bf16 ring are dims 8 t + n, over an fp8 ring dims 8 W (t / W) + W n + t % W.
template <int D, bool KV8> struct DecCols {
    __device__ static int of(int dd) {
        if constexpr (!KV8) return dd;
        constexpr int W = Kv8Pv<D>::W;
        const int rem = dd % (8 * W);
        return 8 * (W * (dd / (8 * W)) + rem % W) + rem / W;
    }
};

// o += P V over an fp8 stage's values (vt: its V rows), P the A fragment of the tile's 16 keys: the byte pairs a
// B fragment needs (keys 2 tq, 2 tq + 1 of one dim; 2 tq + 8, 2 tq + 9) gathered by byte permutes of two rows'
// words, one conversion a pair.
template <int D>
__device__ __forceinline__ void kv8_pv(float (*o)[4], const unsigned char* vt, const unsigned int* a, int gid,
                                       int tq) {
    constexpr int W = Kv8Pv<D>::W, NW = W / 4;
#pragma unroll
    for (int b = 0; b < D / (8 * W); ++b) {
        const int dim = 8 * W * b + W * gid;
        unsigned int rows[4][NW];
#pragma unroll
        for (int k = 0; k < 4; ++k) {
            const int r = 2 * tq + (k & 1) + (k >> 1) * 8;
            const unsigned char* p = vt + r * D + kv8_chunk<D>(r, dim / 16) * 16 + dim % 16;
            if constexpr (W == 16) {
                const uint4 v = *reinterpret_cast<const uint4*>(p);
                rows[k][0] = v.x; rows[k][1] = v.y; rows[k][2] = v.z; rows[k][3] = v.w;
            } else {
                const uint2 v = *reinterpret_cast<const uint2*>(p);
                rows[k][0] = v.x; rows[k][1] = v.y;
            }
        }
#pragma unroll
        for (int w = 0; w < NW; ++w) {
            unsigned int b0[4], b1[4];   // n-tiles W b + 4 w + 0 .. 3
            e4m3x4_to_f16x4(__byte_perm(rows[0][w], rows[1][w], 0x5140), b0[0], b0[1]);
            e4m3x4_to_f16x4(__byte_perm(rows[0][w], rows[1][w], 0x7362), b0[2], b0[3]);
            e4m3x4_to_f16x4(__byte_perm(rows[2][w], rows[3][w], 0x5140), b1[0], b1[1]);
            e4m3x4_to_f16x4(__byte_perm(rows[2][w], rows[3][w], 0x7362), b1[2], b1[3]);
#pragma unroll
            for (int x = 0; x < 4; ++x) mma_f16(o[W * b + 4 * w + x], a, b0[x], b1[x]);
        }
    }
}

template <int D, typename E>
__device__ void decode_mma(const bf16* q, long long q_stride, const E* kc, const E* vc, KvLayout kv,
                           const int* tables, int table_stride, const int* qstart, const int* ctx, bf16* out,
                           float* part_o, float* part_m, float* part_l, int* counters, int nh, int nkv,
                           float scale, int split_keys, int near, int cap, int slots) {
    using C = DecTile<D, E>;
    constexpr int LD = C::LD, KC = D / 16, DT = D / 8, STAGES = C::STAGES, BN = C::BN, NJ = BN / 8;
    constexpr int PASS = DEC_WARPS * BN;
    extern __shared__ __align__(16) unsigned char smem_raw[];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, gid = lane >> 2, tq = lane & 3;
    const int b = blockIdx.z, group = blockIdx.x, G = nh / nkv, chunks = (G + DEC_ROWS - 1) / DEC_ROWS;
    const int kvh = blockIdx.y / chunks, g0 = (blockIdx.y % chunks) * DEC_ROWS, gc = min(DEC_ROWS, G - g0);
    const int q0 = qstart[b], q1 = qstart[b + 1], L = ctx[b];   // loaded together: one round trip, not two
    if (q1 == q0) return;  // no query this step: every block of it leaves, none counts or merges
    int used;
    const int split_len = decode_split_len(L, split_keys, near, cap, slots, PASS, used);
    if (group >= used) return;  // no split of this context left for it: neither stores, counts nor merges
    const int* table = tables + (long long)b * table_stride;
    E* ring = (E*)(smem_raw + warp * C::WARP_BYTES);
    // The first split's prologue copies go out before griddepcontrol.wait (under PDL, while the kernel before this
    // one still runs): the keys before L - 1 were written by earlier steps. Key L - 1, this step's, is being
    // written by that kernel (rope_write_kv), so its row is copied again after the wait. Later splits' copies
    // all go out after it.
    int kbeg = group * split_len, kend = min(L, kbeg + split_len);
    int ntiles = warp_prologue<D, E>(ring, kc, vc, kv, table, kvh, kbeg, kend, warp);
    pdl_begin();
    // Q (the kernel before wrote it) is loaded before key L - 1 is copied again, so that the two reads share
    // one round trip
    const bf16* qrow = q + (long long)q0 * q_stride + (long long)(kvh * G + g0) * D;
    const unsigned int* qlo = gid < gc ? (const unsigned int*)(qrow + gid * D) : nullptr;
    const unsigned int* qhi = gid + 8 < gc ? (const unsigned int*)(qrow + (gid + 8) * D) : nullptr;
    unsigned int qf[C::Q_IN_REGS ? KC : 1][4];
    if constexpr (C::Q_IN_REGS) {
#pragma unroll
        for (int kk = 0; kk < KC; ++kk) {
            if constexpr (C::KV8) q_fragment_kv8(qf[kk], qlo, qhi, kk, tq);
            else q_fragment(qf[kk], qlo, qhi, kk, tq);
        }
    }
    if (kend == L) {
        const int tile = (L - 1 - kbeg) / BN, s = tile / DEC_WARPS;
        if (tile % DEC_WARPS == warp && s < STAGES - 1)
            warp_reload_key<D, E>(ring + s * C::STAGE, kc, vc, kv, table, kvh, L - 1, (L - 1 - kbeg) % BN);
    }
    const int koff = ((lane & 7) + ((lane >> 4) & 1) * 8) * LD + ((lane >> 3) & 1) * 8;
    const int voff = ((lane & 7) + ((lane >> 3) & 1) * 8) * LD + (lane >> 4) * 8;
    const int head0 = kvh * G + g0;
    int arrivals = 0;  // the splits this block took

    for (int split = group;;) {
        // this lane holds rows gid, gid + 8 (h = 0, 1) and key columns 2 tq + {0, 1} of each 8-key n-tile
        float o[DT][4], m[2] = {NEG_INF, NEG_INF}, l[2] = {0.f, 0.f};
#pragma unroll
        for (int j = 0; j < DT; ++j) o[j][0] = o[j][1] = o[j][2] = o[j][3] = 0.f;

        for (int t = 0; t < ntiles; ++t) {
            const int pre = t + STAGES - 1;
            if (pre < ntiles)
                warp_load_kv<D, E>(ring + (pre % STAGES) * C::STAGE, kc, vc, kv, table, kvh,
                                kbeg + (warp + pre * DEC_WARPS) * BN, kend);
            cp_async_commit();
            cp_async_wait<STAGES - 1>();
            __syncwarp();  // every lane's copies of tile t are visible to the whole warp
            const E* kt = ring + (t % STAGES) * C::STAGE;
            const E* vt = kt + BN * C::ROW;
            const int k0 = kbeg + (warp + t * DEC_WARPS) * BN;

            float s[NJ][4];
#pragma unroll
            for (int j = 0; j < NJ; ++j) s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.f;
            if constexpr (C::KV8) {
                kv8_scores<D, NJ, C::Q_IN_REGS>(s, kt, qf, qlo, qhi, gid, tq);
            } else {
#pragma unroll
                for (int kk = 0; kk < KC; ++kk) {
                    unsigned int a[4], bk[4];
                    if constexpr (C::Q_IN_REGS) {
                        a[0] = qf[kk][0]; a[1] = qf[kk][1]; a[2] = qf[kk][2]; a[3] = qf[kk][3];
                    } else {
                        q_fragment(a, qlo, qhi, kk, tq);
                    }
                    ldmatrix_x4(bk, kt + koff + kk * 16);
                    mma_bf16(s[0], a, bk[0], bk[1]);
                    mma_bf16(s[1], a, bk[2], bk[3]);
                }
            }
            if (k0 + BN > kend) {  // the split's last tile: keys past its end
#pragma unroll
                for (int j = 0; j < NJ; ++j)
#pragma unroll
                    for (int e = 0; e < 4; ++e)
                        if (k0 + 8 * j + 2 * tq + (e & 1) >= kend) s[j][e] = NEG_INF;
            }
            // online softmax: m in raw score units (scale > 0), probabilities exp2(s * scale - m * scale);
            // key k0 < kend is valid, so every row's max is finite from the first tile on
            float base[2], alpha[2];
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                float mx = fmaxf(m[h], fmaxf(fmaxf(s[0][2 * h], s[0][2 * h + 1]), fmaxf(s[1][2 * h], s[1][2 * h + 1])));
#pragma unroll
                for (int j = 2; j < NJ; ++j) mx = fmaxf(mx, fmaxf(s[j][2 * h], s[j][2 * h + 1]));
                mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
                mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
                base[h] = mx * scale;
                alpha[h] = fast_exp2(m[h] * scale - base[h]);  // m = -inf (first tile): 0
                m[h] = mx;
                l[h] *= alpha[h];
            }
#pragma unroll
            for (int j = 0; j < NJ; ++j)
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    s[j][e] = fast_exp2(fmaf(s[j][e], scale, -base[e >> 1]));
                    l[e >> 1] += s[j][e];
                }
#pragma unroll
            for (int j = 0; j < DT; ++j) {
                o[j][0] *= alpha[0]; o[j][1] *= alpha[0];
                o[j][2] *= alpha[1]; o[j][3] *= alpha[1];
            }
            // O += P V: the S accumulators of n-tiles 2 ks, 2 ks + 1 are the A fragment of keys 16 ks .. 16 ks + 15
#pragma unroll
            for (int ks = 0; ks < BN / 16; ++ks) {
                const unsigned int a[4] = {pack16<C::KV8>(s[2 * ks][0], s[2 * ks][1]),
                                           pack16<C::KV8>(s[2 * ks][2], s[2 * ks][3]),
                                           pack16<C::KV8>(s[2 * ks + 1][0], s[2 * ks + 1][1]),
                                           pack16<C::KV8>(s[2 * ks + 1][2], s[2 * ks + 1][3])};
                if constexpr (C::KV8) {
                    kv8_pv<D>(o, vt + 16 * ks * D, a, gid, tq);
                } else {
#pragma unroll
                    for (int dp = 0; dp < D / 16; ++dp) {
                        unsigned int bv[4];
                        ldmatrix_x4_trans(bv, vt + voff + dp * 16);
                        mma_bf16(o[2 * dp], a, bv[0], bv[1]);
                        mma_bf16(o[2 * dp + 1], a, bv[2], bv[3]);
                    }
                }
            }
            __syncwarp();  // the stage is consumed before a later iteration refills it
        }
        cp_async_wait<0>();  // only empty groups remain
        if constexpr (C::MERGE_AT > 0) {   // the rings are drained and the merge area lies apart
            if (split + (int)gridDim.x < used) {
                kbeg = (split + gridDim.x) * split_len;
                kend = min(L, kbeg + split_len);
                ntiles = warp_prologue<D, E>(ring, kc, vc, kv, table, kvh, kbeg, kend, warp);
            }
        }

        // merge the warps (over the drained rings, or apart): O [warp][row][D] unnormalized, m (log2 units) and l
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            l[h] += __shfl_xor_sync(0xffffffffu, l[h], 1);
            l[h] += __shfl_xor_sync(0xffffffffu, l[h], 2);
        }
        __syncthreads();
        float* mo = (float*)(smem_raw + C::MERGE_AT);
        float* mm = mo + DEC_WARPS * DEC_ROWS * D;
        float* ml = mm + DEC_WARPS * DEC_ROWS;
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const int r = warp * DEC_ROWS + gid + 8 * h;
#pragma unroll
            for (int j = 0; j < DT; ++j)
                *(float2*)(mo + r * D + 8 * j + 2 * tq) = make_float2(o[j][2 * h], o[j][2 * h + 1]);
            if (tq == 0) {
                mm[r] = m[h] == NEG_INF ? NEG_INF : m[h] * scale;  // a warp without tiles: -inf, l = 0
                ml[r] = l[h];
            }
        }
        __syncthreads();
        store_merged_warps<bf16, DEC_WARPS, DEC_ROWS, D, DecCols<D, C::KV8>>(mm, ml, mo, gc, head0, nh, q0, b, split,
                                                                            used, slots, out, part_o, part_m, part_l);
        ++arrivals;
        split += gridDim.x;
        if (split >= used) break;
        if constexpr (C::MERGE_AT == 0) {
            __syncthreads();  // the merge area is read before the next split's copies land over it
            kbeg = split * split_len;
            kend = min(L, kbeg + split_len);
            ntiles = warp_prologue<D, E>(ring, kc, vc, kv, table, kvh, kbeg, kend, warp);
        }
    }
    if (used > 1)
        merge_splits_if_last<bf16, D, D >= 128>(part_o, part_m, part_l, counters, (float*)smem_raw, gc, head0, nh, q0,
                                              b, used, slots, out, 0, D, arrivals);
}

// (threads, 1): without a residency floor ptxas held d64 to 128 registers and spilled the split loop's state.
// paged_decode_mma_bf16_d<D> reads bf16 caches, paged_decode_mma_bf16_kv8_d<D> fp8 ones.
#define DECODE_KERNEL(D, NAME, E)                                                                               \
    extern "C" __global__ void __launch_bounds__(DEC_WARPS * 32, 1) paged_decode_mma_bf16_##NAME(               \
        const bf16* q, long long q_stride, const E* kc, const E* vc, long long block_stride,                     \
        long long token_stride, int block_size, const int* tables, int table_stride, const int* qstart,        \
        const int* ctx, bf16* out, float* part_o, float* part_m, float* part_l, int* counters, int nh, int nkv, \
        float scale, int split_keys, int near, int cap, int slots) {                                            \
        decode_mma<D, E>(q, q_stride, kc, vc, KvLayout{block_stride, token_stride, block_size}, tables,         \
                      table_stride, qstart, ctx, out, part_o, part_m, part_l, counters, nh, nkv, scale,         \
                      split_keys, near, cap, slots);                                                            \
    }

DECODE_KERNEL(64, d64, bf16)
DECODE_KERNEL(128, d128, bf16)
DECODE_KERNEL(256, d256, bf16)
DECODE_KERNEL(64, kv8_d64, unsigned char)
DECODE_KERNEL(128, kv8_d128, unsigned char)
DECODE_KERNEL(256, kv8_d256, unsigned char)
