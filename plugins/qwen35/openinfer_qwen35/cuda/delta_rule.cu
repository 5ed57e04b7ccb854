// The gated delta rule of the Gated DeltaNet, fp32 state [R, nv, dk, dv] (any row stride), fp32 math.
// Per token and value head h (key head h / (nv / nk)), with q, k L2-normalised and q scaled by dk^-0.5:
//     S = exp(g) S;  S += k (beta (v - S^T k))^T;  o = S^T q
// Columns of S are independent given q, k, g, beta, so every kernel splits dv into 32-column tiles.
// This file: the one-token decode step; delta_rule_chunk.cu: the chunked prefill.
#include "common.cuh"
#include "cluster.cuh"   // cluster_sync, ld_cluster (the decode step with the output norm folded in)
#include "gdn.cuh"

// Entry i of the q and k rows of one key head (thread i holds it; zero past dk) into shared memory,
// L2-normalised (eps 1e-6 inside the root, as the reference); q also scaled by dk^-0.5. Both sums in one
// block reduction, each summed as block_sum sums it (the same bits). blockDim.x >= DK_MAX.
__device__ void normalize_qk(float qi, float ki, int dk, float* sq, float* sk) {
    __shared__ float2 partial[32];
    const int i = threadIdx.x, lane = i & 31, warp = i >> 5, nwarps = blockDim.x >> 5;
    const float qw = warp_sum(qi * qi), kw = warp_sum(ki * ki);
    if (lane == 0) partial[warp] = make_float2(qw, kw);
    __syncthreads();
    const float2 p = lane < nwarps ? partial[lane] : make_float2(0.f, 0.f);
    const float qq = warp_sum(p.x), kk = warp_sum(p.y);
    if (i < DK_MAX) {
        sq[i] = qi / sqrtf(qq + 1e-6f) * rsqrtf((float)dk);
        sk[i] = ki / sqrtf(kk + 1e-6f);
    }
    __syncthreads();
}

// Decode: one token per sequence. grid (ceil(dv / BV), nv, B), 128 threads: lane = state column,
// warp w holds rows w, w+4, ... of the column tile in registers (coalesced 128-byte row reads).
constexpr int DEC_WARPS = 4, DEC_ROWS = DK_MAX / DEC_WARPS;

// Where the decode step's (g, beta) of sequence b, value head h come from: gdn_gating's output, or computed
// from the in_proj rows a, b by the step itself (gdn.cuh's gdn_gate, the same bits), one launch fewer a layer.
struct GatesGiven {
    const float* g;
    const float* beta;
    int nv;
    __device__ float2 operator()(int b, int h) const { return make_float2(g[b * nv + h], beta[b * nv + h]); }
};

template <typename T>
struct GatesFromAB {
    const T* a;
    long long a_stride;
    const T* bb;
    long long b_stride;
    const float* A_log;
    const float* dt_bias;
    __device__ float2 operator()(int b, int h) const {
        return gdn_gate(to_f32(a[b * a_stride + h]), to_f32(bb[b * b_stride + h]), A_log[h], dt_bias[h]);
    }
};

// Where the decode step's output o goes once the block has summed it (warp 0, lane = column j): stored as it is
// (StoreOut), or through the GDN output norm (NormOut). load() runs after the PDL wait, before the state update.
template <typename T>
struct StoreOut {
    T* out;
    __device__ void load(int, int, int, bool, int) {}
    __device__ void store(const float (*red)[BV], int b, int h, int j, int lane, int warp, bool col, int nv,
                          int dv) {
        if (warp == 0 && col) {
            float o = 0.f;
#pragma unroll
            for (int w = 0; w < DEC_WARPS; ++w) o += red[w][lane];
            out[((long long)b * nv + h) * dv + j] = from_f32<T>(o);
        }
    }
};

// out = rms_norm(o) * w * silu(z) over the head's dv values, bit for bit as gated_rms_norm (gates.cu) computes it
// from the stored o: the ceil(dv / BV) column tiles of one (sequence, head) run as one thread-block cluster of
// (ceil(dv / BV), 1, 1) CTAs (cluster rank = blockIdx.x = column tile; a single tile runs without). Each rounds its
// o to T and back (what gated_rms_norm reads), leaves it in its shared memory, and after a cluster barrier lane l
// of every tile sums the squares of elements l, l + 32, ... (rank 0 first, from 0.f: gated_rms_norm's loop, the
// same expression, so the same contraction into fma), then the same warp_sum, inverse and product. A second
// barrier keeps each CTA's shared memory alive until every CTA of the cluster has read it.
constexpr int NORM_TILES_MAX = 8;   // dv <= 256: the portable cluster size

template <typename T>
struct NormOut {
    T* out;
    const T* z;
    long long z_stride;
    const T* w;
    float eps;
    float zj = 0.f, wj = 0.f;   // column j's gate and weight (warp 0), loaded before the state update
    __device__ void load(int b, int h, int j, bool col, int dv) {
        if (threadIdx.x < BV && col) {
            zj = to_f32(z[b * z_stride + (long long)h * dv + j]);
            wj = to_f32(w[j]);
        }
    }
    __device__ void store(const float (*red)[BV], int b, int h, int j, int lane, int warp, bool col, int nv,
                          int dv) {
        __shared__ float xs[BV];   // this tile's o as stored, for the cluster
        float x = 0.f;
        if (warp == 0) {
            float o = 0.f;
#pragma unroll
            for (int wp = 0; wp < DEC_WARPS; ++wp) o += red[wp][lane];   // StoreOut's sum
            x = to_f32(from_f32<T>(o));
            xs[lane] = x;   // lanes past dv (col false): never read
        }
        const bool cluster = gridDim.x > 1;   // one tile: each lane reads back only its own word
        if (cluster) cluster_sync();
        if (warp == 0) {
            float xr[NORM_TILES_MAX];   // element r BV + lane, from CTA r: every load issued before the sum
#pragma unroll
            for (int r = 0; r < NORM_TILES_MAX; ++r)
                xr[r] = r * BV + lane < dv ? (cluster ? ld_cluster(&xs[lane], r) : xs[lane]) : 0.f;
            float ss = 0.f;
#pragma unroll
            for (int r = 0; r < NORM_TILES_MAX; ++r)
                if (r * BV + lane < dv) ss += xr[r] * xr[r];   // gated_rms_norm: i = lane, lane + 32, ... < d
            const float inv = 1.f / sqrtf(warp_sum(ss) / dv + eps);
            if (col) out[((long long)b * nv + h) * dv + j] = from_f32<T>(x * inv * wj * silu(zj));
        }
        if (cluster) cluster_sync();
    }
};

template <typename T, typename Gates, typename Out>
__device__ void gdn_decode(const T* q, long long q_stride, const T* k, long long k_stride, const T* v,
                           long long v_stride, const Gates& gates, float* state,
                           long long state_stride, const int* slots, const int* query_start,
                           const int* context_lens, Out sink, int nk, int nv, int dk, int dv) {
    __shared__ float sq[DK_MAX], sk[DK_MAX], red[DEC_WARPS][BV], ored[DEC_WARPS][BV];
    const int b = blockIdx.z, h = blockIdx.y, lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int j = blockIdx.x * BV + lane;
    const bool live = has_state(query_start, context_lens, b), col = j < dv;
    float* S = state + (long long)slots[b] * state_stride + (long long)h * dk * dv + j;
    // the state (last written by this kernel a step ago) is read before griddepcontrol.wait: under PDL
    // its loads overlap the kernel before this one; q, k, v, g and beta are read after the wait
    float s[DEC_ROWS], kS = 0.f;
#pragma unroll
    for (int r = 0; r < DEC_ROWS; ++r) {
        const int i = r * DEC_WARPS + warp;
        s[r] = live && col && i < dk ? S[(long long)i * dv] : 0.f;
    }
    pdl_begin();
    // What the kernels before this one wrote (q, k, v and the gating inputs) is loaded at once, before any of
    // it is used: one round trip to L2 after the wait instead of three (q and k, then the gates, then v).
    const int i0 = threadIdx.x, kh = h / (nv / nk);
    const float qi = i0 < dk ? to_f32(q[b * q_stride + (long long)kh * dk + i0]) : 0.f;
    const float ki = i0 < dk ? to_f32(k[b * k_stride + (long long)kh * dk + i0]) : 0.f;
    const float vj = col ? to_f32(v[b * v_stride + (long long)h * dv + j]) : 0.f;
    sink.load(b, h, j, col, dv);
    const float2 gb = gates(b, h);
    normalize_qk(qi, ki, dk, sq, sk);
    const float decay = expf(gb.x);
#pragma unroll
    for (int r = 0; r < DEC_ROWS; ++r) {
        s[r] *= decay;
        kS += sk[r * DEC_WARPS + warp] * s[r];
    }
    red[warp][lane] = kS;
    __syncthreads();
    kS = 0.f;
#pragma unroll
    for (int w = 0; w < DEC_WARPS; ++w) kS += red[w][lane];
    const float delta = col ? gb.y * (vj - kS) : 0.f;
    float o = 0.f;
#pragma unroll
    for (int r = 0; r < DEC_ROWS; ++r) {
        const int i = r * DEC_WARPS + warp;
        s[r] += sk[i] * delta;
        o += sq[i] * s[r];
        if (col && i < dk) S[(long long)i * dv] = s[r];
    }
    ored[warp][lane] = o;
    __syncthreads();
    sink.store(ored, b, h, j, lane, warp, col, nv, dv);
}

#define DELTA_RULE_KERNELS(suffix, T)                                                                          \
    extern "C" __global__ void gdn_decode_##suffix(                                                            \
        const T* q, long long q_stride, const T* k, long long k_stride, const T* v, long long v_stride,        \
        const float* g, const float* beta, float* state, long long state_stride, const int* slots,             \
        const int* qs, const int* ctx, T* out, int nk, int nv, int dk, int dv) {                               \
        gdn_decode<T>(q, q_stride, k, k_stride, v, v_stride, GatesGiven{g, beta, nv}, state, state_stride,     \
                      slots, qs, ctx, StoreOut<T>{out}, nk, nv, dk, dv);                                        \
    }                                                                                                           \
    extern "C" __global__ void gdn_decode_gated_##suffix(                                                      \
        const T* q, long long q_stride, const T* k, long long k_stride, const T* v, long long v_stride,        \
        const T* a, long long a_stride, const T* bb, long long b_stride, const float* A_log,                  \
        const float* dt_bias, float* state, long long state_stride, const int* slots, const int* qs,           \
        const int* ctx, T* out, int nk, int nv, int dk, int dv) {                                               \
        gdn_decode<T>(q, q_stride, k, k_stride, v, v_stride,                                                    \
                      GatesFromAB<T>{a, a_stride, bb, b_stride, A_log, dt_bias}, state, state_stride, slots,   \
                      qs, ctx, StoreOut<T>{out}, nk, nv, dk, dv);                                               \
    }                                                                                                           \
    /* gdn_decode_gated, then gated_rms_norm(out, z, w, eps) folded in (NormOut): grid (ceil(dv / 32), nv, B) in  \
       clusters of (ceil(dv / 32), 1, 1) CTAs, dv <= 256 (no cluster where dv <= 32); z [B, nv, dv] (any token    \
       stride), w [dv] */                                                                                       \
    extern "C" __global__ void gdn_decode_gated_norm_##suffix(                                                 \
        const T* q, long long q_stride, const T* k, long long k_stride, const T* v, long long v_stride,        \
        const T* a, long long a_stride, const T* bb, long long b_stride, const float* A_log,                  \
        const float* dt_bias, float* state, long long state_stride, const int* slots, const int* qs,           \
        const int* ctx, const T* z, long long z_stride, const T* w, T* out, int nk, int nv, int dk, int dv,    \
        float eps) {                                                                                            \
        gdn_decode<T>(q, q_stride, k, k_stride, v, v_stride,                                                    \
                      GatesFromAB<T>{a, a_stride, bb, b_stride, A_log, dt_bias}, state, state_stride, slots,   \
                      qs, ctx, NormOut<T>{out, z, z_stride, w, eps}, nk, nv, dk, dv);                           \
    }

FOR_EACH_DTYPE(DELTA_RULE_KERNELS)
