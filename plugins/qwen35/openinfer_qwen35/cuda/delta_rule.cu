// The gated delta rule of the Gated DeltaNet, fp32 state [R, nv, dk, dv] (any row stride), fp32 math.
// Per token and value head h (key head h / (nv / nk)), with q, k L2-normalised and q scaled by dk^-0.5:
//     S = exp(g) S;  S += k (beta (v - S^T k))^T;  o = S^T q
// Columns of S are independent given q, k, g, beta, so every kernel splits dv into 32-column tiles.
#include "common.cuh"
#include "gdn.cuh"

constexpr int DK_MAX = 128;  // dk of every Qwen3.5 / Qwen3-Next checkpoint; the launchers check it
constexpr int BV = 32;       // state columns per block: one per lane

// q, k rows of key head kh of token `tok` into shared memory, L2-normalised (eps 1e-6 inside the
// root, as the reference); q also scaled by dk^-0.5. Entries dk..DK_MAX-1 are zero.
template <typename T>
__device__ void load_qk(const T* q, long long q_stride, const T* k, long long k_stride, long long tok, int kh,
                        int dk, float* sq, float* sk) {
    const int i = threadIdx.x;   // blockDim.x >= DK_MAX
    const float qi = i < dk ? to_f32(q[tok * q_stride + (long long)kh * dk + i]) : 0.f;
    const float ki = i < dk ? to_f32(k[tok * k_stride + (long long)kh * dk + i]) : 0.f;
    const float qq = block_sum(qi * qi), kk = block_sum(ki * ki);
    if (i < DK_MAX) {
        sq[i] = qi / sqrtf(qq + 1e-6f) * rsqrtf((float)dk);
        sk[i] = ki / sqrtf(kk + 1e-6f);
    }
    __syncthreads();
}

// Decode: one token per sequence. grid (ceil(dv / BV), nv, B), 128 threads: lane = state column,
// warp w holds rows w, w+4, ... of the column tile in registers (coalesced 128-byte row reads).
constexpr int DEC_WARPS = 4, DEC_ROWS = DK_MAX / DEC_WARPS;

template <typename T>
__device__ void gdn_decode(const T* q, long long q_stride, const T* k, long long k_stride, const T* v,
                           long long v_stride, const float* g, const float* beta, float* state,
                           long long state_stride, const int* slots, const int* query_start,
                           const int* context_lens, T* out, int nk, int nv, int dk, int dv) {
    __shared__ float sq[DK_MAX], sk[DK_MAX], red[DEC_WARPS][BV];
    const int b = blockIdx.z, h = blockIdx.y, lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int j = blockIdx.x * BV + lane;
    load_qk(q, q_stride, k, k_stride, b, h / (nv / nk), dk, sq, sk);
    const bool live = has_state(query_start, context_lens, b), col = j < dv;
    float* S = state + (long long)slots[b] * state_stride + (long long)h * dk * dv + j;
    const float decay = expf(g[b * nv + h]);
    float s[DEC_ROWS], kS = 0.f;
#pragma unroll
    for (int r = 0; r < DEC_ROWS; ++r) {
        const int i = r * DEC_WARPS + warp;
        s[r] = live && col && i < dk ? S[(long long)i * dv] * decay : 0.f;
        kS += sk[i] * s[r];
    }
    red[warp][lane] = kS;
    __syncthreads();
    kS = 0.f;
#pragma unroll
    for (int w = 0; w < DEC_WARPS; ++w) kS += red[w][lane];
    const float delta = col ? beta[b * nv + h] * (to_f32(v[b * v_stride + (long long)h * dv + j]) - kS) : 0.f;
    float o = 0.f;
#pragma unroll
    for (int r = 0; r < DEC_ROWS; ++r) {
        const int i = r * DEC_WARPS + warp;
        s[r] += sk[i] * delta;
        o += sq[i] * s[r];
        if (col && i < dk) S[(long long)i * dv] = s[r];
    }
    __syncthreads();   // everyone has read red[] above
    red[warp][lane] = o;
    __syncthreads();
    if (warp == 0 && col) {
        o = 0.f;
#pragma unroll
        for (int w = 0; w < DEC_WARPS; ++w) o += red[w][lane];
        out[((long long)b * nv + h) * dv + j] = from_f32<T>(o);
    }
}

// Chunked prefill (the WY form of fla's chunk_gated_delta_rule, models.md §3.3), chunks of L tokens.
// Per chunk, with gamma = in-chunk cumsum(g), D_ij = exp(gamma_i - gamma_j) (i >= j):
//     A = strict_lower(diag(beta) K K^T * D);  (I + A) [U | W] = [diag(beta) V | diag(beta exp(gamma)) K]
//     V' = U - W S;  O = diag(exp(gamma)) Q S + (Q K^T * D) V'
//     S = exp(gamma_L) S + (diag(exp(gamma_L - gamma)) K)^T V'
// Rows past a run's end are zero (beta = 0, g = 0), so a short last chunk needs no special case.
// grid (ceil(dv / BV), nv, B), CH_THREADS threads; the block walks its sequence's chunks in order,
// the state tile staying in shared memory. Each column tile's block recomputes A and W.
constexpr int L = 64, CH_THREADS = 256, CH_WARPS = CH_THREADS / 32;
static_assert(CH_THREADS == 4 * L && CH_THREADS >= DK_MAX + BV, "the phases' thread maps");

struct ChunkSmem {   // float offsets into the dynamic shared memory; strides padded against bank conflicts
    int kq, K, Q, W, S, U, A, P, gam, bet, tail, total;
    __device__ __host__ explicit ChunkSmem(int dk) {
        kq = dk + 1;
        K = 0; Q = K + L * kq; W = Q + L * kq; S = W + L * kq; U = S + dk * (BV + 1);
        A = U + L * (BV + 1); P = A + L * (L + 1); gam = P + L * (L + 1); bet = gam + L; tail = bet + L;
        total = tail + L;
    }
};

template <typename T>
__device__ void gdn_chunk(const T* q, long long q_stride, const T* k, long long k_stride, const T* v,
                          long long v_stride, const float* g, const float* beta, float* state,
                          long long state_stride, const int* slots, const int* query_start,
                          const int* context_lens, T* out, int nk, int nv, int dk, int dv) {
    extern __shared__ float smem[];
    const int b = blockIdx.z, h = blockIdx.y, j0 = blockIdx.x * BV, kh = h / (nv / nk);
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int s0 = query_start[b], n = query_start[b + 1] - s0;
    if (n == 0) return;   // no tokens: the state row is left as it is
    const ChunkSmem lay(dk);
    const int kq = lay.kq;
    float *Ks = smem + lay.K, *Qs = smem + lay.Q, *Ws = smem + lay.W, *Ss = smem + lay.S, *Us = smem + lay.U;
    float *As = smem + lay.A, *Ps = smem + lay.P, *gam = smem + lay.gam, *bet = smem + lay.bet;
    float* tail = smem + lay.tail;
    const bool live = has_state(query_start, context_lens, b), col = j0 + lane < dv;
    float* Sg = state + (long long)slots[b] * state_stride + (long long)h * dk * dv + j0 + lane;
    for (int d = warp; d < dk; d += CH_WARPS) Ss[d * (BV + 1) + lane] = live && col ? Sg[(long long)d * dv] : 0.f;

    for (int c0 = 0; c0 < n; c0 += L) {
        const int nc = min(L, n - c0);
        // 1. the chunk's normalised q, k (a warp per token), beta v, beta and gamma
        for (int t = warp; t < L; t += CH_WARPS) {
            const long long tok = s0 + c0 + t;
            float qq = 0.f, kk = 0.f;
            for (int i = lane; i < dk; i += 32) {
                const float qi = t < nc ? to_f32(q[tok * q_stride + (long long)kh * dk + i]) : 0.f;
                const float ki = t < nc ? to_f32(k[tok * k_stride + (long long)kh * dk + i]) : 0.f;
                Qs[t * kq + i] = qi;
                Ks[t * kq + i] = ki;
                qq += qi * qi;
                kk += ki * ki;
            }
            const float qs = rsqrtf((float)dk) / sqrtf(warp_sum(qq) + 1e-6f), ks = 1.f / sqrtf(warp_sum(kk) + 1e-6f);
            for (int i = lane; i < dk; i += 32) { Qs[t * kq + i] *= qs; Ks[t * kq + i] *= ks; }
            const float bt = t < nc ? beta[tok * nv + h] : 0.f;
            Us[t * (BV + 1) + lane] = t < nc && col ? bt * to_f32(v[tok * v_stride + (long long)h * dv + j0 + lane]) : 0.f;
            if (lane == 0) bet[t] = bt;
        }
        if (warp == 0) {   // inclusive scan of g over the chunk: lane holds tokens lane and lane + 32
            float g0 = lane < nc ? g[(long long)(s0 + c0 + lane) * nv + h] : 0.f;
            float g1 = lane + 32 < nc ? g[(long long)(s0 + c0 + lane + 32) * nv + h] : 0.f;
#pragma unroll
            for (int off = 1; off < 32; off <<= 1) {
                const float u0 = __shfl_up_sync(0xffffffffu, g0, off), u1 = __shfl_up_sync(0xffffffffu, g1, off);
                if (lane >= off) { g0 += u0; g1 += u1; }
            }
            g1 += __shfl_sync(0xffffffffu, g0, 31);
            const float last = __shfl_sync(0xffffffffu, g1, 31);   // padded rows add 0: gamma_L = gamma_{nc-1}
            gam[lane] = g0;
            gam[lane + 32] = g1;
            tail[lane] = expf(last - g0);
            tail[lane + 32] = expf(last - g1);
        }
        __syncthreads();
        // 2. A and P = (Q K^T) * D, lower parts only; W's right-hand side diag(beta exp(gamma)) K
        {
            const int i = tid >> 2;   // row; columns (tid & 3) + 4m
            float ak[L / 4], aq[L / 4];
#pragma unroll
            for (int m = 0; m < L / 4; ++m) ak[m] = aq[m] = 0.f;
            for (int d = 0; d < dk; ++d) {
                const float ki = Ks[i * kq + d], qi = Qs[i * kq + d];
#pragma unroll
                for (int m = 0; m < L / 4; ++m) {
                    const float kj = Ks[((tid & 3) + 4 * m) * kq + d];
                    ak[m] += ki * kj;
                    aq[m] += qi * kj;
                }
            }
#pragma unroll
            for (int m = 0; m < L / 4; ++m) {
                const int jj = (tid & 3) + 4 * m;
                const float D = jj <= i ? expf(gam[i] - gam[jj]) : 0.f;
                As[i * (L + 1) + jj] = jj < i ? bet[i] * ak[m] * D : 0.f;
                Ps[i * (L + 1) + jj] = aq[m] * D;
            }
        }
        for (int e = tid; e < L * dk; e += CH_THREADS) {
            const int t = e / dk, d = e % dk;
            Ws[t * kq + d] = bet[t] * expf(gam[t]) * Ks[t * kq + d];
        }
        __syncthreads();
        // 3. forward substitution, a thread per column of [W | U]: X_i -= sum_{j<i} A_ij X_j
        if (tid < dk + BV) {
            float* X = tid < dk ? Ws + tid : Us + (tid - dk);
            const int stride = tid < dk ? kq : BV + 1;
            for (int i = 1; i < nc; ++i) {
                const float* a = As + i * (L + 1);
                float acc[4] = {X[i * stride], 0.f, 0.f, 0.f};   // 4 chains: the sum is latency-bound
                int jj = 0;
                for (; jj + 4 <= i; jj += 4) {
#pragma unroll
                    for (int u = 0; u < 4; ++u) acc[u] -= a[jj + u] * X[(jj + u) * stride];
                }
                for (; jj < i; ++jj) acc[0] -= a[jj] * X[jj * stride];
                X[i * stride] = (acc[0] + acc[1]) + (acc[2] + acc[3]);
            }
        }
        __syncthreads();
        // 4. V' = U - W S and exp(gamma) Q S; thread = column `lane`, rows warp + 8m
        float o[L / CH_WARPS];
        {
            float ws[L / CH_WARPS];
#pragma unroll
            for (int m = 0; m < L / CH_WARPS; ++m) ws[m] = o[m] = 0.f;
            for (int d = 0; d < dk; ++d) {
                const float sd = Ss[d * (BV + 1) + lane];
#pragma unroll
                for (int m = 0; m < L / CH_WARPS; ++m) {
                    const int t = warp + CH_WARPS * m;
                    ws[m] += Ws[t * kq + d] * sd;
                    o[m] += Qs[t * kq + d] * sd;
                }
            }
#pragma unroll
            for (int m = 0; m < L / CH_WARPS; ++m) {
                const int t = warp + CH_WARPS * m;
                Us[t * (BV + 1) + lane] -= ws[m];
                o[m] *= expf(gam[t]);
            }
        }
        __syncthreads();
        // 5. O += P V' (written out); 6. S = exp(gamma_L) S + (tail K)^T V' (no barrier between:
        // 5 reads P and V', 6 reads K and V' and writes S)
#pragma unroll
        for (int m = 0; m < L / CH_WARPS; ++m) {
            const int t = warp + CH_WARPS * m;
            for (int jj = 0; jj <= t; ++jj) o[m] += Ps[t * (L + 1) + jj] * Us[jj * (BV + 1) + lane];
            if (t < nc && col) out[((long long)(s0 + c0 + t) * nv + h) * dv + j0 + lane] = from_f32<T>(o[m]);
        }
        {
            const float decay = expf(gam[L - 1]);
            constexpr int RS = DK_MAX / CH_WARPS;
            float acc[RS];
#pragma unroll
            for (int m = 0; m < RS; ++m) acc[m] = 0.f;
            for (int t = 0; t < nc; ++t) {
                const float u = Us[t * (BV + 1) + lane] * tail[t];
#pragma unroll
                for (int m = 0; m < RS; ++m) {
                    const int d = warp + CH_WARPS * m;
                    if (d < dk) acc[m] += Ks[t * kq + d] * u;
                }
            }
#pragma unroll
            for (int m = 0; m < RS; ++m) {
                const int d = warp + CH_WARPS * m;
                if (d < dk) Ss[d * (BV + 1) + lane] = decay * Ss[d * (BV + 1) + lane] + acc[m];
            }
        }
        __syncthreads();   // the next chunk overwrites K, Q, U and reads S
    }
    if (col)
        for (int d = warp; d < dk; d += CH_WARPS) Sg[(long long)d * dv] = Ss[d * (BV + 1) + lane];
}

#define DELTA_RULE_KERNELS(suffix, T)                                                                          \
    extern "C" __global__ void gdn_decode_##suffix(                                                            \
        const T* q, long long q_stride, const T* k, long long k_stride, const T* v, long long v_stride,        \
        const float* g, const float* beta, float* state, long long state_stride, const int* slots,             \
        const int* qs, const int* ctx, T* out, int nk, int nv, int dk, int dv) {                               \
        gdn_decode<T>(q, q_stride, k, k_stride, v, v_stride, g, beta, state, state_stride, slots, qs, ctx,     \
                      out, nk, nv, dk, dv);                                                                     \
    }                                                                                                           \
    extern "C" __global__ void __launch_bounds__(CH_THREADS) gdn_chunk_##suffix(                               \
        const T* q, long long q_stride, const T* k, long long k_stride, const T* v, long long v_stride,        \
        const float* g, const float* beta, float* state, long long state_stride, const int* slots,             \
        const int* qs, const int* ctx, T* out, int nk, int nv, int dk, int dv) {                               \
        gdn_chunk<T>(q, q_stride, k, k_stride, v, v_stride, g, beta, state, state_stride, slots, qs, ctx,      \
                     out, nk, nv, dk, dv);                                                                      \
    }

FOR_EACH_DTYPE(DELTA_RULE_KERNELS)
