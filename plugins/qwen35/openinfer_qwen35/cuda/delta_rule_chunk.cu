// The gated delta rule of the Gated DeltaNet, fp32 state [R, nv, dk, dv] (any row stride), fp32 math.
// Per token and value head h (key head h / (nv / nk)), with q, k L2-normalised and q scaled by dk^-0.5:
//     S = exp(g) S;  S += k (beta (v - S^T k))^T;  o = S^T q
// Columns of S are independent given q, k, g, beta, so every kernel splits dv into 32-column tiles.
// This file: the chunked prefill; delta_rule.cu: the one-token decode step.
#include "common.cuh"
#include "gdn.cuh"
#include "mma.cuh"

// Chunked prefill (the WY form of fla's chunk_gated_delta_rule), chunks of L tokens.
// Per chunk, with gamma = in-chunk cumsum(g), D_ij = exp(gamma_i - gamma_j) (i >= j):
//     A = strict_lower(diag(beta) K K^T * D);  (I + A) [U | W] = [diag(beta) V | diag(beta exp(gamma)) K]
//     V' = U - W S;  O = diag(exp(gamma)) Q S + (Q K^T * D) V'
//     S = exp(gamma_L) S + (diag(exp(gamma_L - gamma)) K)^T V'
// Rows past a run's end are zero (beta = 0, g = 0), so a short last chunk needs no special case.
constexpr int L = 64, CH_THREADS = 256, CH_WARPS = CH_THREADS / 32;
static_assert(CH_THREADS == 256 && L == 64 && BV == 32 && DK_MAX == 128, "the kernels' thread maps");

// Two kernels (fla's chunk_gated_delta_rule split). A single kernel walking each run's chunks
// spent ~1.1 ms per 1008-token call (128 blocks, 16 chunks each, redoing per chunk and column
// tile the state-free Q K^T, K K^T and 64-row forward substitution). Estimates, 4B shape, 1008
// tokens, fp32 CUDA cores (~128 FMA/clk/SM, 1.75 GHz, 132 SMs):
// 1. gdn_chunk_prep, grid (max chunks, nv, B): every chunk of every run at once. Writes a record
//    per (chunk, head) to `scratch`: W, exp(gamma) Q, tail K [L][DK_MAX], P [L][L], U [L][dv],
//    exp(gamma_L) (147 KB). Per block 0.66M FMA (A, P lower tiles) + 0.52M (substitution, X in
//    registers); 512 blocks, 2 per SM: 2 waves of ~10 us at the FMA limit, 75 MB written: ~30 us.
// 2. gdn_chunk_state, grid (dv / BV, nv, B): walks the run's chunks with the S tile in shared
//    memory: V' = U - W S, O = Qg S + P V', S = exp(gamma_L) S + Kt^T V'; 0.86M FMA per chunk and a
//    120 KB record loaded by cp.async behind the previous chunk. On the tensor cores in 3xTF32 (below):
//    bf16 or plain tf32 inputs would lose the fp32 reference's accuracy, three tf32 products keep it.
// A run may save its state part-way, after its first ckpt_lens[b] = t tokens (0 < t < n; a prompt's
// last full block, kv/hybrid.py): then [0, t) and [t, n) are chunked apart, as two runs split at
// t would be, so the state at t is a chunk boundary and equals what a step ending at t computed.
// Records are indexed by m b + floor(s_b / L) + c (run b's chunk c; unique, < T / L + m B), m = 1,
// or 2 when the batch has checkpoints (a split adds at most one chunk to a run).
constexpr int KP = DK_MAX + 4;   // prep's q/k row stride: float4 rows of 8 lanes hit distinct banks
constexpr int AP = L + 4;        // A's row stride (rows read as float4 broadcasts)

struct Rec {   // float offsets of one (chunk, head) record in scratch
    int W, Qg, Kt, P, U, dec, total;
    __device__ __host__ explicit Rec(int dv) {
        W = 0; Qg = L * DK_MAX; Kt = 2 * L * DK_MAX; P = 3 * L * DK_MAX; U = P + L * L; dec = U + L * dv;
        total = dec + 4;
    }
};

__device__ __forceinline__ long long rec_index(const int* query_start, const int* ckpt_lens, int b, int c) {
    return (long long)(ckpt_lens != nullptr ? 2 : 1) * b + query_start[b] / L + c;
}

struct Chunks {   // run b's chunk grid: `first` chunks over [0, split), then chunks over [split, n)
    int split, first, count;
    __device__ Chunks(const int* ckpt_lens, int b, int n) {
        const int t = ckpt_lens != nullptr ? ckpt_lens[b] : 0;
        split = t > 0 && t < n ? t : 0;
        first = (split + L - 1) / L;
        count = first + (n - split + L - 1) / L;
    }
    __device__ int start(int c) const { return c < first ? c * L : split + (c - first) * L; }
    __device__ int size(int c, int n) const { return min(L, (c < first ? split : n) - start(c)); }
};

template <typename T>
__device__ void gdn_chunk_prep(const T* q, long long q_stride, const T* k, long long k_stride, const T* v,
                               long long v_stride, const float* g, const float* beta, const int* query_start,
                               const int* ckpt_lens, float* scratch, int nk, int nv, int dk, int dv) {
    pdl_begin();
    extern __shared__ float smem[];
    float *Qs = smem, *Ks = Qs + L * KP, *As = Ks + L * KP, *gam = As + L * AP, *bet = gam + L, *tail = bet + L;
    T* Vs = reinterpret_cast<T*>(tail + L);   // the chunk's v rows of this head, [L][dv], as stored
    const int c = blockIdx.x, h = blockIdx.y, b = blockIdx.z, kh = h / (nv / nk);
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int s0 = query_start[b], n = query_start[b + 1] - s0;
    const Chunks chunks(ckpt_lens, b, n);
    if (c >= chunks.count) return;
    const int c0 = chunks.start(c), nc = chunks.size(c, n);
    const Rec rec(dv);
    float* R = scratch + (rec_index(query_start, ckpt_lens, b, c) * nv + h) * rec.total;
    // 0. the chunk's raw q and k rows of this key head (float, zero past dk and past the run), its v rows (as
    // stored) and beta, by the whole block at once: the loads are unconditional (rows past the run read its last
    // row) and independent, so they are in flight together instead of each waiting in a branch of its own
#pragma unroll 8
    for (int e = tid; e < L * DK_MAX; e += CH_THREADS) {
        const int t = e / DK_MAX, i = e % DK_MAX;
        const long long tok = s0 + c0 + min(t, nc - 1), col = (long long)kh * dk + min(i, dk - 1);
        const float qi = to_f32(q[tok * q_stride + col]), ki = to_f32(k[tok * k_stride + col]);
        const bool in = t < nc && i < dk;
        Qs[t * KP + i] = in ? qi : 0.f;
        Ks[t * KP + i] = in ? ki : 0.f;
    }
#pragma unroll 8
    for (int e = tid; e < L * dv; e += CH_THREADS) {
        const int t = e / dv;
        Vs[e] = v[(s0 + c0 + min(t, nc - 1)) * v_stride + (long long)h * dv + e % dv];   // rows past the run: unused
    }
    if (tid < L) {
        const float bt = beta[(long long)(s0 + c0 + min(tid, nc - 1)) * nv + h];
        bet[tid] = tid < nc ? bt : 0.f;
    }
    __syncthreads();
    // 1. q, k normalised in place (a warp per token)
    for (int t = warp; t < L; t += CH_WARPS) {
        float qq = 0.f, kk = 0.f;
        for (int i = lane; i < DK_MAX; i += 32) {
            const float qi = Qs[t * KP + i], ki = Ks[t * KP + i];
            qq += qi * qi;
            kk += ki * ki;
        }
        const float qs = rsqrtf((float)dk) / sqrtf(warp_sum(qq) + 1e-6f), ks = 1.f / sqrtf(warp_sum(kk) + 1e-6f);
        for (int i = lane; i < DK_MAX; i += 32) { Qs[t * KP + i] *= qs; Ks[t * KP + i] *= ks; }
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
        if (lane == 0) R[rec.dec] = expf(last);
    }
    __syncthreads();
    // 2. A = strict_lower(diag(beta) K K^T * D) to shared memory, P = lower(Q K^T * D) to the record;
    // thread (ti, tj) holds rows ti + 16 a, columns tj + 16 e: 12 float4 loads per <= 128 FMA; tiles
    // a < e lie above the diagonal (zero), so 10 of the 16 are computed.
    {
        const int ti = tid >> 4, tj = tid & 15;
        float ak[4][4] = {}, aq[4][4] = {};
        for (int d = 0; d < DK_MAX; d += 4) {
            float4 qi[4], ki[4], kj[4];
#pragma unroll
            for (int m = 0; m < 4; ++m) {
                qi[m] = *reinterpret_cast<const float4*>(Qs + (ti + 16 * m) * KP + d);
                ki[m] = *reinterpret_cast<const float4*>(Ks + (ti + 16 * m) * KP + d);
                kj[m] = *reinterpret_cast<const float4*>(Ks + (tj + 16 * m) * KP + d);
            }
#pragma unroll
            for (int a = 0; a < 4; ++a)
#pragma unroll
                for (int e = 0; e <= a; ++e) {
                    ak[a][e] += ki[a].x * kj[e].x + ki[a].y * kj[e].y + ki[a].z * kj[e].z + ki[a].w * kj[e].w;
                    aq[a][e] += qi[a].x * kj[e].x + qi[a].y * kj[e].y + qi[a].z * kj[e].z + qi[a].w * kj[e].w;
                }
        }
#pragma unroll
        for (int a = 0; a < 4; ++a)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const int i = ti + 16 * a, j = tj + 16 * e;
                const float D = j <= i ? expf(gam[i] - gam[j]) : 0.f;
                As[i * AP + j] = j < i ? bet[i] * ak[a][e] * D : 0.f;
                R[rec.P + i * L + j] = aq[a][e] * D;
            }
    }
    // exp(gamma) Q and tail K for the state kernel (rows past the run are zero)
    for (int e = tid; e < L * DK_MAX; e += CH_THREADS) {
        const int t = e / DK_MAX, d = e % DK_MAX;
        R[rec.Qg + e] = expf(gam[t]) * Qs[t * KP + d];
        R[rec.Kt + e] = tail[t] * Ks[t * KP + d];
    }
    __syncthreads();
    // 3. (I + A) [W | U] = [diag(beta exp(gamma)) K | diag(beta) V], a thread per column, the column
    // in registers (64 rows unrolled): 2016 FMA in 4 chains, A rows as float4 broadcasts.
    for (int col = tid; col < DK_MAX + dv; col += CH_THREADS) {
        const bool isw = col < DK_MAX;
        float X[L];
#pragma unroll
        for (int i = 0; i < L; ++i)
            X[i] = isw ? bet[i] * expf(gam[i]) * Ks[i * KP + col]
                       : (i < nc ? bet[i] * to_f32(Vs[i * dv + col - DK_MAX]) : 0.f);
#pragma unroll
        for (int i = 1; i < L; ++i) {
            float acc[4] = {X[i], 0.f, 0.f, 0.f};
#pragma unroll
            for (int j = 0; j < i; j += 4) {
                const float4 a = *reinterpret_cast<const float4*>(As + i * AP + j);   // zero at j >= i
                acc[0] -= a.x * X[j];
                if (j + 1 < i) acc[1] -= a.y * X[j + 1];
                if (j + 2 < i) acc[2] -= a.z * X[j + 2];
                if (j + 3 < i) acc[3] -= a.w * X[j + 3];
            }
            X[i] = (acc[0] + acc[1]) + (acc[2] + acc[3]);
        }
        float* dst = isw ? R + rec.W + col : R + rec.U + (col - DK_MAX);
        const int stride = isw ? DK_MAX : dv;
#pragma unroll
        for (int i = 0; i < L; ++i) dst[i * stride] = X[i];
    }
}

// gdn_chunk_state: the three steps, each a product of shared-memory tiles by mma.sync m16n8k8 in 3xTF32
// (split_tf32: hi*hi + hi*lo + lo*hi, the hi*hi chain and the cross terms' chain summed at the end; close to fp32,
// not its bits). It replaced a walk in fp32 on the CUDA cores: 181.7 us a layer against 203.5 over a 1k prompt on
// the H200, the state within 1.8e-7 of that walk's and the bf16 output within a rounding step.
// Block = 32 state columns of one (sequence, value head),
// TC_WARPS warps: warp w owns the m16n8 tile of rows 16 (w / 4), columns 8 (w % 4) of V' and O (O stays in registers
// from step a to step b) and the S tiles of rows 16 (w / 4) and 16 (w / 4) + 64, the same columns (step c). Row
// strides are padded so that every fragment load is free of bank conflicts: W, Qg 132 and P 68 (A fragments, bank
// 4 g + t), Kt 136 (read as Kt^T, bank 8 t + g), S and V' 40 (B fragments, bank 8 t + g).
constexpr int TC_WARPS = 16, TC_WQ = DK_MAX + 4, TC_KT = DK_MAX + 8, TC_P = L + 4, TC_SV = BV + 8;
static_assert(TC_WARPS == 16 && BV == 32 && L == 64 && DK_MAX == 128, "the tensor-core walk's tile map");

// `rows` rows of `cols` floats (a multiple of 4) from packed global memory into shared rows `stride` floats apart.
__device__ __forceinline__ void stage_rows(float* dst, int stride, const float* src, int rows, int cols) {
    const int per = cols / 4;
    for (int e = threadIdx.x; e < rows * per; e += blockDim.x)
        cp_async16(dst + (e / per) * stride + (e % per) * 4, src + e * 4, 16);
}

// The A fragment (16 x 8) at m of a row-major tile, row stride ld: a0 (g, t), a1 (g + 8, t), a2 (g, t + 4),
// a3 (g + 8, t + 4); or (tr) of its transpose, A[i][k] = m[k][i]. Split into TF32 hi and lo.
template <bool TR>
__device__ __forceinline__ void frag_a(unsigned int* hi, unsigned int* lo, const float* m, int ld, int g, int t) {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        const int r = g + 8 * (i & 1), k = t + 4 * (i >> 1);
        split_tf32(TR ? m[k * ld + r] : m[r * ld + k], hi[i], lo[i]);
    }
}

// The B fragment (8 x 8, k x n) at m of a row-major [k][n] tile: b0 (k = t, n = g), b1 (k = t + 4, n = g).
__device__ __forceinline__ void frag_b(unsigned int* hi, unsigned int* lo, const float* m, int ld, int g, int t) {
    split_tf32(m[t * ld + g], hi[0], lo[0]);
    split_tf32(m[(t + 4) * ld + g], hi[1], lo[1]);
}

// c += a b in 3xTF32: hi hi into c, the cross terms into x.
__device__ __forceinline__ void mma3(float* c, float* x, const unsigned int* ah, const unsigned int* al,
                                     const unsigned int* bh, const unsigned int* bl) {
    mma_tf32(c, ah, bh[0], bh[1]);
    mma_tf32(x, ah, bl[0], bl[1]);
    mma_tf32(x, al, bh[0], bh[1]);
}

template <typename T>
__device__ void gdn_chunk_state(const float* scratch, float* state, long long state_stride, const int* slots,
                                   const int* query_start, const int* context_lens, const int* ckpt_lens,
                                   const int* ckpt_rows, T* out, int nv, int dk, int dv) {
    pdl_begin();
    extern __shared__ float smem[];
    float *Ws = smem, *Qg = Ws + L * TC_WQ, *Kt = Qg + L * TC_WQ, *Ps = Kt + L * TC_KT, *Ss = Ps + L * TC_P;
    float* Vs = Ss + DK_MAX * TC_SV;
    const int b = blockIdx.z, h = blockIdx.y, j0 = blockIdx.x * BV;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
    const int s0 = query_start[b], n = query_start[b + 1] - s0;
    if (n == 0) return;   // no tokens: the state row is left as it is
    const Rec rec(dv);
    const bool live = has_state(query_start, context_lens, b), col = j0 + lane < dv;
    float* Sg = state + (long long)slots[b] * state_stride + (long long)h * dk * dv + j0 + lane;
    for (int d = warp; d < DK_MAX; d += TC_WARPS)
        Ss[d * TC_SV + lane] = live && col && d < dk ? Sg[(long long)d * dv] : 0.f;
    const Chunks chunks(ckpt_lens, b, n);
    const float* R0 = scratch + (rec_index(query_start, ckpt_lens, b, 0) * nv + h) * rec.total;
    stage_rows(Ws, TC_WQ, R0 + rec.W, L, DK_MAX);
    stage_rows(Qg, TC_WQ, R0 + rec.Qg, L, DK_MAX);
    stage_rows(Kt, TC_KT, R0 + rec.Kt, L, DK_MAX);
    stage_rows(Ps, TC_P, R0 + rec.P, L, L);
    cp_async_commit();
    // this warp's V' / O tile, and this thread's accumulator entries i: row r0 + g + 8 (i / 2), column ca + i % 2
    const int r0 = 16 * (warp / 4), n0 = 8 * (warp % 4), ca = n0 + 2 * t;
    for (int c = 0; c < chunks.count; ++c) {
        const int cs = chunks.start(c), nc = chunks.size(c, n);
        const float* R = scratch + (rec_index(query_start, ckpt_lens, b, c) * nv + h) * rec.total;
        const float* next = c + 1 < chunks.count ? R + (long long)nv * rec.total : nullptr;   // chunk c + 1's record
        float u[4];   // U at this thread's V' entries, loaded while the copies land
#pragma unroll
        for (int i = 0; i < 4; ++i)
            u[i] = j0 + ca + i % 2 < dv ? R[rec.U + (r0 + g + 8 * (i / 2)) * dv + j0 + ca + i % 2] : 0.f;
        cp_async_wait<0>();
        __syncthreads();
        // a. V' = U - W S and O = Qg S on this warp's tile (k = 128)
        float v[4] = {}, vx[4] = {}, o[4] = {}, ox[4] = {};
#pragma unroll 4
        for (int k0 = 0; k0 < DK_MAX; k0 += 8) {
            unsigned int wh[4], wl[4], qh[4], ql[4], sh[2], sl[2];
            frag_a<false>(wh, wl, Ws + r0 * TC_WQ + k0, TC_WQ, g, t);
            frag_a<false>(qh, ql, Qg + r0 * TC_WQ + k0, TC_WQ, g, t);
            frag_b(sh, sl, Ss + k0 * TC_SV + n0, TC_SV, g, t);
            mma3(v, vx, wh, wl, sh, sl);
            mma3(o, ox, qh, ql, sh, sl);
        }
#pragma unroll
        for (int i = 0; i < 4; ++i) Vs[(r0 + g + 8 * (i / 2)) * TC_SV + ca + i % 2] = u[i] - (v[i] + vx[i]);
        __syncthreads();   // V' is whole; W and Qg are free
        if (next != nullptr) {
            stage_rows(Ws, TC_WQ, next + rec.W, L, DK_MAX);
            stage_rows(Qg, TC_WQ, next + rec.Qg, L, DK_MAX);
            cp_async_commit();
        }
        // b. O += P V' (P is zero above its diagonal: k only up to this tile's last row), then out
        for (int k0 = 0; k0 < r0 + 16; k0 += 8) {
            unsigned int ph[4], pl[4], vh[2], vl[2];
            frag_a<false>(ph, pl, Ps + r0 * TC_P + k0, TC_P, g, t);
            frag_b(vh, vl, Vs + k0 * TC_SV + n0, TC_SV, g, t);
            mma3(o, ox, ph, pl, vh, vl);
        }
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            const int row = r0 + g + 8 * (i / 2), j = j0 + ca + i % 2;
            if (row < nc && j < dv) out[((long long)(s0 + cs + row) * nv + h) * dv + j] = from_f32<T>(o[i] + ox[i]);
        }
        // c. S = exp(gamma_L) S + Kt^T V' on this warp's two S tiles (rows d0 = r0 and r0 + 64; k = 64); the state at
        // the run's checkpoint goes out as it is made
        const float decay = R[rec.dec];
        float* ck = c + 1 == chunks.first ? state + (long long)ckpt_rows[b] * state_stride + (long long)h * dk * dv
                                          : nullptr;
#pragma unroll
        for (int d0 = r0; d0 < DK_MAX; d0 += 64) {
            float s[4] = {}, sx[4] = {};
#pragma unroll 4
            for (int k0 = 0; k0 < L; k0 += 8) {
                unsigned int kh[4], kl[4], vh[2], vl[2];
                frag_a<true>(kh, kl, Kt + k0 * TC_KT + d0, TC_KT, g, t);
                frag_b(vh, vl, Vs + k0 * TC_SV + n0, TC_SV, g, t);
                mma3(s, sx, kh, kl, vh, vl);
            }
#pragma unroll
            for (int i = 0; i < 4; ++i) {
                const int d = d0 + g + 8 * (i / 2), j = ca + i % 2;
                const float sn = decay * Ss[d * TC_SV + j] + (s[i] + sx[i]);
                Ss[d * TC_SV + j] = sn;
                if (ck != nullptr && d < dk && j0 + j < dv) ck[(long long)d * dv + j0 + j] = sn;
            }
        }
        __syncthreads();   // Kt, P and V' are free; S is whole
        if (next != nullptr) {
            stage_rows(Kt, TC_KT, next + rec.Kt, L, DK_MAX);
            stage_rows(Ps, TC_P, next + rec.P, L, L);
            cp_async_commit();
        }
    }
    if (col)
        for (int d = warp; d < dk; d += TC_WARPS) Sg[(long long)d * dv] = Ss[d * TC_SV + lane];
}

#define CHUNK_KERNELS(suffix, T)                                                                               \
    extern "C" __global__ void __launch_bounds__(CH_THREADS, 2) gdn_chunk_prep_##suffix(                        \
        const T* q, long long q_stride, const T* k, long long k_stride, const T* v, long long v_stride,        \
        const float* g, const float* beta, const int* qs, const int* ckpt_lens, float* scratch, int nk,        \
        int nv, int dk, int dv) {                                                                               \
        gdn_chunk_prep<T>(q, q_stride, k, k_stride, v, v_stride, g, beta, qs, ckpt_lens, scratch, nk, nv, dk,  \
                          dv);                                                                                  \
    }                                                                                                           \
    extern "C" __global__ void __launch_bounds__(32 * TC_WARPS) gdn_chunk_state_##suffix(                       \
        const float* scratch, float* state, long long state_stride, const int* slots, const int* qs,            \
        const int* ctx, const int* ckpt_lens, const int* ckpt_rows, T* out, int nv, int dk, int dv) {           \
        gdn_chunk_state<T>(scratch, state, state_stride, slots, qs, ctx, ckpt_lens, ckpt_rows, out, nv, dk, dv);\
    }

FOR_EACH_DTYPE(CHUNK_KERNELS)
