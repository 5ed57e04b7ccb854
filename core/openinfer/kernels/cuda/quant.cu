// Kernels on quantized weights read in their checkpoint form: INT4 pack-quantized (group 32, symmetric; expert stacks
// reordered into 16-row tiles at load, quant.cuh's Int4Tiles) and FP8 e4m3 with 128x128 block scales (openinfer/quant).
// Decode-oriented: a warp streams a few weight rows once for up to NP activation rows (warp_rows). A lane reads 16-byte
// "chunks" (INT4: one group of 32 weights, FP8: 16 weights of one 128-block), so each chunk has one scale, applied once
// per chunk and activation row to an fp32 partial sum. Every sum is fp32.
//
// Streaming: a lane issues all R x U chunk loads of a pass (R rows, U chunks each, L chunks apart: a row's L lanes)
// before it uses any, so a warp has R * U * 512 bytes in flight; the weights bypass L1 (read once), which keeps the
// activations, reread by every warp of the block, there. Dequantization is integer bit moves plus one fp32 add (INT4)
// or one f16 -> f32 convert (FP8) per weight: no int -> float conversions, whose unit has a small fraction of the fp32
// throughput (16 a clock per SM on sm_90) and would cap the weights a warp can consume.
//
// The formats and their exact decoding: quant.cuh.
//
// The routed experts of one MoE layer (moe_experts_int4/fp8) run as four launches: moe_plan groups the
// (token, slot) pairs by local expert (one block); moe_q_gate_up_* computes h = silu(gate x) * up x per pair, a lane
// group per R/2 outputs (their gate and up rows), a block per (WARPS warps, active expert); moe_q_down_* computes
// weight * down h per pair, a lane group per R rows; each selected expert's rows are read once per NP pairs;
// moe_combine_* sums each token's pairs in slot order (deterministic: no atomics on values) and the optional addend
// (the shared experts' output). The _l<L>r<R>u<U> variants give a row L lanes (a warp is 32 / L groups, each
// reading its own R rows, reducing over log2(L) shuffles) and a lane U chunks a row and pass; the built forms are
// whole-warp rows (L = 32, R = 4) with U = 1 or 2, which quant.py's expert_pass picks by row length. Grids
// depend only on the token count, so the launches can be captured. Prefill-sized batches of bf16 activations take
// the grouped GEMM on the tensor cores instead (moe_gemm.cuh, instantiated at the end: moe_gate_up_<fmt>_m<MT>,
// moe_down_<fmt>_m<MT>).
#include "moe_gemm.cuh"
#include "quant.cuh"

#define P 8          // activation rows of a q_gemv pass (a linear at decode)
#define NP 4         // pairs of an expert kernel pass
#define WARPS 8      // warps per block

// acc[r][p] += sum_k W[row[r], k] act[p][k] for p < np, this lane's share (the caller sums its group of L lanes,
// an aligned L of the warp's 32): lane l of a group owns chunks l, l + L, ...; a pass loads U of them per row, every
// load issued before the first is used. Chunk c's activations start at act[p] + c * CS (CS = F::CHUNK: a packed row;
// more: a row staged with padding, staged_chunk).
template <class F, int L, int R, int U, int CS, int N, typename S, typename A>
__device__ __forceinline__ void warp_rows(const void* __restrict__ q, const S* __restrict__ scale,
                                          const long long (&row)[R], int K, const A* const (&act)[N], int np,
                                          float (&acc)[R][N]) {
    const int lane = threadIdx.x % L, C = F::chunks(K);
    for (int c0 = lane; c0 < C; c0 += L * U) {
        uint4 raw[R][U];
        float s[R][U];
#pragma unroll
        for (int u = 0; u < U; ++u) {
#pragma unroll
            for (int r = 0; r < R; ++r) {
                const bool in = c0 + L * u < C;
                raw[r][u] = in ? F::load(q, row[r], K, c0 + L * u) : make_uint4(0, 0, 0, 0);
                s[r][u] = in ? F::scale(scale, row[r], K, c0 + L * u) : 0.f;
            }
        }
#pragma unroll
        for (int u = 0; u < U; ++u) {
            const int c = c0 + L * u;
            if (c >= C) break;
            float part[R][N];
#pragma unroll
            for (int r = 0; r < R; ++r)
#pragma unroll
                for (int p = 0; p < N; ++p) part[r][p] = 0.f;
#pragma unroll
            for (int j = 0; j < F::WORDS; ++j) {
                float w[R][8];
#pragma unroll
                for (int r = 0; r < R; ++r) F::expand(raw[r][u], j, w[r]);
#pragma unroll
                for (int p = 0; p < N; ++p) {
                    if (p < np) {
                        float xv[8];
                        load_f32<8>(act[p] + c * CS + 8 * j, xv);
#pragma unroll
                        for (int r = 0; r < R; ++r)
#pragma unroll
                            for (int i = 0; i < 8; ++i) part[r][p] = fmaf(w[r][i], xv[i], part[r][p]);
                    }
                }
            }
#pragma unroll
            for (int r = 0; r < R; ++r)
#pragma unroll
                for (int p = 0; p < N; ++p) acc[r][p] = fmaf(s[r][u], part[r][p], acc[r][p]);
        }
    }
}

// y[m, n] = sum_k x[m, k] W[n, k]: grid (ceil(N / WARPS), ceil(M / P)), a warp per weight row.
template <class F, typename T, typename S>
__device__ void q_gemv(const T* __restrict__ x, long long xs, const void* __restrict__ q, const S* __restrict__ scale,
                       int M, int N, int K, T* __restrict__ y) {
    pdl_begin();
    const int lane = threadIdx.x & 31, n = blockIdx.x * WARPS + (threadIdx.x >> 5), m0 = blockIdx.y * P;
    if (n >= N) return;
    const int rows = min(P, M - m0);
    const long long row[1] = {n};
    const T* act[P];
    float acc[1][P];
#pragma unroll
    for (int p = 0; p < P; ++p) { act[p] = x + (long long)(m0 + min(p, rows - 1)) * xs; acc[0][p] = 0.f; }
    warp_rows<F, 32, 1, 4, F::CHUNK>(q, scale, row, K, act, rows, acc);
#pragma unroll
    for (int p = 0; p < P; ++p) {
        const float s = warp_sum(acc[0][p]);
        if (lane == 0 && p < rows) y[(long long)(m0 + p) * N + n] = from_f32<T>(s);
    }
}

// out[r, k] = W[r, k] as T (a transient dense copy of one weight, for prefill GEMMs): grid (rows), threads over chunks.
template <class F, typename T, typename S>
__device__ void q_dequant(const void* __restrict__ q, const S* __restrict__ scale, int K, T* __restrict__ out) {
    pdl_begin();
    const long long r = blockIdx.x;
    for (int c = threadIdx.x; c < F::chunks(K); c += blockDim.x) {
        const uint4 raw = F::load(q, r, K, c);
        const float s = F::scale(scale, r, K, c);
#pragma unroll
        for (int j = 0; j < F::WORDS; ++j) {
            float v[8];
            F::expand(raw, j, v);
#pragma unroll
            for (int i = 0; i < 8; ++i) v[i] *= s;
            store_f32<8>(out + r * K + 8 * (c * F::WORDS + j), v);
        }
    }
}

// The pairs (t, j) of ids [n = T * k] grouped by local expert, in one block: slot_expert[s] is the s-th selected
// local expert (increasing; -1 past the last), its pairs are pair_list[slot_start[s] .. slot_start[s + 1]).
// counts: E_local ints of dynamic shared memory.
extern "C" __global__ void moe_plan(const int* __restrict__ ids, int n, int E_local, int offset, int slots,
                                    int* __restrict__ slot_expert, int* __restrict__ slot_start,
                                    int* __restrict__ pair_list) {
    pdl_begin();
    extern __shared__ int counts[];
    for (int e = threadIdx.x; e < E_local; e += blockDim.x) counts[e] = 0;
    __syncthreads();
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
        const int e = ids[i] - offset;
        if (e >= 0 && e < E_local) atomicAdd(&counts[e], 1);
    }
    __syncthreads();
    __shared__ int total[2];   // slots used, pairs
    if (threadIdx.x < 32) {   // warp 0: lane l owns experts [l * per, (l + 1) * per); exclusive scans of slots, pairs
        const int lane = threadIdx.x, per = (E_local + 31) / 32;
        const int e0 = min(E_local, lane * per), e1 = min(E_local, e0 + per);
        int used = 0, pairs = 0;
        for (int e = e0; e < e1; ++e) { used += counts[e] != 0; pairs += counts[e]; }
        int s = used, at = pairs;   // inclusive, then exclusive
#pragma unroll
        for (int o = 1; o < 32; o <<= 1) {
            const int a = __shfl_up_sync(0xffffffffu, s, o), b = __shfl_up_sync(0xffffffffu, at, o);
            if (lane >= o) { s += a; at += b; }
        }
        if (lane == 31) { total[0] = s; total[1] = at; }
        s -= used;
        at -= pairs;
        for (int e = e0; e < e1; ++e) {
            const int c = counts[e];
            counts[e] = at;   // becomes the expert's fill cursor
            if (c) { slot_expert[s] = e; slot_start[s] = at; ++s; at += c; }
        }
    }
    __syncthreads();
    for (int r = total[0] + threadIdx.x; r <= slots; r += blockDim.x) {
        if (r < slots) slot_expert[r] = -1;
        slot_start[r] = total[1];
    }
    __syncthreads();
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
        const int e = ids[i] - offset;
        if (e >= 0 && e < E_local) pair_list[atomicAdd(&counts[e], 1)] = i;
    }
}

// The sum of v over the aligned group of L lanes (log2(L) shuffles, serving the warp's 32 / L groups at once).
template <int L>
__device__ __forceinline__ float group_sum(float v) {
#pragma unroll
    for (int o = L / 2; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

// The down kernel reads its pairs' activations (h, float32) from shared memory: lane l of a row's group reads chunk
// l's F::CHUNK values, and from global memory those 32 lanes' reads fall in 32 different 128-byte lines, an L1
// wavefront each (INT4: 8 such loads a chunk), which held the INT4 down rows to 39-45 % of the copy rate. Staged
// with 16 bytes of padding after each chunk, a warp's 16-byte reads fall in distinct banks. gate_up reads its bf16
// x from global memory: staging it (half the wavefronts a weight byte to save, 4x the bytes to stage) measured slower.
template <class F, typename A>
constexpr int staged_chunk() { return F::CHUNK + 16 / (int)sizeof(A); }   // elements a staged chunk takes

// Row pairs[p] of src [., K] for p < n (a pass's activations) into stage + p * chunks(K) * staged_chunk, by the
// block.
template <class F, typename A>
__device__ __forceinline__ void stage_rows(A* stage, const A* __restrict__ src, const int* __restrict__ pairs, int n,
                                           int K) {
    constexpr int V = 16 / sizeof(A), PER = F::CHUNK / V;   // values a 16-byte word, words a chunk
    const int words = K / V;
    for (int i = threadIdx.x; i < n * words; i += blockDim.x) {
        const int p = i / words, w = i - p * words, c = w / PER;
        const uint4 v = reinterpret_cast<const uint4*>(src + (long long)pairs[p] * K)[w];
        *reinterpret_cast<uint4*>(stage + (long long)(p * F::chunks(K) + c) * staged_chunk<F, A>() + V * w - c * F::CHUNK) = v;
    }
}

// h[pair, o] = silu(gate_e x[t]) * up_e x[t] for the pairs of slot blockIdx.y (t = pair / k): grid
// (ceil(I / (WARPS * 32 / L * R / 2)), slots), a group of L lanes per R / 2 outputs. q/scale: the expert stack
// [E_local, 2I, ...] (gate rows first).
template <class F, int L, int R, int U, typename T, typename S>
__device__ void moe_q_gate_up(const T* __restrict__ x, const void* __restrict__ q, const S* __restrict__ scale,
                              const int* __restrict__ slot_expert, const int* __restrict__ slot_start,
                              const int* __restrict__ pair_list, int k, int D, int I, float* __restrict__ h) {
    constexpr int O = R / 2, G = 32 / L;
    pdl_wait();   // the trigger follows the main loop (common.cuh)
    const int e = slot_expert[blockIdx.y];
    const int warp = blockIdx.x * WARPS + (threadIdx.x >> 5), sub = threadIdx.x & (L - 1);
    const int o0 = (warp * G + ((threadIdx.x & 31) / L)) * O;
    if (e < 0 || warp * G * O >= I) return;   // whole warps only: every lane takes part in the shuffles
    long long row[R];
#pragma unroll
    for (int i = 0; i < O; ++i) {   // an output past I reads the last one's rows again and is not stored
        row[i] = F::stack_row(e, min(o0 + i, I - 1), 2 * I);
        row[O + i] = F::stack_row(e, I + min(o0 + i, I - 1), 2 * I);
    }
    const int first = slot_start[blockIdx.y], last = slot_start[blockIdx.y + 1];
    for (int p0 = first; p0 < last; p0 += NP) {
        const int rows = min(NP, last - p0);
        int pair[NP];
        const T* act[NP];
        float acc[R][NP];
#pragma unroll
        for (int p = 0; p < NP; ++p) {
            pair[p] = pair_list[p0 + min(p, rows - 1)];
            act[p] = x + (long long)(pair[p] / k) * D;
#pragma unroll
            for (int r = 0; r < R; ++r) acc[r][p] = 0.f;
        }
        warp_rows<F, L, R, U, F::CHUNK>(q, scale, row, D, act, rows, acc);
#pragma unroll
        for (int i = 0; i < O; ++i)
#pragma unroll
            for (int p = 0; p < NP; ++p) {
                if (p < rows) {
                    const float gs = group_sum<L>(acc[i][p]), us = group_sum<L>(acc[O + i][p]);
                    if (sub == 0 && o0 + i < I) h[(long long)pair[p] * I + o0 + i] = silu_mul_f32(gs, us);
                }
            }
    }
    pdl_trigger();
}

// yk[pair, o] = weights[pair] * down_e h[pair] for the pairs of slot blockIdx.y: grid (ceil(D / (WARPS * 32 / L *
// R)), slots), a group of L lanes per R rows. Dynamic shared memory: stage_pairs (<= NP) staged rows of I, the
// pairs of a pass (more pairs than that take more passes).
template <class F, int L, int R, int U, typename S>
__device__ void moe_q_down(const float* __restrict__ h, const void* __restrict__ q, const S* __restrict__ scale,
                           const int* __restrict__ slot_expert, const int* __restrict__ slot_start,
                           const int* __restrict__ pair_list, const float* __restrict__ weights, int D, int I,
                           int stage_pairs, float* __restrict__ yk) {
    constexpr int G = 32 / L, SC = staged_chunk<F, float>();
    extern __shared__ uint4 stage_words[];
    float* stage = reinterpret_cast<float*>(stage_words);
    pdl_wait();   // the trigger follows the main loop (common.cuh)
    const int e = slot_expert[blockIdx.y];
    const int warp = blockIdx.x * WARPS + (threadIdx.x >> 5), sub = threadIdx.x & (L - 1);
    const int o0 = (warp * G + ((threadIdx.x & 31) / L)) * R;
    if (e < 0) return;   // the whole block
    const bool works = warp * G * R < D;   // whole warps: every lane takes part in the shuffles
    long long row[R];
#pragma unroll
    for (int r = 0; r < R; ++r) row[r] = F::stack_row(e, min(o0 + r, D - 1), D);   // past D: read again, not stored
    const int first = slot_start[blockIdx.y], last = slot_start[blockIdx.y + 1];
    for (int p0 = first; p0 < last; p0 += stage_pairs) {
        const int rows = min(stage_pairs, last - p0);
        int pair[NP];
        const float* act[NP];
        float acc[R][NP];
#pragma unroll
        for (int p = 0; p < NP; ++p) {
            pair[p] = pair_list[p0 + min(p, rows - 1)];
            act[p] = stage + (long long)min(p, rows - 1) * F::chunks(I) * SC;
#pragma unroll
            for (int r = 0; r < R; ++r) acc[r][p] = 0.f;
        }
        __syncthreads();   // the previous pass's reads of the stage are done
        stage_rows<F>(stage, h, pair_list + p0, rows, I);
        __syncthreads();
        if (!works) continue;
        warp_rows<F, L, R, U, SC>(q, scale, row, I, act, rows, acc);
#pragma unroll
        for (int r = 0; r < R; ++r)
#pragma unroll
            for (int p = 0; p < NP; ++p) {
                if (p < rows) {
                    const float s = group_sum<L>(acc[r][p]);
                    if (sub == 0 && o0 + r < D) yk[(long long)pair[p] * D + o0 + r] = weights[pair[p]] * s;
                }
            }
    }
    pdl_trigger();
}

// y[t, d] = sum over j of yk[t * k + j, d] for the pairs whose expert is local, in j order, plus addend[t, d] (null:
// none; [T, D] packed) in fp32: grid (T, ceil(D / (4 * threads))), a thread per 4 columns (D % 4 == 0), its k row
// loads unrolled so they are in flight together.
template <typename T>
__device__ void moe_combine(const float* __restrict__ yk, const int* __restrict__ ids, int k, int D, int E_local,
                            int offset, const T* __restrict__ addend, T* __restrict__ y) {
    pdl_begin();
    const long long t = blockIdx.x;
    const int d = 4 * (blockIdx.y * blockDim.x + threadIdx.x);
    if (d >= D) return;
    float s[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll 8
    for (int j = 0; j < k; ++j) {
        const int e = ids[t * k + j] - offset;
        if (e >= 0 && e < E_local) {
            float v[4];
            load_f32<4>(yk + (t * k + j) * D + d, v);
#pragma unroll
            for (int i = 0; i < 4; ++i) s[i] += v[i];
        }
    }
    if (addend) {
        float a[4];
        load_f32<4>(addend + t * D + d, a);
#pragma unroll
        for (int i = 0; i < 4; ++i) s[i] += a[i];
    }
    store_f32<4>(y + t * D + d, s);
}

#define Q_EXPERTS(fmt, F, sfx, T, S, L, R, U)                                                                      \
    extern "C" __global__ void __launch_bounds__(32 * WARPS) moe_q_gate_up_##fmt##_##sfx##_l##L##r##R##u##U(       \
        const T* x, const void* q, const S* scale, const int* slot_expert, const int* slot_start,                 \
        const int* pair_list, int k, int D, int I, float* h) {                                                     \
        moe_q_gate_up<F, L, R, U, T, S>(x, q, scale, slot_expert, slot_start, pair_list, k, D, I, h);              \
    }                                                                                                              \
    extern "C" __global__ void __launch_bounds__(32 * WARPS) moe_q_down_##fmt##_##sfx##_l##L##r##R##u##U(          \
        const float* h, const void* q, const S* scale, const int* slot_expert, const int* slot_start,             \
        const int* pair_list, const float* weights, int D, int I, int stage_pairs, float* yk) {                    \
        moe_q_down<F, L, R, U, S>(h, q, scale, slot_expert, slot_start, pair_list, weights, D, I, stage_pairs, yk);\
    }

// the expert forms quant.py's expert_pass picks from: whole-warp rows (4 a warp) of 1 or 2 chunks a lane and pass
// (groups of 8 lanes a row, 2 rows a group, 4 chunks: slower on the H100 at INT4 width 2048, 29 % of the copy rate
// against 41 %, so not built)
#define Q_KERNELS(fmt, F, sfx, T, S)                                                                               \
    extern "C" __global__ void q_gemv_##fmt##_##sfx(const T* x, long long xs, const void* q, const S* scale, int M, \
                                                    int N, int K, T* y) {                                          \
        q_gemv<F, T, S>(x, xs, q, scale, M, N, K, y);                                                              \
    }                                                                                                              \
    extern "C" __global__ void q_dequant_##fmt##_##sfx(const void* q, const S* scale, int K, T* out) {             \
        q_dequant<F, T, S>(q, scale, K, out);                                                                      \
    }
#define Q_EXPERT_FORMS(fmt, F, sfx, T, S)                                                                          \
    Q_EXPERTS(fmt, F, sfx, T, S, 32, 4, 1)                                                                         \
    Q_EXPERTS(fmt, F, sfx, T, S, 32, 4, 2)

// INT4 scales come in the activations' dtype, FP8 scales in float32. INT4 experts on bf16 activations run on the
// tensor cores at decode (quant_mma.cu), so their GEMV forms are not built.
Q_KERNELS(int4, Int4, bf16, bf16, bf16)
Q_KERNELS(int4, Int4, f32, float, float)
Q_KERNELS(fp8, Fp8, bf16, bf16, float)
Q_KERNELS(fp8, Fp8, f32, float, float)
Q_EXPERT_FORMS(int4, Int4Tiles, f32, float, float)
Q_EXPERT_FORMS(fp8, Fp8, bf16, bf16, float)
Q_EXPERT_FORMS(fp8, Fp8, f32, float, float)

#define COMBINE_KERNEL(sfx, T)                                                                                     \
    extern "C" __global__ void moe_combine_##sfx(const float* yk, const int* ids, int k, int D, int E_local,      \
                                                 int offset, const T* addend, T* y) {                              \
        moe_combine<T>(yk, ids, k, D, E_local, offset, addend, y);                                                 \
    }
FOR_EACH_DTYPE(COMBINE_KERNEL)

// ----------------------------------------------------------------------------------- grouped GEMM (prefill)
// moe_gemm.cuh's weight policy for an INT4 / FP8 expert stack (rows W rows an expert, K % 64 == 0) with scales S: a
// stage holds each W row's packed chunks of the k tile (INT4 2, FP8 4) and, in one 4-byte copy, its scales there
// (INT4 two bf16 of 32 columns each, FP8 one float of its 128-block). tile() expands the chunks into the bf16 tile
// the mma reads (F::expand_bf16): the unscaled weights (INT4 nibble - 8, FP8 the e4m3 value), which bf16 holds
// exactly; the scales then multiply each group's fp32 partial sums, as warp_rows does per chunk, so no rounded
// weight enters a sum.
template <class F, typename S>
struct QuantExperts {
    const unsigned char* q;
    const S* s;
    int rows;   // an expert's
    static constexpr int RAW = GEMM_BK / F::CHUNK, NS = F::GROUP < GEMM_BK ? GEMM_BK / F::GROUP : 1;
    static constexpr int GROUP_KK = GEMM_BK / 16 / NS, SCALES = GEMM_BN * RAW * 16;   // the scales' offset
    static constexpr int STAGE_BYTES = SCALES + GEMM_BN * 4, COPIES = GEMM_BN * (RAW + 1), TILE_BYTES = GEMM_TILE_BYTES;
    static_assert(NS * sizeof(S) == 4, "a row's scales of a k tile are one 4-byte copy");
    static __device__ __forceinline__ long long row_bytes(int K) { return K / F::CHUNK * 16LL; }
    __device__ QuantExperts expert(int e, int K) const {
        return {q + e * rows * row_bytes(K), s + (long long)e * rows * F::scale_cols(K), rows};
    }
    // copies [0, 64 RAW): chunk i % RAW of row i / RAW; then row i - 64 RAW's scales. Src: the copy's row in the
    // stack (-1: zeros)
    using Src = long long;
    __device__ Src src(int i, const int* w_rows, int) const {
        const int r = w_rows[i < GEMM_BN * RAW ? i / RAW : i - GEMM_BN * RAW];
        return r < 0 ? -1 : F::stack_row(0, r, rows);
    }
    __device__ void copy(unsigned char* st, int i, Src row, int k0, int K) const {
        if (i < GEMM_BN * RAW) {
            const int k = k0 + (i % RAW) * F::CHUNK;
            const bool ok = row >= 0 && k < K;
            cp_async16(st + i * 16, ok ? q + F::chunk_index(row, K, k / F::CHUNK) * 16 : q, ok ? 16 : 0);
        } else {
            const int r = i - GEMM_BN * RAW;
            const bool ok = row >= 0;
            cp_async4(st + SCALES + r * 4, ok ? s + F::scale_index(row, K, k0 / F::CHUNK) : s, ok ? 4 : 0);
        }
    }
    // each thread expands its chunks (row i / RAW, columns (i % RAW) * CHUNK ..) into dq, then the block waits
    __device__ const bf16* tile(const unsigned char* st, bf16* dq) const {
        for (int i = threadIdx.x; i < GEMM_BN * RAW; i += GEMM_WARPS * 32) {
            const uint4 raw = *reinterpret_cast<const uint4*>(st + i * 16);
            uint4* dst = reinterpret_cast<uint4*>(dq + (i / RAW) * GEMM_LD + (i % RAW) * F::CHUNK);
#pragma unroll
            for (int j = 0; j < F::WORDS; ++j) dst[j] = F::expand_bf16(raw, j);
        }
        __syncthreads();
        return dq;
    }
    __device__ float scale(const unsigned char* st, int r, int g) const {
        return to_f32(reinterpret_cast<const S*>(st + SCALES + r * 4)[g]);
    }
};

// moe.cu's moe_gate_up_bf16_m<MT> / moe_down_bf16_m<MT> arguments, the stack as its packed words and scales
#define Q_GEMM_KERNELS(fmt, F, S, MT)                                                                              \
    extern "C" __global__ void __launch_bounds__(GEMM_WARPS * 32) moe_gate_up_##fmt##_m##MT(                       \
        const bf16* x, long long x_stride, const int* sorted, int topk, const void* q, const S* scale, int N, int K, \
        const int* tile_expert, const int* tile_start, const int* tile_end, const int* num_tiles, bf16* h,          \
        long long h_stride) {                                                                                      \
        moe_gemm<MT, true>(x, x_stride, sorted, topk,                                                              \
                           QuantExperts<F, S>{(const unsigned char*)q, scale, 2 * N}, N, K, tile_expert,          \
                           tile_start, tile_end, num_tiles, nullptr, h, h_stride);                                 \
    }                                                                                                              \
    extern "C" __global__ void __launch_bounds__(GEMM_WARPS * 32) moe_down_##fmt##_m##MT(                          \
        const bf16* h, long long h_stride, const int* sorted, int topk, const void* q, const S* scale, int N, int K, \
        const int* tile_expert, const int* tile_start, const int* tile_end, const int* num_tiles,                  \
        const float* route_w, float* y, long long y_stride) {                                                      \
        moe_gemm<MT, false>(h, h_stride, sorted, topk, QuantExperts<F, S>{(const unsigned char*)q, scale, N}, N, K, \
                            tile_expert, tile_start, tile_end, num_tiles, route_w, y, y_stride);                   \
    }

// 32-row tiles from a moderate number of rows an expert (a 1k-token prefill chunk of Kimi-K2: ~21), 128-row tiles
// from WIDE_ROWS_PER_EXPERT (moe.py) on
Q_GEMM_KERNELS(int4, Int4Tiles, bf16, 2)
Q_GEMM_KERNELS(int4, Int4Tiles, bf16, 8)
Q_GEMM_KERNELS(fp8, Fp8, float, 2)
Q_GEMM_KERNELS(fp8, Fp8, float, 8)
