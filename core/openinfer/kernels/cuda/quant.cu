// Kernels on quantized weights read in their checkpoint form: INT4 pack-quantized (group 32, symmetric) and FP8
// e4m3 with 128x128 block scales (openinfer/quant). Weights are dequantized in registers, 8 consecutive weights of
// one row (a "word") at a time, and every sum is fp32. Decode-oriented: a warp owns one weight row and streams it
// once for up to P activation rows. A lane loads F::WORDS words at once (a "chunk"): INT4 a whole 32-weight group
// with its one scale, 16 bytes (512 a warp per load instruction: enough bytes in flight to stream the experts at
// decode), FP8 one 8-byte word.
//
// INT4: q is int32 [rows, K/8] (nibble i of word w = weight 8w + i, stored as value + 8), scale [rows, K/32] in the
// activations' dtype (the checkpoint's bf16). FP8: q is uint8 [rows, K], scale float32 [rows, ceil(K/128)] (the
// 128x128 block scales repeated per row at load).
//
// The routed experts of one MoE layer (moe_experts_int4/fp8) run as four launches: moe_plan groups the
// (token, slot) pairs by local expert (one block); moe_q_gate_up_* computes h = silu(gate x) * up x per pair with
// a block per (8 rows, active expert), so each selected expert's gate/up rows are read once per P pairs;
// moe_q_down_* computes weight * down h per pair likewise; moe_combine_* sums each token's pairs in slot order
// (deterministic: no atomics on values) and the optional addend (the shared experts' output). Grids depend only on the token count, so the launches can be captured.
#include "common.cuh"

#define P 8          // activation rows a warp carries per pass over a weight row
#define ROWS 8       // weight rows per block (one per warp)

struct Int4 {
    static constexpr int WORDS = 4;   // one group of 32 weights (K % 32 == 0: the 16-byte loads stay aligned)
    using Raw = uint4;
    template <typename S>
    static __device__ __forceinline__ void load(const void* q, const S* scale, long long row, int K, int c, Raw& raw,
                                                float& s) {
        raw = reinterpret_cast<const uint4*>(q)[row * (K >> 5) + c];
        s = to_f32(scale[row * (K >> 5) + c]);
    }
    // word j of the chunk (j a compile-time constant once the caller's loop is unrolled)
    static __device__ __forceinline__ void expand(const Raw& raw, float s, int j, float* out) {
        const unsigned int word = j == 0 ? raw.x : j == 1 ? raw.y : j == 2 ? raw.z : raw.w;
#pragma unroll
        for (int i = 0; i < 8; ++i) out[i] = (float)((int)((word >> (4 * i)) & 15u) - 8) * s;
    }
};

struct Fp8 {
    // e4m3fn -> float: normal numbers by moving the exponent and mantissa bits into place (bias 7 -> 127),
    // subnormals as m * 2^-9. NaN (0x7f) is not produced by quantization and is not special-cased.
    static __device__ __forceinline__ float e4m3(unsigned int b) {
        const unsigned int mag = b & 0x7fu;
        const float v = (mag >> 3) ? __uint_as_float((mag << 20) + 0x3c000000u) : (float)mag * 0.001953125f;
        return (b & 0x80u) ? -v : v;
    }
    static constexpr int WORDS = 1;   // K % 8 == 0 only: an 8-byte load keeps any such row aligned
    using Raw = uint2;
    template <typename S>
    static __device__ __forceinline__ void load(const void* q, const S* scale, long long row, int K, int c, Raw& raw,
                                                float& s) {
        raw = reinterpret_cast<const uint2*>(reinterpret_cast<const unsigned char*>(q) + row * K)[c];
        s = to_f32(scale[row * ((K + 127) >> 7) + (c >> 4)]);
    }
    static __device__ __forceinline__ void expand(const Raw& v, float s, int, float* out) {
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            out[i] = e4m3((v.x >> (8 * i)) & 0xffu) * s;
            out[4 + i] = e4m3((v.y >> (8 * i)) & 0xffu) * s;
        }
    }
};

__device__ __forceinline__ float dot8(const float* a, const float* b) {
    float s = 0.f;
#pragma unroll
    for (int i = 0; i < 8; ++i) s = fmaf(a[i], b[i], s);
    return s;
}

// y[m, n] = sum_k x[m, k] W[n, k]: grid (ceil(N / ROWS), ceil(M / P)), ROWS warps.
template <class F, typename T, typename S>
__device__ void q_gemv(const T* __restrict__ x, long long xs, const void* __restrict__ q, const S* __restrict__ scale,
                       int M, int N, int K, T* __restrict__ y) {
    pdl_begin();
    const int lane = threadIdx.x & 31, n = blockIdx.x * ROWS + (threadIdx.x >> 5), m0 = blockIdx.y * P;
    if (n >= N) return;
    const int rows = min(P, M - m0);
    float acc[P];
#pragma unroll
    for (int p = 0; p < P; ++p) acc[p] = 0.f;
    for (int c = lane; c < (K >> 3) / F::WORDS; c += 32) {
        typename F::Raw raw;
        float s;
        F::load(q, scale, n, K, c, raw, s);
#pragma unroll
        for (int j = 0; j < F::WORDS; ++j) {
            const int w = c * F::WORDS + j;
            float wv[8], xv[8];
            F::expand(raw, s, j, wv);
#pragma unroll
            for (int p = 0; p < P; ++p) {
                if (p < rows) {
                    load_f32<8>(x + (long long)(m0 + p) * xs + 8 * w, xv);
                    acc[p] += dot8(wv, xv);
                }
            }
        }
    }
#pragma unroll
    for (int p = 0; p < P; ++p) {
        const float s = warp_sum(acc[p]);
        if (lane == 0 && p < rows) y[(long long)(m0 + p) * N + n] = from_f32<T>(s);
    }
}

// out[r, k] = W[r, k] as T (a transient dense copy of one weight, for prefill GEMMs): grid (rows), threads over words.
template <class F, typename T, typename S>
__device__ void q_dequant(const void* __restrict__ q, const S* __restrict__ scale, int K, T* __restrict__ out) {
    pdl_begin();
    const long long r = blockIdx.x;
    for (int c = threadIdx.x; c < (K >> 3) / F::WORDS; c += blockDim.x) {
        typename F::Raw raw;
        float s;
        F::load(q, scale, r, K, c, raw, s);
#pragma unroll
        for (int j = 0; j < F::WORDS; ++j) {
            float v[8];
            F::expand(raw, s, j, v);
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
    if (threadIdx.x == 0) {   // E_local is small (<= a few hundred): a serial scan is cheaper than a parallel one
        int s = 0, at = 0;
        for (int e = 0; e < E_local; ++e) {
            const int c = counts[e];
            counts[e] = at;               // becomes the expert's fill cursor
            if (c) { slot_expert[s] = e; slot_start[s] = at; ++s; at += c; }
        }
        for (int r = s; r < slots; ++r) { slot_expert[r] = -1; slot_start[r] = at; }
        slot_start[slots] = at;
    }
    __syncthreads();
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
        const int e = ids[i] - offset;
        if (e >= 0 && e < E_local) pair_list[atomicAdd(&counts[e], 1)] = i;
    }
}

// h[pair, o] = silu(gate_e x[t]) * up_e x[t] for the pairs of slot blockIdx.y (t = pair / k): grid
// (ceil(I / ROWS), slots). q/scale: the expert stack [E_local, 2I, ...] (gate rows first).
template <class F, typename T, typename S>
__device__ void moe_q_gate_up(const T* __restrict__ x, const void* __restrict__ q, const S* __restrict__ scale,
                              const int* __restrict__ slot_expert, const int* __restrict__ slot_start,
                              const int* __restrict__ pair_list, int k, int D, int I, float* __restrict__ h) {
    pdl_wait();   // the trigger follows the main loop (common.cuh)
    const int e = slot_expert[blockIdx.y];
    const int lane = threadIdx.x & 31, o = blockIdx.x * ROWS + (threadIdx.x >> 5);
    if (e < 0 || o >= I) return;
    const long long gate_row = (long long)e * 2 * I + o, up_row = gate_row + I;
    const int first = slot_start[blockIdx.y], last = slot_start[blockIdx.y + 1];
    for (int p0 = first; p0 < last; p0 += P) {
        const int rows = min(P, last - p0);
        int pair[P];
        float g[P], u[P];
#pragma unroll
        for (int p = 0; p < P; ++p) { pair[p] = p < rows ? pair_list[p0 + p] : 0; g[p] = 0.f; u[p] = 0.f; }
        for (int c = lane; c < (D >> 3) / F::WORDS; c += 32) {
            typename F::Raw graw, uraw;
            float gscale, uscale;
            F::load(q, scale, gate_row, D, c, graw, gscale);
            F::load(q, scale, up_row, D, c, uraw, uscale);
#pragma unroll
            for (int j = 0; j < F::WORDS; ++j) {
                const int w = c * F::WORDS + j;
                float gw[8], uw[8], xv[8];
                F::expand(graw, gscale, j, gw);
                F::expand(uraw, uscale, j, uw);
#pragma unroll
                for (int p = 0; p < P; ++p) {
                    if (p < rows) {
                        load_f32<8>(x + (long long)(pair[p] / k) * D + 8 * w, xv);
                        g[p] += dot8(gw, xv);
                        u[p] += dot8(uw, xv);
                    }
                }
            }
        }
#pragma unroll
        for (int p = 0; p < P; ++p) {
            const float gs = warp_sum(g[p]), us = warp_sum(u[p]);
            if (lane == 0 && p < rows) h[(long long)pair[p] * I + o] = silu_mul_f32(gs, us);
        }
    }
    pdl_trigger();
}

// yk[pair, o] = weights[pair] * down_e h[pair] for the pairs of slot blockIdx.y: grid (ceil(D / ROWS), slots).
template <class F, typename S>
__device__ void moe_q_down(const float* __restrict__ h, const void* __restrict__ q, const S* __restrict__ scale,
                           const int* __restrict__ slot_expert, const int* __restrict__ slot_start,
                           const int* __restrict__ pair_list, const float* __restrict__ weights, int D, int I,
                           float* __restrict__ yk) {
    pdl_wait();   // the trigger follows the main loop (common.cuh)
    const int e = slot_expert[blockIdx.y];
    const int lane = threadIdx.x & 31, o = blockIdx.x * ROWS + (threadIdx.x >> 5);
    if (e < 0 || o >= D) return;
    const long long row = (long long)e * D + o;
    const int first = slot_start[blockIdx.y], last = slot_start[blockIdx.y + 1];
    for (int p0 = first; p0 < last; p0 += P) {
        const int rows = min(P, last - p0);
        int pair[P];
        float acc[P];
#pragma unroll
        for (int p = 0; p < P; ++p) { pair[p] = p < rows ? pair_list[p0 + p] : 0; acc[p] = 0.f; }
        // two chunks a pass, their words one at a time: at decode an INT4 lane has two 16-byte loads in flight at
        // 80 registers (three blocks an SM); unrolling the words too would take 92 (two blocks)
#pragma unroll 2
        for (int c = lane; c < (I >> 3) / F::WORDS; c += 32) {
            typename F::Raw raw;
            float s;
            F::load(q, scale, row, I, c, raw, s);
#pragma unroll 1
            for (int j = 0; j < F::WORDS; ++j) {
                const int w = c * F::WORDS + j;
                float dw[8], hv[8];
                F::expand(raw, s, j, dw);
#pragma unroll
                for (int p = 0; p < P; ++p) {
                    if (p < rows) {
                        load_f32<8>(h + (long long)pair[p] * I + 8 * w, hv);
                        acc[p] += dot8(dw, hv);
                    }
                }
            }
        }
#pragma unroll
        for (int p = 0; p < P; ++p) {
            const float s = warp_sum(acc[p]);
            if (lane == 0 && p < rows) yk[(long long)pair[p] * D + o] = weights[pair[p]] * s;
        }
    }
    pdl_trigger();
}

// y[t, d] = sum over j of yk[t * k + j, d] for the pairs whose expert is local, in j order, plus addend[t, d] (null:
// none; [T, D] packed) in fp32: grid (T), threads over D.
template <typename T>
__device__ void moe_combine(const float* __restrict__ yk, const int* __restrict__ ids, int k, int D, int E_local,
                            int offset, const T* __restrict__ addend, T* __restrict__ y) {
    pdl_begin();
    const long long t = blockIdx.x;
    for (int d = threadIdx.x; d < D; d += blockDim.x) {
        float s = 0.f;
        for (int j = 0; j < k; ++j) {
            const int e = ids[t * k + j] - offset;
            if (e >= 0 && e < E_local) s += yk[(t * k + j) * D + d];
        }
        if (addend) s += to_f32(addend[t * D + d]);
        y[t * D + d] = from_f32<T>(s);
    }
}

#define Q_KERNELS(fmt, F, sfx, T, S)                                                                               \
    extern "C" __global__ void q_gemv_##fmt##_##sfx(const T* x, long long xs, const void* q, const S* scale, int M, \
                                                    int N, int K, T* y) {                                          \
        q_gemv<F, T, S>(x, xs, q, scale, M, N, K, y);                                                              \
    }                                                                                                              \
    extern "C" __global__ void q_dequant_##fmt##_##sfx(const void* q, const S* scale, int K, T* out) {             \
        q_dequant<F, T, S>(q, scale, K, out);                                                                      \
    }                                                                                                              \
    extern "C" __global__ void moe_q_gate_up_##fmt##_##sfx(const T* x, const void* q, const S* scale,              \
                                                           const int* slot_expert, const int* slot_start,          \
                                                           const int* pair_list, int k, int D, int I, float* h) {  \
        moe_q_gate_up<F, T, S>(x, q, scale, slot_expert, slot_start, pair_list, k, D, I, h);                       \
    }                                                                                                              \
    extern "C" __global__ void moe_q_down_##fmt##_##sfx(const float* h, const void* q, const S* scale,             \
                                                        const int* slot_expert, const int* slot_start,             \
                                                        const int* pair_list, const float* weights, int D, int I,  \
                                                        float* yk) {                                               \
        moe_q_down<F, S>(h, q, scale, slot_expert, slot_start, pair_list, weights, D, I, yk);                      \
    }

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
