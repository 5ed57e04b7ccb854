// Kernels on quantized weights read in their checkpoint form: INT4 pack-quantized (group 32, symmetric) and FP8
// e4m3 with 128x128 block scales (openinfer/quant). Decode-oriented: a warp streams a few weight rows once for up to
// NP activation rows (warp_rows). A lane reads 16-byte "chunks" (INT4: one group of 32 weights, FP8: 16 weights of
// one 128-block), so each chunk has one scale, applied once per chunk and activation row to an fp32 partial sum.
// Every sum is fp32.
//
// Streaming: a lane issues all R x U chunk loads of a pass (R rows, U chunks each, 32 chunks apart) before it uses
// any, so a warp has R * U * 512 bytes in flight; the weights bypass L1 (read once), which keeps the activations,
// reread by every warp of the block, there. Dequantization is integer bit moves plus one fp32 add (INT4) or one
// f16 -> f32 convert (FP8) per weight: no int -> float conversions, whose unit has a small fraction of the fp32
// throughput (16 a clock per SM on sm_90) and would cap the weights a warp can consume.
//
// INT4: q is int32 [rows, K/8] (nibble i of word w = weight 8w + i, stored as value + 8), scale [rows, K/32] in the
// activations' dtype (the checkpoint's bf16). FP8: q is uint8 [rows, K] (K % 16 == 0), scale float32
// [rows, ceil(K/128)] (the 128x128 block scales repeated per row at load).
//
// The routed experts of one MoE layer (moe_experts_int4/fp8) run as four launches: moe_plan groups the
// (token, slot) pairs by local expert (one block); moe_q_gate_up_* computes h = silu(gate x) * up x per pair, a warp
// per R/2 outputs (their gate and up rows), a block per (WARPS warps, active expert); moe_q_down_* computes
// weight * down h per pair, a warp per R rows; each selected expert's rows are read once per NP pairs;
// moe_combine_* sums each token's pairs in slot order (deterministic: no atomics on values) and the optional addend
// (the shared experts' output). R = 4 rows a warp; the _u<U> variants differ in U (1 or 2, the host picks it:
// quant.py's expert_pass). Grids depend only on the token count, so the launches can be captured.
#include "common.cuh"

#define P 8          // activation rows of a q_gemv pass (a linear at decode)
#define NP 4         // pairs of an expert kernel pass
#define WARPS 8      // warps per block
#define ER 4         // weight rows a warp of an expert kernel (R of warp_rows)

__device__ __forceinline__ uint4 ld_stream(const uint4* p) {   // read once: no L1 allocation
    uint4 v;
    asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
    return v;
}

__device__ __forceinline__ unsigned int word_of(const uint4& v, int j) {
    return j == 0 ? v.x : j == 1 ? v.y : j == 2 ? v.z : v.w;
}

struct Int4 {
    static constexpr int WORDS = 4;   // 8-weight words of a chunk
    static __device__ __forceinline__ int chunks(int K) { return K >> 5; }
    static __device__ __forceinline__ uint4 load(const void* q, long long row, int K, int c) {
        return ld_stream(reinterpret_cast<const uint4*>(q) + row * (K >> 5) + c);
    }
    template <typename S>
    static __device__ __forceinline__ float scale(const S* s, long long row, int K, int c) {
        return to_f32(s[row * (K >> 5) + c]);
    }
    // the 8 weights of word j, unscaled (nibble - 8): nibble i (bits 4i.., i < 5) masked in as the mantissa of a
    // float of exponent 23 - 4i is 2^(23 - 4i) + nibble, from which that power and the 8 are subtracted (exact);
    // nibbles 5..7 likewise after one shift.
    static __device__ __forceinline__ void expand(const uint4& raw, int j, float* out) {
        const unsigned int w = word_of(raw, j), hi = w >> 20;
#pragma unroll
        for (int i = 0; i < 8; ++i) {
            const int b = i < 5 ? i : i - 5;
            const unsigned int bits = ((i < 5 ? w : hi) & (15u << (4 * b))) | ((150u - 4 * b) << 23);
            out[i] = __uint_as_float(bits) - (float)((1 << (23 - 4 * b)) + 8);
        }
    }
};

struct Fp8 {
    static constexpr int WORDS = 2;
    static __device__ __forceinline__ int chunks(int K) { return K >> 4; }
    static __device__ __forceinline__ uint4 load(const void* q, long long row, int K, int c) {
        return ld_stream(reinterpret_cast<const uint4*>(reinterpret_cast<const unsigned char*>(q) + row * K) + c);
    }
    // times 2^8: expand yields the weights / 2^8
    template <typename S>
    static __device__ __forceinline__ float scale(const S* s, long long row, int K, int c) {
        return to_f32(s[row * ((K + 127) >> 7) + (c >> 3)]) * 256.f;
    }
    // f16 bits of two e4m3 bytes at bits 8..15 and 24..31 of v: sign in place, exponent and mantissa one bit right.
    // The exponent bias stays 7 (f16's is 15), so the half is the weight / 2^8, subnormals included, exactly.
    static __device__ __forceinline__ unsigned int halves(unsigned int v) {
        return (v & 0x80008000u) | ((v & 0x7f007f00u) >> 1);
    }
    static __device__ __forceinline__ void to_f32x2(unsigned int h, float& lo, float& hi) {
        asm("{.reg .b16 l, h; mov.b32 {l, h}, %2; cvt.f32.f16 %0, l; cvt.f32.f16 %1, h;}"
            : "=f"(lo), "=f"(hi) : "r"(h));
    }
    // the 8 weights of word j (bytes 8j..8j+7 of the chunk) / 2^8, unscaled
    static __device__ __forceinline__ void expand(const uint4& raw, int j, float* out) {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const unsigned int v = word_of(raw, 2 * j + h);
            to_f32x2(halves(v), out[4 * h + 1], out[4 * h + 3]);        // bytes 1, 3
            to_f32x2(halves(v << 8), out[4 * h + 0], out[4 * h + 2]);   // bytes 0, 2
        }
    }
};

// acc[r][p] += sum_k W[row[r], k] act[p][k] for p < np, this lane's share (the caller sums the warp): lane l owns
// chunks l, l + 32, ...; a pass loads U of them per row, every load issued before the first is used.
template <class F, int R, int U, int N, typename S, typename A>
__device__ __forceinline__ void warp_rows(const void* __restrict__ q, const S* __restrict__ scale,
                                          const long long (&row)[R], int K, const A* const (&act)[N], int np,
                                          float (&acc)[R][N]) {
    const int lane = threadIdx.x & 31, C = F::chunks(K);
    for (int c0 = lane; c0 < C; c0 += 32 * U) {
        uint4 raw[R][U];
        float s[R][U];
#pragma unroll
        for (int u = 0; u < U; ++u) {
#pragma unroll
            for (int r = 0; r < R; ++r) {
                const bool in = c0 + 32 * u < C;
                raw[r][u] = in ? F::load(q, row[r], K, c0 + 32 * u) : make_uint4(0, 0, 0, 0);
                s[r][u] = in ? F::scale(scale, row[r], K, c0 + 32 * u) : 0.f;
            }
        }
#pragma unroll
        for (int u = 0; u < U; ++u) {
            const int c = c0 + 32 * u;
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
                        load_f32<8>(act[p] + 8 * (c * F::WORDS + j), xv);
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
    warp_rows<F, 1, 4>(q, scale, row, K, act, rows, acc);
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

// h[pair, o] = silu(gate_e x[t]) * up_e x[t] for the pairs of slot blockIdx.y (t = pair / k): grid
// (ceil(I / (WARPS * R / 2)), slots), a warp per R / 2 outputs. q/scale: the expert stack [E_local, 2I, ...] (gate
// rows first).
template <class F, int U, typename T, typename S>
__device__ void moe_q_gate_up(const T* __restrict__ x, const void* __restrict__ q, const S* __restrict__ scale,
                              const int* __restrict__ slot_expert, const int* __restrict__ slot_start,
                              const int* __restrict__ pair_list, int k, int D, int I, float* __restrict__ h) {
    constexpr int R = ER, O = R / 2;
    pdl_wait();   // the trigger follows the main loop (common.cuh)
    const int e = slot_expert[blockIdx.y];
    const int lane = threadIdx.x & 31, o0 = (blockIdx.x * WARPS + (threadIdx.x >> 5)) * O;
    if (e < 0 || o0 >= I) return;
    long long row[R];
#pragma unroll
    for (int i = 0; i < O; ++i) {   // an output past I (odd I) reads the last one's rows again and is not stored
        row[i] = (long long)e * 2 * I + min(o0 + i, I - 1);
        row[O + i] = row[i] + I;
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
        warp_rows<F, R, U>(q, scale, row, D, act, rows, acc);
#pragma unroll
        for (int i = 0; i < O; ++i)
#pragma unroll
            for (int p = 0; p < NP; ++p) {
                if (p < rows) {
                    const float gs = warp_sum(acc[i][p]), us = warp_sum(acc[O + i][p]);
                    if (lane == 0 && o0 + i < I) h[(long long)pair[p] * I + o0 + i] = silu_mul_f32(gs, us);
                }
            }
    }
    pdl_trigger();
}

// yk[pair, o] = weights[pair] * down_e h[pair] for the pairs of slot blockIdx.y: grid (ceil(D / (WARPS * R)),
// slots), a warp per R rows.
template <class F, int U, typename S>
__device__ void moe_q_down(const float* __restrict__ h, const void* __restrict__ q, const S* __restrict__ scale,
                           const int* __restrict__ slot_expert, const int* __restrict__ slot_start,
                           const int* __restrict__ pair_list, const float* __restrict__ weights, int D, int I,
                           float* __restrict__ yk) {
    constexpr int R = ER;
    pdl_wait();   // the trigger follows the main loop (common.cuh)
    const int e = slot_expert[blockIdx.y];
    const int lane = threadIdx.x & 31, o0 = (blockIdx.x * WARPS + (threadIdx.x >> 5)) * R;
    if (e < 0 || o0 >= D) return;
    long long row[R];
#pragma unroll
    for (int r = 0; r < R; ++r) row[r] = (long long)e * D + min(o0 + r, D - 1);   // past D: read again, not stored
    const int first = slot_start[blockIdx.y], last = slot_start[blockIdx.y + 1];
    for (int p0 = first; p0 < last; p0 += NP) {
        const int rows = min(NP, last - p0);
        int pair[NP];
        const float* act[NP];
        float acc[R][NP];
#pragma unroll
        for (int p = 0; p < NP; ++p) {
            pair[p] = pair_list[p0 + min(p, rows - 1)];
            act[p] = h + (long long)pair[p] * I;
#pragma unroll
            for (int r = 0; r < R; ++r) acc[r][p] = 0.f;
        }
        warp_rows<F, R, U>(q, scale, row, I, act, rows, acc);
#pragma unroll
        for (int r = 0; r < R; ++r)
#pragma unroll
            for (int p = 0; p < NP; ++p) {
                if (p < rows) {
                    const float s = warp_sum(acc[r][p]);
                    if (lane == 0 && o0 + r < D) yk[(long long)pair[p] * D + o0 + r] = weights[pair[p]] * s;
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

#define Q_EXPERTS(fmt, F, sfx, T, S, U)                                                                            \
    extern "C" __global__ void __launch_bounds__(32 * WARPS) moe_q_gate_up_##fmt##_##sfx##_u##U(                   \
        const T* x, const void* q, const S* scale, const int* slot_expert, const int* slot_start,                 \
        const int* pair_list, int k, int D, int I, float* h) {                                                     \
        moe_q_gate_up<F, U, T, S>(x, q, scale, slot_expert, slot_start, pair_list, k, D, I, h);                    \
    }                                                                                                              \
    extern "C" __global__ void __launch_bounds__(32 * WARPS) moe_q_down_##fmt##_##sfx##_u##U(                      \
        const float* h, const void* q, const S* scale, const int* slot_expert, const int* slot_start,             \
        const int* pair_list, const float* weights, int D, int I, float* yk) {                                     \
        moe_q_down<F, U, S>(h, q, scale, slot_expert, slot_start, pair_list, weights, D, I, yk);                   \
    }

#define Q_KERNELS(fmt, F, sfx, T, S)                                                                               \
    extern "C" __global__ void q_gemv_##fmt##_##sfx(const T* x, long long xs, const void* q, const S* scale, int M, \
                                                    int N, int K, T* y) {                                          \
        q_gemv<F, T, S>(x, xs, q, scale, M, N, K, y);                                                              \
    }                                                                                                              \
    extern "C" __global__ void q_dequant_##fmt##_##sfx(const void* q, const S* scale, int K, T* out) {             \
        q_dequant<F, T, S>(q, scale, K, out);                                                                      \
    }                                                                                                              \
    Q_EXPERTS(fmt, F, sfx, T, S, 1)                                                                                \
    Q_EXPERTS(fmt, F, sfx, T, S, 2)

// INT4 scales come in the activations' dtype, FP8 scales in float32
Q_KERNELS(int4, Int4, bf16, bf16, bf16)
Q_KERNELS(int4, Int4, f32, float, float)
Q_KERNELS(fp8, Fp8, bf16, bf16, float)
Q_KERNELS(fp8, Fp8, f32, float, float)

#define COMBINE_KERNEL(sfx, T)                                                                                     \
    extern "C" __global__ void moe_combine_##sfx(const float* yk, const int* ids, int k, int D, int E_local,      \
                                                 int offset, const T* addend, T* y) {                              \
        moe_combine<T>(yk, ids, k, D, E_local, offset, addend, y);                                                 \
    }
FOR_EACH_DTYPE(COMBINE_KERNEL)
