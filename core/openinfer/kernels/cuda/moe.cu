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
//   moe_gemm      the grouped GEMMs (moe_gemm.cuh): gate_up writes h = silu(gate x) * up x (bf16, in sorted order),
//                 down weight * (h . W_down^T) in fp32 at the pair's own row; 16-row tiles at decode, 128-row tiles
//                 for prefill-sized batches.
//   moe_combine   y[t] = sum over the token's slots (local experts only, slot order) of those rows, plus the
//                 optional addend row (the shared experts' output), in fp32, rounded once. With `row_of` and
//                 `route_w` (moe_blas.py: cuBLAS wrote the rows unweighted, in sorted order) a slot's row is
//                 row_of[pair], times its routing weight: the product the down GEMM's epilogue forms otherwise.
//
// Mirrored in moe.py: the tile sizes, the shared-memory size, the kernel names.
#include "moe_gemm.cuh"

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
// A warp per expert and ROUTER_TOKENS tokens, so a gate row is read once per ROUTER_TOKENS tokens. At decode the
// grid is a few blocks (E / 8), so a warp's time is its loads' latency: where the rows allow, a lane reads 16 bytes of
// the gate and 8 of each activation row per load, ROUTER_LOADS of them in flight (2,048 of a row's columns a round:
// DeepSeek-V2-Lite's whole row), the first round's gate loads before griddepcontrol.wait (the gate is a weight).
// A lane sums its columns in the same order whatever ROUTER_LOADS is.
constexpr int ROUTER_WARPS = 8, ROUTER_TOKENS = 4, ROUTER_LOADS = 16;

static_assert(ROUTER_TOKENS <= ROUTER_WARPS, "moe_router routes a token group with a warp a token");

// ROUTER_LOADS loads of gate row we from column base on, issued before any is used (predicated, not guarded: a
// guarded unrolled loop waits on each load in turn)
__device__ __forceinline__ void router_gate_round(float4 (&wv)[ROUTER_LOADS], const float* we, int base, int D) {
#pragma unroll
    for (int j = 0; j < ROUTER_LOADS; ++j) {
        const int d = base + 128 * j;
        wv[j] = d < D ? __ldg(reinterpret_cast<const float4*>(we + d)) : make_float4(0.f, 0.f, 0.f, 0.f);
    }
}

// Calls pdl_begin() for its kernel: every thread waits, after the first round of gate loads.
__device__ void router_logits_block(const bf16* x, long long x_stride, const float* w, int T, int E, int D,
                                    float* out) {
    const int lane = threadIdx.x & 31, e = blockIdx.x * ROUTER_WARPS + (threadIdx.x >> 5);
    const int t0 = blockIdx.y * ROUTER_TOKENS;
    const float* we = w + (long long)e * D;
    const bool wide = D % 4 == 0 && x_stride % 4 == 0 && ((size_t)x & 7) == 0 && ((size_t)w & 15) == 0;
    float4 wv[ROUTER_LOADS];
    if (wide && e < E) router_gate_round(wv, we, 4 * lane, D);
    pdl_begin();
    if (e >= E) return;
    float acc[ROUTER_TOKENS] = {};
    if (wide) {
        // each round's gate loads, then each token's activations the same way
        for (int base = 4 * lane; base < D; base += 128 * ROUTER_LOADS) {
            if (base != 4 * lane) router_gate_round(wv, we, base, D);
#pragma unroll
            for (int i = 0; i < ROUTER_TOKENS; ++i) {
                if (t0 + i >= T) break;
                const bf16* xt = x + (long long)(t0 + i) * x_stride;
                uint2 raw[ROUTER_LOADS];
#pragma unroll
                for (int j = 0; j < ROUTER_LOADS; ++j) {
                    const int d = base + 128 * j;
                    raw[j] = d < D ? *reinterpret_cast<const uint2*>(xt + d) : make_uint2(0u, 0u);
                }
#pragma unroll
                for (int j = 0; j < ROUTER_LOADS; ++j) {
                    const bf16* xv = reinterpret_cast<const bf16*>(&raw[j]);
                    acc[i] = fmaf(to_f32(xv[0]), wv[j].x, acc[i]);
                    acc[i] = fmaf(to_f32(xv[1]), wv[j].y, acc[i]);
                    acc[i] = fmaf(to_f32(xv[2]), wv[j].z, acc[i]);
                    acc[i] = fmaf(to_f32(xv[3]), wv[j].w, acc[i]);
                }
            }
        }
    } else {
        // unrolled so that a lane has 8 iterations' loads in flight (rolled, each is waited on alone)
#pragma unroll 8
        for (int d = lane; d < D; d += 32) {
            const float wv = we[d];
#pragma unroll
            for (int i = 0; i < ROUTER_TOKENS; ++i)
                if (t0 + i < T) acc[i] = fmaf(to_f32(x[(long long)(t0 + i) * x_stride + d]), wv, acc[i]);
        }
    }
#pragma unroll
    for (int i = 0; i < ROUTER_TOKENS; ++i) {
        const float v = warp_sum(acc[i]);
        if (lane == 0 && t0 + i < T) out[(long long)(t0 + i) * E + e] = v;
    }
}

extern "C" __global__ void __launch_bounds__(ROUTER_WARPS * 32) router_logits_bf16(
    const bf16* x, long long x_stride, const float* w, int T, int E, int D, float* out) {
    router_logits_block(x, x_stride, w, T, E, D, out);
}

// router_logits_bf16 then moe_route_f32 (logits [T, E] packed: the scratch they meet in). counters: one int per
// token group (blockIdx.y), zero on entry and left zero (the last block resets its own), so a graph replays cleanly.
extern "C" __global__ void __launch_bounds__(ROUTER_WARPS * 32) moe_router_bf16(
    const bf16* x, long long x_stride, const float* w, int T, int E, int D, float* logits, int* counters,
    const float* bias, int k, int sigmoid, int method, int n_group, int topk_group, int norm, float routed_scale,
    int* ids, float* weights) {
    __shared__ int last;
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
// moe_gemm.cuh on bf16 expert stacks, MT m16 tiles a block; SUFFIX names a stage count other than GEMM_STAGES
#define MOE_GEMM_KERNEL(MT, STAGES, SUFFIX)                                                                        \
    extern "C" __global__ void __launch_bounds__(GEMM_WARPS * 32) moe_gate_up_bf16_m##MT##SUFFIX(                  \
        const bf16* x, long long x_stride, const int* sorted, int topk, const bf16* w, long long w_expert_stride,   \
        int N, int K, const int* tile_expert, const int* tile_start, const int* tile_end, const int* num_tiles,     \
        bf16* h, long long h_stride) {                                                                             \
        moe_gemm<MT, true, Bf16Experts, STAGES>(x, x_stride, sorted, topk, Bf16Experts{w, w_expert_stride}, N, K,  \
                                                tile_expert, tile_start, tile_end, num_tiles, nullptr, h, h_stride); \
    }                                                                                                              \
    extern "C" __global__ void __launch_bounds__(GEMM_WARPS * 32) moe_down_bf16_m##MT##SUFFIX(                     \
        const bf16* h, long long h_stride, const int* sorted, int topk, const bf16* w, long long w_expert_stride,   \
        int N, int K, const int* tile_expert, const int* tile_start, const int* tile_end, const int* num_tiles,     \
        const float* route_w, float* y, long long y_stride) {                                                      \
        moe_gemm<MT, false, Bf16Experts, STAGES>(h, h_stride, sorted, topk, Bf16Experts{w, w_expert_stride}, N, K, \
                                                 tile_expert, tile_start, tile_end, num_tiles, route_w, y,         \
                                                 y_stride);                                                        \
    }

MOE_GEMM_KERNEL(1, GEMM_STAGES, )
MOE_GEMM_KERNEL(8, GEMM_STAGES, )
// decode tiles of a few tokens: six stages in flight (moe.py gemm_stages; the same arithmetic)
MOE_GEMM_KERNEL(1, 6, _s6)

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
