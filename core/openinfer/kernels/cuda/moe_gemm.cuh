// The routed experts' grouped GEMM on the tensor cores (bf16 in, fp32 accumulate) over the row tiles of moe.cu's
// moe_align ((token, slot) pairs grouped by expert): moe.cu runs it on bf16 expert stacks, quant.cu on INT4 / FP8
// ones (a weight policy W, below and in quant.cu).
//
//   block (n tile, row tile): C[BM x 64] = A rows . W_e^T over K, A rows gathered (x rows of the tile's tokens for
//   gate_up, the tile's rows of h for down), W_e the expert's [N, K] rows, STAGES cp.async stages of 64 columns,
//   ldmatrix + mma.sync m16n8k16; BM = 16 * MT rows: below MT = 4 the warps split the W rows, from MT = 4 on the
//   rows. gate_up: the 64 W rows are 32 gate rows and the 32 matching up rows, so a thread holds gate and up of the
//   same outputs and writes h = silu(gate) * up (bf16, in sorted order); down: writes weight * (h . W_down^T) in
//   fp32 at the pair's own row.
//
// A weight policy W says what a stage holds of the 64 W rows and how the mma gets their bf16 tile:
//   STAGE_BYTES, COPIES  a stage's bytes for W, the copies (cp.async) that fill it
//   expert(e, K)         the policy at expert e's weights
//   Src, src(i, rows, K) what copy i reads of W rows `rows` (-1: zeros), found once a tile: the stages add k0
//   copy(st, i, src, k0, K)  copy i of the stage at columns k0..
//   tile(st, dq)         the bf16 [64][GEMM_LD] tile the mma reads (dq: TILE_BYTES of scratch), block-wide
//   GROUP_KK, scale(st, r, g)  k16 steps per scale group (0: no scales) and the scale of W row r, group g: each
//                        group's products are summed apart and added to the outputs times their scale (fp32)
#pragma once
#include "common.cuh"
#include "mma.cuh"

constexpr int GEMM_WARPS = 4, GEMM_BN = 64, GEMM_BK = 64, GEMM_STAGES = 3, GEMM_LD = GEMM_BK + 8;
constexpr int GEMM_TILE_BYTES = GEMM_BN * GEMM_LD * 2;   // the 64 W rows' k tile in bf16

// bf16 expert stack (an expert every expert_stride elements, rows of K): the stage holds the tile the mma reads.
struct Bf16Experts {
    const bf16* w;
    long long expert_stride;
    static constexpr int GROUP_KK = 0, STAGE_BYTES = GEMM_TILE_BYTES, COPIES = GEMM_BN * GEMM_BK / 8, TILE_BYTES = 0;
    __device__ Bf16Experts expert(int e, int) const { return {w + e * expert_stride, 0}; }
    // row i / 8, its 16-byte chunk i % 8 (zeros at or past K; K % 8 == 0): the chunk's column 0 address, or null
    using Src = const bf16*;
    __device__ Src src(int i, const int* rows, int K) const {
        const int r = rows[i >> 3];
        return r < 0 ? nullptr : w + (long long)r * K + (i & 7) * 8;
    }
    __device__ void copy(unsigned char* st, int i, Src at, int k0, int K) const {
        const int c = i & 7;
        const bool ok = at != nullptr && k0 + c * 8 < K;
        cp_async16(st + ((i >> 3) * GEMM_LD + c * 8) * 2, ok ? at + k0 : w, ok ? 16 : 0);
    }
    __device__ const bf16* tile(const unsigned char* st, bf16*) const { return reinterpret_cast<const bf16*>(st); }
    __device__ float scale(const unsigned char*, int, int) const { return 1.f; }
};

// GATE_UP: a = x [T, K] (row of pair p: token p / topk), w = gate_up [E, 2N, K], out = h [pairs, N] bf16 in sorted
// order. Down: a = h [pairs, K] in sorted order, w = down [E, N, K], out = y [pairs, N] fp32 at the pair's row,
// times its routing weight. A block takes BM = 16 * MT rows; each warp WM of its m16 tiles and WP pairs of n8
// tiles of the 64 W rows: the warps split the W rows (MT < 4: WM = MT, WP 1) or the rows (MT = 8: WM 2, WP 4,
// every B fragment then feeds two mma per m tile). A pair is (gate tile g, up tile g) for gate_up, so a thread
// holds gate and up of the same outputs, and (2g, 2g + 1) for down.
template <int MT, bool GATE_UP, class W, int STAGES = GEMM_STAGES>
__device__ void moe_gemm(const bf16* a, long long a_stride, const int* sorted, int topk, const W& w, int N, int K,
                         const int* tile_expert, const int* tile_start, const int* tile_end, const int* num_tiles,
                         const float* route_w, void* out, long long out_stride) {
    constexpr int BM = 16 * MT, A_BYTES = BM * GEMM_LD * 2, STAGE = A_BYTES + W::STAGE_BYTES;
    constexpr int A_COPIES = BM * GEMM_BK / 8, KK = GEMM_BK / 16;
    constexpr bool SPLIT_M = MT >= GEMM_WARPS;
    constexpr int WM = SPLIT_M ? MT / GEMM_WARPS : MT, WP = SPLIT_M ? GEMM_BN / 16 : GEMM_BN / 16 / GEMM_WARPS;
    static_assert(A_BYTES % 16 == 0 && W::STAGE_BYTES % 16 == 0, "stages keep 16-byte alignment");
    extern __shared__ __align__(16) unsigned char smem_raw[];
    __shared__ const bf16* a_rows[BM];
    __shared__ int w_rows[GEMM_BN];   // the expert's W row of each tile row, -1 past N
    __shared__ int pair_of[BM];
    pdl_wait();   // the trigger follows the main loop (common.cuh)
    const int slot = blockIdx.y;
    if (slot >= *num_tiles) return;
    const int e = tile_expert[slot], r0 = tile_start[slot], m = min(BM, tile_end[slot] - r0);
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, gid = lane >> 2, tq = lane & 3;
    const int n0 = blockIdx.x * (GATE_UP ? GEMM_BN / 2 : GEMM_BN);   // first output column of the block
    const int mbase = SPLIT_M ? warp * WM : 0, pbase = SPLIT_M ? 0 : warp * WP;   // the warp's first m tile, pair
    const W we = w.expert(e, K);
    for (int i = threadIdx.x; i < BM + GEMM_BN; i += blockDim.x) {
        if (i < BM) {
            const int p = i < m ? sorted[r0 + i] : -1;
            pair_of[i] = p;
            const long long row = GATE_UP ? p / topk : r0 + i;   // gate_up: the token's x row; down: h in sorted order
            a_rows[i] = p < 0 ? nullptr : a + row * a_stride;
        } else {
            const int r = i - BM, col = n0 + (GATE_UP ? r % (GEMM_BN / 2) : r);
            w_rows[r] = col >= N ? -1 : GATE_UP && r >= GEMM_BN / 2 ? N + col : col;
        }
    }
    __syncthreads();
    // A thread's copies are the same every stage but for the columns: their sources are found once (a row's chunk
    // c of 8 bf16, null past the tile's rows), so a stage's copies are a compare and a cp.async each in the k loop
    // (finding a source is ~40 instructions: a shared-memory row read, 64-bit arithmetic, branches).
    constexpr int THREADS = GEMM_WARPS * 32, A_PER = (A_COPIES + THREADS - 1) / THREADS;
    constexpr int W_PER = (W::COPIES + THREADS - 1) / THREADS;
    const bf16* a_at[A_PER];
    typename W::Src w_at[W_PER];
#pragma unroll
    for (int j = 0; j < A_PER; ++j) {
        const int i = threadIdx.x + j * THREADS;
        a_at[j] = i < A_COPIES && a_rows[i >> 3] != nullptr ? a_rows[i >> 3] + (i & 7) * 8 : nullptr;
    }
#pragma unroll
    for (int j = 0; j < W_PER; ++j) {
        const int i = threadIdx.x + j * THREADS;
        if (i < W::COPIES) w_at[j] = we.src(i, w_rows, K);
    }
    // one stage: the BM A rows (null past the tile: zeros) and W's copies, columns k0 .. k0 + 63 (zeros at or past
    // K). A zero fill reads nothing but still names a global address: `a`.
    auto load_stage = [&](unsigned char* st, int k0) {
#pragma unroll
        for (int j = 0; j < A_PER; ++j) {
            const int i = threadIdx.x + j * THREADS, c = i & 7;
            if (A_COPIES % THREADS != 0 && i >= A_COPIES) break;
            const bool ok = a_at[j] != nullptr && k0 + c * 8 < K;
            cp_async16(st + ((i >> 3) * GEMM_LD + c * 8) * 2, ok ? a_at[j] + k0 : a, ok ? 16 : 0);
        }
#pragma unroll
        for (int j = 0; j < W_PER; ++j) {
            const int i = threadIdx.x + j * THREADS;
            if (W::COPIES % THREADS != 0 && i >= W::COPIES) break;
            we.copy(st + A_BYTES, i, w_at[j], k0, K);
        }
    };
    const int nk = (K + GEMM_BK - 1) / GEMM_BK;
#pragma unroll
    for (int s = 0; s < STAGES - 1; ++s) {
        if (s < nk) load_stage(smem_raw + s * STAGE, s * GEMM_BK);
        cp_async_commit();
    }
    bf16* dq = reinterpret_cast<bf16*>(smem_raw + STAGES * STAGE);   // W::TILE_BYTES
    // W row of this lane's ldmatrix address for pair pp: gate_up (gate rows, then up rows 32 on), down (2 pp, 2 pp + 1)
    const int brow = GATE_UP ? (lane >> 4) * (GEMM_BN / 2) + (lane & 7) : (lane >> 4) * 8 + (lane & 7);
    const int boff = brow * GEMM_LD + ((lane >> 3) & 1) * 8;
    const int pstride = GATE_UP ? 8 : 16;   // W rows between pairs
    const int aoff = ((lane & 7) + ((lane >> 3) & 1) * 8) * GEMM_LD + (lane >> 4) * 8;
    float acc[WM][WP][2][4], part[WM][WP][2][4];   // part: a scale group's sums (W::GROUP_KK > 0)
#pragma unroll
    for (int mt = 0; mt < WM; ++mt)
#pragma unroll
        for (int pp = 0; pp < WP; ++pp)
#pragma unroll
            for (int j = 0; j < 2; ++j)
#pragma unroll
                for (int i = 0; i < 4; ++i) acc[mt][pp][j][i] = 0.f;
    for (int kt = 0; kt < nk; ++kt) {
        cp_async_wait<STAGES - 2>();
        __syncthreads();   // stage kt landed everywhere; every warp is done with the stage refilled below (and dq)
        const int pre = kt + STAGES - 1;
        if (pre < nk) load_stage(smem_raw + (pre % STAGES) * STAGE, pre * GEMM_BK);
        cp_async_commit();
        const unsigned char* st = smem_raw + (kt % STAGES) * STAGE;
        const bf16* as = reinterpret_cast<const bf16*>(st);
        const bf16* ws = we.tile(st + A_BYTES, dq);
#pragma unroll
        for (int kk = 0; kk < KK; ++kk) {
            unsigned int af[WM][4];
#pragma unroll
            for (int mt = 0; mt < WM; ++mt) ldmatrix_x4(af[mt], as + (mbase + mt) * 16 * GEMM_LD + aoff + kk * 16);
#pragma unroll
            for (int pp = 0; pp < WP; ++pp) {
                unsigned int b[4];
                ldmatrix_x4(b, ws + (pbase + pp) * pstride * GEMM_LD + boff + kk * 16);
#pragma unroll
                for (int mt = 0; mt < WM; ++mt)
#pragma unroll
                    for (int j = 0; j < 2; ++j) {
                        if constexpr (W::GROUP_KK == 0) mma_bf16(acc[mt][pp][j], af[mt], b[2 * j], b[2 * j + 1]);
                        else if (kk % W::GROUP_KK == 0) mma_bf16_first(part[mt][pp][j], af[mt], b[2 * j], b[2 * j + 1]);
                        else mma_bf16(part[mt][pp][j], af[mt], b[2 * j], b[2 * j + 1]);
                    }
            }
            if constexpr (W::GROUP_KK > 0) {
                if (kk % W::GROUP_KK == W::GROUP_KK - 1) {   // the group's sums into the outputs, times its scales
#pragma unroll
                    for (int pp = 0; pp < WP; ++pp)
#pragma unroll
                        for (int j = 0; j < 2; ++j)
#pragma unroll
                            for (int c = 0; c < 2; ++c) {
                                const int r = GATE_UP ? j * (GEMM_BN / 2) + 8 * (pbase + pp) + 2 * tq + c
                                                      : 16 * (pbase + pp) + 8 * j + 2 * tq + c;
                                const float s = we.scale(st + A_BYTES, r, kk / W::GROUP_KK);
#pragma unroll
                                for (int mt = 0; mt < WM; ++mt)
#pragma unroll
                                    for (int h = 0; h < 2; ++h)
                                        acc[mt][pp][j][2 * h + c] = fmaf(s, part[mt][pp][j][2 * h + c],
                                                                         acc[mt][pp][j][2 * h + c]);
                            }
                }
            }
        }
    }
    cp_async_wait<0>();
    pdl_trigger();
    // thread's outputs: rows (mbase + mt) * 16 + gid (+ 8), columns 2 tq + {0, 1} of each n8 tile
#pragma unroll
    for (int mt = 0; mt < WM; ++mt)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const int row = (mbase + mt) * 16 + gid + 8 * h;
            if (row >= m) continue;
#pragma unroll
            for (int pp = 0; pp < WP; ++pp) {
                if constexpr (GATE_UP) {
                    bf16* hrow = (bf16*)out + (long long)(r0 + row) * out_stride;
#pragma unroll
                    for (int c = 0; c < 2; ++c) {
                        const int col = n0 + 8 * (pbase + pp) + 2 * tq + c;
                        if (col < N)
                            hrow[col] = from_f32<bf16>(silu_mul_f32(acc[mt][pp][0][2 * h + c],
                                                                    acc[mt][pp][1][2 * h + c]));
                    }
                } else {
                    const int p = pair_of[row];
                    const float rw = route_w[p];
                    float* yrow = (float*)out + (long long)p * out_stride;
#pragma unroll
                    for (int j = 0; j < 2; ++j)
#pragma unroll
                        for (int c = 0; c < 2; ++c) {
                            const int col = n0 + 16 * (pbase + pp) + 8 * j + 2 * tq + c;
                            if (col < N) yrow[col] = rw * acc[mt][pp][j][2 * h + c];
                        }
                }
            }
        }
}
