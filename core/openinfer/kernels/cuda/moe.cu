// Mixture-of-experts on CUDA: the router (softmax / sigmoid scores, greedy / group-limited / noaux_tc top-k) and the
// routed experts as grouped GEMMs on the tensor cores (bf16 in, fp32 accumulate), all shapes fixed by the token
// count so a CUDA graph captures them (no host sync: the grouping is decided on the device).
//
//   router_logits the gate in fp32 from bf16 activations.
//   moe_route     one warp a token: scores, group selection, then top_k rounds of a warp argmax (ties: the lower
//                 expert), weights normalised and scaled as numpy_mla_moe.moe_route does (transformers' routers).
//   moe_router    both in one launch: router_logits' grid, and the last block of each ROUTER_TOKENS tokens to
//                 store its logits (an arrival counter a token group) routes those tokens, a warp each.
//   moe_align     one block: counts the (token, slot) pairs of each local expert, lays them out grouped by expert
//                 (`sorted`: pair ids, an expert's run contiguous) and cuts each run into tiles of BM rows
//                 (tile_expert / tile_start / tile_end, *num_tiles of them; the GEMM grids are sized for the most
//                 tiles any routing can give and their extra blocks leave at once); with `row_of`, each pair's
//                 place in that order too (moe_blas.py: the combine then reads the rows in sorted order).
//   moe_gemm      block (n tile, row tile): C[BM x 64] = A rows . W_e^T over K, A rows gathered (x rows of the
//                 tile's tokens for gate_up, the tile's rows of h for down), W_e the expert's [N, K] rows, three
//                 cp.async stages of 64 columns, ldmatrix + mma.sync m16n8k16; 16-row tiles at decode (the warps
//                 split the W rows), 128-row tiles for prefill-sized batches (the warps split the rows).
//                 gate_up: the 64 W rows are 32 gate rows and the 32 matching up rows, so a thread holds gate and
//                 up of the same outputs and writes h = silu(gate) * up (bf16, in sorted order); down: writes
//                 weight * (h . W_down^T) in fp32 at the pair's own row.
//   moe_combine   y[t] = sum over the token's slots (local experts only, slot order) of those rows, plus the
//                 optional addend row (the shared experts' output), in fp32, rounded once. With `row_of` and
//                 `route_w` (moe_blas.py: cuBLAS wrote the rows unweighted, in sorted order) a slot's row is
//                 row_of[pair], times its routing weight: the product the down GEMM's epilogue forms otherwise.
//
// Mirrored in moe.py: the tile sizes, the shared-memory size, the kernel names.
#include "common.cuh"
#include "mma.cuh"

// ---------------------------------------------------------------------------------------------------- router
constexpr int ROUTE_WARPS = 4, ROUTE_PER_LANE = 16;   // experts of a lane: e = lane + 32 j, so E <= 512

// (v, e) beats (bv, be): larger score, ties to the lower expert
__device__ __forceinline__ bool route_better(float v, int e, float bv, int be) {
    return v > bv || (v == bv && e < be);
}

__device__ __forceinline__ void warp_argmax(float& v, int& e, float& w) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        const float ov = __shfl_xor_sync(0xffffffffu, v, o), ow = __shfl_xor_sync(0xffffffffu, w, o);
        const int oe = __shfl_xor_sync(0xffffffffu, e, o);
        if (route_better(ov, oe, v, e)) { v = ov; e = oe; w = ow; }
    }
}

// method: 0 greedy, 1 group_limited_greedy (groups by their best score, others' scores 0), 2 noaux_tc (groups by the
// sum of their two best, others -inf). Experts are chosen on the scores plus the bias where one is given; the
// weights are the scores (kernels/numpy_mla_moe.py: moe_route).
// One warp routes token t of logits x [E] (read through L2: moe_router's other blocks wrote them) into ids[t * k ..]
// and weights[t * k ..].
__device__ void route_token(const float* x, const float* bias, int t, int E, int k, int sigmoid, int method,
                            int n_group, int topk_group, int norm, float routed_scale, int* ids, float* weights) {
    const int lane = threadIdx.x & 31;
    float score[ROUTE_PER_LANE], choice[ROUTE_PER_LANE];
    float mx = NEG_INF;
#pragma unroll
    for (int j = 0; j < ROUTE_PER_LANE; ++j) {
        const int e = lane + 32 * j;
        score[j] = e < E ? __ldcg(x + e) : NEG_INF;
        mx = fmaxf(mx, score[j]);
    }
    if (sigmoid) {
#pragma unroll
        for (int j = 0; j < ROUTE_PER_LANE; ++j) score[j] = 1.f / (1.f + expf(-score[j]));
    } else {
        mx = warp_max(mx);
        float sum = 0.f;
#pragma unroll
        for (int j = 0; j < ROUTE_PER_LANE; ++j) {
            score[j] = lane + 32 * j < E ? expf(score[j] - mx) : 0.f;
            sum += score[j];
        }
        sum = warp_sum(sum);
#pragma unroll
        for (int j = 0; j < ROUTE_PER_LANE; ++j) score[j] /= sum;
    }
#pragma unroll
    for (int j = 0; j < ROUTE_PER_LANE; ++j) {
        const int e = lane + 32 * j;
        choice[j] = e < E ? score[j] + (bias ? bias[e] : 0.f) : NEG_INF;
    }
    if (method != 0 && n_group > 1) {
        // group g's score ends in lane g; the selected groups' bits in `keep`
        const int gs = E / n_group;
        float gscore = NEG_INF;
        for (int g = 0; g < n_group; ++g) {
            float a1 = NEG_INF, a2 = NEG_INF;   // this lane's best two of the group
#pragma unroll
            for (int j = 0; j < ROUTE_PER_LANE; ++j) {
                const int e = lane + 32 * j;
                if (e < E && e / gs == g) {
                    const float v = choice[j];
                    if (v > a1) { a2 = a1; a1 = v; } else if (v > a2) { a2 = v; }
                }
            }
#pragma unroll
            for (int o = 16; o > 0; o >>= 1) {
                const float b1 = __shfl_xor_sync(0xffffffffu, a1, o), b2 = __shfl_xor_sync(0xffffffffu, a2, o);
                const float hi = fmaxf(a1, b1), lo = fmaxf(fminf(a1, b1), fmaxf(a2, b2));
                a1 = hi; a2 = lo;
            }
            if (lane == g) gscore = method == 2 ? a1 + a2 : a1;
        }
        unsigned int keep = 0;
        for (int r = 0; r < topk_group; ++r) {
            float v = lane < n_group && !(keep >> lane & 1u) ? gscore : NEG_INF;
            int g = lane < n_group && !(keep >> lane & 1u) ? lane : 0x7fffffff;
            float unused = 0.f;
            warp_argmax(v, g, unused);
            keep |= 1u << g;
        }
        const float fill = method == 2 ? NEG_INF : 0.f;
#pragma unroll
        for (int j = 0; j < ROUTE_PER_LANE; ++j) {
            const int e = lane + 32 * j;
            if (e < E && !(keep >> (e / gs) & 1u)) choice[j] = fill;
        }
    }
    unsigned int taken = 0;   // this lane's chosen experts, bit j
    float mine = 0.f;         // lane r keeps the weight of round r
    int my_id = 0;
    for (int r = 0; r < k; ++r) {
        float v = NEG_INF, w = 0.f;
        int e = 0x7fffffff;
#pragma unroll
        for (int j = 0; j < ROUTE_PER_LANE; ++j) {
            const int ej = lane + 32 * j;
            if (ej < E && !(taken >> j & 1u) && route_better(choice[j], ej, v, e)) {
                v = choice[j]; e = ej; w = score[j];
            }
        }
        warp_argmax(v, e, w);
        if ((e & 31) == lane) taken |= 1u << (e >> 5);
        if (lane == r) { mine = w; my_id = e; }
    }
    if (norm) mine /= warp_sum(lane < k ? mine : 0.f) + 1e-20f;
    if (lane < k) {
        ids[t * k + lane] = my_id;
        weights[t * k + lane] = mine * routed_scale;
    }
}

extern "C" __global__ void __launch_bounds__(ROUTE_WARPS * 32) moe_route_f32(
    const float* logits, long long stride, const float* bias, int T, int E, int k, int sigmoid, int method,
    int n_group, int topk_group, int norm, float routed_scale, int* ids, float* weights) {
    pdl_begin();
    const int t = blockIdx.x * ROUTE_WARPS + (threadIdx.x >> 5);
    if (t >= T) return;
    route_token(logits + t * stride, bias, t, E, k, sigmoid, method, n_group, topk_group, norm, routed_scale, ids,
                weights);
}

// The gate in fp32 (router_logits): out[t, e] = x[t] . w[e], x bf16 [T, D] (row stride x_stride), w fp32 [E, D].
// A warp per expert and ROUTER_TOKENS tokens, so a gate row is read once per ROUTER_TOKENS tokens.
constexpr int ROUTER_WARPS = 8, ROUTER_TOKENS = 4;

static_assert(ROUTER_TOKENS <= ROUTER_WARPS, "moe_router routes a token group with a warp a token");

__device__ void router_logits_block(const bf16* x, long long x_stride, const float* w, int T, int E, int D,
                                    float* out) {
    const int lane = threadIdx.x & 31, e = blockIdx.x * ROUTER_WARPS + (threadIdx.x >> 5);
    const int t0 = blockIdx.y * ROUTER_TOKENS;
    if (e >= E) return;
    float acc[ROUTER_TOKENS] = {};
    const float* we = w + (long long)e * D;
    // unrolled so that a lane has 8 iterations' loads in flight: rolled, each waited on its own (a decode step's
    // few blocks are latency-bound); the sums keep their order
#pragma unroll 8
    for (int d = lane; d < D; d += 32) {
        const float wv = we[d];
#pragma unroll
        for (int i = 0; i < ROUTER_TOKENS; ++i)
            if (t0 + i < T) acc[i] = fmaf(to_f32(x[(long long)(t0 + i) * x_stride + d]), wv, acc[i]);
    }
#pragma unroll
    for (int i = 0; i < ROUTER_TOKENS; ++i) {
        const float v = warp_sum(acc[i]);
        if (lane == 0 && t0 + i < T) out[(long long)(t0 + i) * E + e] = v;
    }
}

extern "C" __global__ void __launch_bounds__(ROUTER_WARPS * 32) router_logits_bf16(
    const bf16* x, long long x_stride, const float* w, int T, int E, int D, float* out) {
    pdl_begin();
    router_logits_block(x, x_stride, w, T, E, D, out);
}

// router_logits_bf16 then moe_route_f32 (logits [T, E] packed: the scratch they meet in). counters: one int per
// token group (blockIdx.y), zero on entry and left zero (the last block resets its own), so a graph replays cleanly.
extern "C" __global__ void __launch_bounds__(ROUTER_WARPS * 32) moe_router_bf16(
    const bf16* x, long long x_stride, const float* w, int T, int E, int D, float* logits, int* counters,
    const float* bias, int k, int sigmoid, int method, int n_group, int topk_group, int norm, float routed_scale,
    int* ids, float* weights) {
    __shared__ int last;
    pdl_begin();
    router_logits_block(x, x_stride, w, T, E, D, logits);
    __threadfence();   // this block's logits are visible device-wide before it counts
    __syncthreads();
    if (threadIdx.x == 0) {
        last = atomicAdd(counters + blockIdx.y, 1) == gridDim.x - 1;
        if (last) counters[blockIdx.y] = 0;   // every block of the group has arrived
    }
    __syncthreads();
    if (!last) return;
    __threadfence();
    const int t = blockIdx.y * ROUTER_TOKENS + (threadIdx.x >> 5);
    if ((threadIdx.x >> 5) < ROUTER_TOKENS && t < T)
        route_token(logits + (long long)t * E, bias, t, E, k, sigmoid, method, n_group, topk_group, norm, routed_scale,
                    ids, weights);
}

// ----------------------------------------------------------------------------------------------------- align
constexpr int ALIGN_THREADS = 1024, ALIGN_MAX_EXPERTS = 1024;

extern "C" __global__ void __launch_bounds__(ALIGN_THREADS) moe_align(
    const int* ids, int pairs, int e_local, int e_offset, int bm, int* sorted, int* tile_expert, int* tile_start,
    int* tile_end, int* num_tiles, int* row_of) {
    __shared__ int count[ALIGN_MAX_EXPERTS], cursor[ALIGN_MAX_EXPERTS];
    pdl_begin();
    for (int e = threadIdx.x; e < e_local; e += blockDim.x) count[e] = 0;
    __syncthreads();
    for (int p = threadIdx.x; p < pairs; p += blockDim.x) {
        const unsigned int e = (unsigned int)(ids[p] - e_offset);
        if (e < (unsigned int)e_local) atomicAdd(&count[e], 1);
    }
    __syncthreads();
    if (threadIdx.x < 32) {   // warp 0: lane l owns experts [l * per, (l + 1) * per); exclusive scans of rows, tiles
        const int lane = threadIdx.x, per = (e_local + 31) / 32;
        const int e0 = min(e_local, lane * per), e1 = min(e_local, e0 + per);
        int rows = 0, tiles = 0;
        for (int e = e0; e < e1; ++e) { rows += count[e]; tiles += (count[e] + bm - 1) / bm; }
        int row_off = rows, tile_off = tiles;   // inclusive, then exclusive
#pragma unroll
        for (int o = 1; o < 32; o <<= 1) {
            const int r = __shfl_up_sync(0xffffffffu, row_off, o), s = __shfl_up_sync(0xffffffffu, tile_off, o);
            if (lane >= o) { row_off += r; tile_off += s; }
        }
        if (lane == 31) *num_tiles = tile_off;
        row_off -= rows;
        tile_off -= tiles;
        for (int e = e0; e < e1; ++e) {
            const int c = count[e];
            cursor[e] = row_off;
            for (int i = 0; i < c; i += bm, ++tile_off) {
                tile_expert[tile_off] = e;
                tile_start[tile_off] = row_off + i;
                tile_end[tile_off] = row_off + c;
            }
            row_off += c;
        }
    }
    __syncthreads();
    for (int p = threadIdx.x; p < pairs; p += blockDim.x) {
        const unsigned int e = (unsigned int)(ids[p] - e_offset);
        if (e < (unsigned int)e_local) {
            const int at = atomicAdd(&cursor[e], 1);   // order within an expert is free
            sorted[at] = p;
            if (row_of) row_of[p] = at;
        }
    }
}

// ------------------------------------------------------------------------------------------------ grouped GEMM
constexpr int GEMM_WARPS = 4, GEMM_BN = 64, GEMM_BK = 64, GEMM_STAGES = 3, GEMM_LD = GEMM_BK + 8;

// One stage: BM A rows (a_rows[i]: the row's start, null past the tile: zeros) and the 64 W rows (w_rows[r], null
// past N: zeros), columns k0 .. k0 + 63 (zeros at or past K; K % 8 == 0). A zero fill reads nothing but still
// names a global address: `any`.
template <int BM>
__device__ __forceinline__ void gemm_load_stage(bf16* as, bf16* ws, const bf16* const* a_rows,
                                                const bf16* const* w_rows, int k0, int K, const bf16* any) {
    constexpr int CH = GEMM_BK / 8;
    for (int i = threadIdx.x; i < (BM + GEMM_BN) * CH; i += GEMM_WARPS * 32) {
        const int r = i / CH, c = i % CH, k = k0 + c * 8;
        const bf16* row = r < BM ? a_rows[r] : w_rows[r - BM];
        const bool ok = row != nullptr && k < K;
        bf16* dst = r < BM ? as + r * GEMM_LD + c * 8 : ws + (r - BM) * GEMM_LD + c * 8;
        cp_async16(dst, ok ? row + k : any, ok ? 16 : 0);
    }
}

// GATE_UP: a = x [T, K] (row of pair p: token p / topk), w = gate_up [E, 2N, K], out = h [pairs, N] bf16 in sorted
// order. Down: a = h [pairs, K] in sorted order, w = down [E, N, K], out = y [pairs, N] fp32 at the pair's row,
// times its routing weight. A block takes BM = 16 * MT rows; each warp WM of its m16 tiles and WP pairs of n8
// tiles of the 64 W rows: the warps split the W rows (MT = 1: WM 1, WP 1, decode) or the rows (MT = 8: WM 2, WP 4,
// every B fragment then feeds two mma per m tile, prefill). A pair is (gate tile g, up tile g) for gate_up, so a
// thread holds gate and up of the same outputs, and (2g, 2g + 1) for down.
template <int MT, bool GATE_UP>
__device__ void moe_gemm(const bf16* a, long long a_stride, const int* sorted, int topk, const bf16* w,
                         long long w_expert_stride, int N, int K, const int* tile_expert, const int* tile_start,
                         const int* tile_end, const int* num_tiles, const float* route_w, void* out,
                         long long out_stride) {
    constexpr int BM = 16 * MT, STAGE = (BM + GEMM_BN) * GEMM_LD;
    constexpr bool SPLIT_M = MT >= GEMM_WARPS;
    constexpr int WM = SPLIT_M ? MT / GEMM_WARPS : MT, WP = SPLIT_M ? GEMM_BN / 16 : GEMM_BN / 16 / GEMM_WARPS;
    extern __shared__ __align__(16) unsigned char smem_raw[];
    __shared__ const bf16* a_rows[BM];
    __shared__ const bf16* w_rows[GEMM_BN];
    __shared__ int pair_of[BM];
    bf16* sm = (bf16*)smem_raw;
    pdl_wait();   // the trigger follows the main loop (common.cuh)
    const int slot = blockIdx.y;
    if (slot >= *num_tiles) return;
    const int e = tile_expert[slot], r0 = tile_start[slot], m = min(BM, tile_end[slot] - r0);
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, gid = lane >> 2, tq = lane & 3;
    const int n0 = blockIdx.x * (GATE_UP ? GEMM_BN / 2 : GEMM_BN);   // first output column of the block
    const int mbase = SPLIT_M ? warp * WM : 0, pbase = SPLIT_M ? 0 : warp * WP;   // the warp's first m tile, pair
    const bf16* we = w + e * w_expert_stride;
    for (int i = threadIdx.x; i < BM + GEMM_BN; i += blockDim.x) {
        if (i < BM) {
            const int p = i < m ? sorted[r0 + i] : -1;
            pair_of[i] = p;
            const long long row = GATE_UP ? p / topk : r0 + i;   // gate_up: the token's x row; down: h in sorted order
            a_rows[i] = p < 0 ? nullptr : a + row * a_stride;
        } else {
            const int r = i - BM, col = n0 + (GATE_UP ? r % (GEMM_BN / 2) : r);
            const long long wr = GATE_UP && r >= GEMM_BN / 2 ? (long long)N + col : col;
            w_rows[r] = col < N ? we + wr * K : nullptr;
        }
    }
    __syncthreads();
    const int nk = (K + GEMM_BK - 1) / GEMM_BK;
#pragma unroll
    for (int s = 0; s < GEMM_STAGES - 1; ++s) {
        if (s < nk)
            gemm_load_stage<BM>(sm + s * STAGE, sm + s * STAGE + BM * GEMM_LD, a_rows, w_rows, s * GEMM_BK, K, we);
        cp_async_commit();
    }
    // W row of this lane's ldmatrix address for pair pp: gate_up (gate rows, then up rows 32 on), down (2 pp, 2 pp + 1)
    const int brow = GATE_UP ? (lane >> 4) * (GEMM_BN / 2) + (lane & 7) : (lane >> 4) * 8 + (lane & 7);
    const int boff = brow * GEMM_LD + ((lane >> 3) & 1) * 8;
    const int pstride = GATE_UP ? 8 : 16;   // W rows between pairs
    const int aoff = ((lane & 7) + ((lane >> 3) & 1) * 8) * GEMM_LD + (lane >> 4) * 8;
    float acc[WM][WP][2][4];
#pragma unroll
    for (int mt = 0; mt < WM; ++mt)
#pragma unroll
        for (int pp = 0; pp < WP; ++pp)
#pragma unroll
            for (int j = 0; j < 2; ++j) acc[mt][pp][j][0] = acc[mt][pp][j][1] = acc[mt][pp][j][2] = acc[mt][pp][j][3] = 0.f;
    for (int kt = 0; kt < nk; ++kt) {
        cp_async_wait<GEMM_STAGES - 2>();
        __syncthreads();   // stage kt landed everywhere; every warp is done with the stage refilled below
        const int pre = kt + GEMM_STAGES - 1;
        if (pre < nk) {
            bf16* st = sm + (pre % GEMM_STAGES) * STAGE;
            gemm_load_stage<BM>(st, st + BM * GEMM_LD, a_rows, w_rows, pre * GEMM_BK, K, we);
        }
        cp_async_commit();
        const bf16* as = sm + (kt % GEMM_STAGES) * STAGE;
        const bf16* ws = as + BM * GEMM_LD;
#pragma unroll
        for (int kk = 0; kk < GEMM_BK / 16; ++kk) {
            unsigned int af[WM][4];
#pragma unroll
            for (int mt = 0; mt < WM; ++mt) ldmatrix_x4(af[mt], as + (mbase + mt) * 16 * GEMM_LD + aoff + kk * 16);
#pragma unroll
            for (int pp = 0; pp < WP; ++pp) {
                unsigned int b[4];
                ldmatrix_x4(b, ws + (pbase + pp) * pstride * GEMM_LD + boff + kk * 16);
#pragma unroll
                for (int mt = 0; mt < WM; ++mt) {
                    mma_bf16(acc[mt][pp][0], af[mt], b[0], b[1]);
                    mma_bf16(acc[mt][pp][1], af[mt], b[2], b[3]);
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
                            hrow[col] = from_f32<bf16>(silu_mul_f32(acc[mt][pp][0][2 * h + c], acc[mt][pp][1][2 * h + c]));
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

#define MOE_GEMM_KERNEL(MT)                                                                                        \
    extern "C" __global__ void __launch_bounds__(GEMM_WARPS * 32) moe_gate_up_bf16_m##MT(                          \
        const bf16* x, long long x_stride, const int* sorted, int topk, const bf16* w, long long w_expert_stride,   \
        int N, int K, const int* tile_expert, const int* tile_start, const int* tile_end, const int* num_tiles,     \
        bf16* h, long long h_stride) {                                                                             \
        moe_gemm<MT, true>(x, x_stride, sorted, topk, w, w_expert_stride, N, K, tile_expert, tile_start, tile_end,  \
                           num_tiles, nullptr, h, h_stride);                                                       \
    }                                                                                                              \
    extern "C" __global__ void __launch_bounds__(GEMM_WARPS * 32) moe_down_bf16_m##MT(                             \
        const bf16* h, long long h_stride, const int* sorted, int topk, const bf16* w, long long w_expert_stride,   \
        int N, int K, const int* tile_expert, const int* tile_start, const int* tile_end, const int* num_tiles,     \
        const float* route_w, float* y, long long y_stride) {                                                      \
        moe_gemm<MT, false>(h, h_stride, sorted, topk, w, w_expert_stride, N, K, tile_expert, tile_start,           \
                            tile_end, num_tiles, route_w, y, y_stride);                                            \
    }

MOE_GEMM_KERNEL(1)
MOE_GEMM_KERNEL(8)

// ---------------------------------------------------------------------------------------------------- combine
// addend: null or [T, D] bf16 (row stride D); row_of and route_w: both null (y's rows are the pairs', weighted) or
// both given (y's rows in sorted order, unweighted)
extern "C" __global__ void moe_combine_bf16(const float* y, const int* ids, int topk, int e_local, int e_offset,
                                            int D, const bf16* addend, const int* row_of, const float* route_w,
                                            bf16* out) {
    pdl_begin();
    const int t = blockIdx.x;
    for (int c = blockIdx.y * blockDim.x + threadIdx.x; c < D; c += gridDim.y * blockDim.x) {
        float acc = 0.f;
        for (int j = 0; j < topk; ++j) {
            const int p = t * topk + j;
            const unsigned int e = (unsigned int)(ids[p] - e_offset);
            if (e >= (unsigned int)e_local) continue;
            if (row_of) acc += route_w[p] * y[(long long)row_of[p] * D + c];
            else acc += y[(long long)p * D + c];
        }
        if (addend) acc += to_f32(addend[(long long)t * D + c]);
        out[(long long)t * D + c] = from_f32<bf16>(acc);
    }
}
