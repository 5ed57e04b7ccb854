// Skinny GEMM for decode steps of up to 128 rows (sm_90a): y[M, N] = x[M, K] @ w[N, K]^T in bf16 with fp32
// accumulation. Like the GEMV of M <= 8 (gemv.cu) it is weight-bandwidth bound: at M = 32 / 128 a step streams the
// same 8 GB of Qwen3-4B weights as at M = 1, and cuBLASLt's best algorithms reach ~70 % / ~60 % of the floor there
// (docs/benchmarks/qwen3-4b-h200.md); at M <= 8 the GEMV trails a plain read of each weight by 10-20 %, which the
// width-8 variant may close (chosen per weight only where start-up timing finds it faster, skinny_tune.py).
// The design keeps the SM's instruction stream out of the weights' way:
//
// * The product is taken transposed, y^T[N, M] = w x^T, so the weights are wgmma's A operand (64 rows a warpgroup)
//   and the batch is its n dimension (MP = M padded to 8 / 16 / 32 / 64 / 128): both operands K-major, read by
//   128-byte-swizzle descriptors from shared memory, as in attention_wgmma.cu's S = Q K^T.
// * One CTA = 3 warpgroups: warpgroup 0 is the producer, one thread of which streams the stages by TMA (2-D box copies
//   of w [BN = 128 rows][BK = 64 k] and x [MP rows][BK], out-of-range rows and k arriving as zeros); warpgroups 1 and 2
//   each multiply 64 of the tile's weight rows. STAGES stages of full / empty mbarriers: up to 8 x 16 KB of weights
//   in flight per SM with no load instruction per 16 bytes.
// * Split-K across CTAs (gridDim.y, blas-side choice in skinny_gemm.py): a tile's splits form one thread-block
//   cluster. Each stages its fp32 partial tile [MP][BN] in its (drained) stage memory; after a cluster barrier, rank
//   r sums share r of the tile over every rank's partials in split order (deterministic) and stores bf16 rows of y.
// * SILU (skinny_gemm_silu_*): w = [gate; up] ([2 inter, K]); tile t takes gate rows 64t .. 64t + 63 as its rows 0..63
//   (warpgroup 1) and the matching up rows as 64..127 (warpgroup 2), two 64-row boxes a stage, and stores
//   out[m, 64t + j] = silu_mul(bf16(gate), bf16(up)): the bits of silu_mul(linear(x, w)) through this kernel.
// * Programmatic dependent launch: the weights of the first stages are requested before griddepcontrol.wait (they
//   do not depend on the previous kernel), x after it.
// Mirrored in skinny_gemm.py (SG_* constants, the shared-memory size, the kernel names) and emulated in
// tests/kernels/test_skinny_gemm_emulation.py: change them together.
#include "common.cuh"
#include "cluster.cuh"   // cluster_sync, ld_cluster
#include "tma.cuh"       // tensor maps, mbarriers, TMA box copies
#include "wgmma.cuh"     // descriptors, fences, wgmma shapes

constexpr int SG_BN = 128;                  // weight rows (= output columns) a CTA takes: two consumer warpgroups
constexpr int SG_BK = 64;                   // k a stage: one 128-byte swizzled row per weight / x row
constexpr int SG_THREADS = 384;             // warpgroup 0 produces, 1 and 2 consume
constexpr int SG_ROW = 128;                 // bytes of a swizzled shared-memory row
constexpr int SG_W_BYTES = SG_BN * SG_ROW;  // one stage of weights: 16 KB
constexpr int SG_STAGE_BUDGET = 200 * 1024; // stage bytes at most of a variant that holds an SM alone; one of two
                                            // CTAs a SM (the _x2 kernels) gets half, which lets one's pipeline fill
                                            // overlap the other's stream and more tiles run at once
constexpr int SG_MAX_STAGES = 8;
constexpr int SG_PAD = 4;                   // floats after each staged partial row (bank-conflict-free writes)
constexpr int SG_CONSUMER_WARPS = 8;        // arrivals that free a stage

template <int MP, int PER_SM> struct SkinnyShape {   // PER_SM: CTAs a SM the variant is built for (1 or 2)
    static constexpr int X_BYTES = MP * SG_ROW;
    static constexpr int STAGE = SG_W_BYTES + X_BYTES;
    static constexpr int BUDGET = SG_STAGE_BUDGET / PER_SM;
    static constexpr int STAGES = BUDGET / STAGE < SG_MAX_STAGES ? BUDGET / STAGE : SG_MAX_STAGES;
    static constexpr int LD = SG_BN + SG_PAD;  // floats of a staged partial row (one batch row m)
    static_assert(MP * LD * 4 <= STAGES * STAGE, "the partial tile must fit the drained stages");
};

template <int MP>
__device__ __forceinline__ void wgmma_skinny(float* d, unsigned long long a, unsigned long long b) {
    if constexpr (MP == 8) wgmma_m64n8k16_ss(d, a, b, 1);
    else if constexpr (MP == 16) wgmma_m64n16k16_ss(d, a, b, 1);
    else if constexpr (MP == 32) wgmma_m64n32k16_ss(d, a, b, 1);
    else if constexpr (MP == 64) wgmma_m64n64k16_ss(d, a, b, 1);
    else wgmma_m64n128k16_ss(d, a, b, 1);
}

// dynamic shared memory: [1024 bytes of alignment slack][STAGES x (w [BN][64] | x [MP][64])][full[STAGES]][empty[STAGES]]
// The float4 at `local`'s place in every split's staged partials, summed in rank order.
__device__ __forceinline__ float4 sum_splits(const float4* local, int splits) {
    float4 acc = splits == 1 ? *local : ld_cluster(local, 0);
    for (int i = 1; i < splits; ++i) {
        const float4 t = ld_cluster(local, i);
        acc.x += t.x; acc.y += t.y; acc.z += t.z; acc.w += t.w;
    }
    return acc;
}

__device__ __forceinline__ float round_bf16(float v) { return to_f32(from_f32<bf16>(v)); }

// SILU = false: y[M, N]. SILU = true: y[M, N] with N = inter, the weight [2 inter, K] read in boxes of 64 rows.
template <int MP, bool SILU, int PER_SM>
__device__ __forceinline__ void skinny_gemm(const TensorMap* wmap, const TensorMap* xmap, bf16* __restrict__ y,
                                            long long ldy, int M, int N, int ktiles) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    using S = SkinnyShape<MP, PER_SM>;
    extern __shared__ __align__(16) unsigned char smem_raw[];
    // the swizzle pattern repeats every 1024 bytes of absolute shared address: align the base
    unsigned char* stages = smem_raw + ((1024 - (shared_addr(smem_raw) & 1023)) & 1023);
    unsigned long long* full = reinterpret_cast<unsigned long long*>(stages + S::STAGES * S::STAGE);
    unsigned long long* empty = full + S::STAGES;
    const int tile = blockIdx.x, split = blockIdx.y, splits = gridDim.y;
    const int k0 = (int)((long long)ktiles * split / splits), iters = (int)((long long)ktiles * (split + 1) / splits) - k0;
    const int wg = threadIdx.x >> 7, warp = (threadIdx.x >> 5) & 3, lane = threadIdx.x & 31;
    if (threadIdx.x == 0) {
        for (int s = 0; s < S::STAGES; ++s) {
            mbar_init(&full[s], 1);
            mbar_init(&empty[s], SG_CONSUMER_WARPS);
        }
        mbar_init_fence();
    }
    __syncthreads();

    float d[MP / 2];
    if (wg == 0) {
        if (threadIdx.x == 0) {   // the producer
            tma_prefetch_map(wmap);
            tma_prefetch_map(xmap);
            // a stage's weights: 128 rows from tile * 128, or SILU's 64 gate rows from tile * 64 and their up rows
            auto load_w = [&](int i, int s) {
                unsigned char* dst = stages + s * S::STAGE;
                if constexpr (SILU) {
                    tma_load_2d(dst, wmap, (k0 + i) * SG_BK, tile * 64, &full[s]);
                    tma_load_2d(dst + 64 * SG_ROW, wmap, (k0 + i) * SG_BK, N + tile * 64, &full[s]);
                } else {
                    tma_load_2d(dst, wmap, (k0 + i) * SG_BK, tile * SG_BN, &full[s]);
                }
            };
            const int first = iters < S::STAGES ? iters : S::STAGES;
            for (int i = 0; i < first; ++i) {
                mbar_arrive_expect_tx(&full[i], S::STAGE);
                load_w(i, i);
            }
            asm volatile("griddepcontrol.wait;" ::: "memory");
            for (int i = 0; i < first; ++i)
                tma_load_2d(stages + i * S::STAGE + SG_W_BYTES, xmap, (k0 + i) * SG_BK, 0, &full[i]);
            for (int i = first; i < iters; ++i) {
                const int s = i % S::STAGES;
                mbar_wait(&empty[s], ((i / S::STAGES) & 1) ^ 1);   // released by the consumers' pass i - STAGES
                mbar_arrive_expect_tx(&full[s], S::STAGE);
                load_w(i, s);
                tma_load_2d(stages + s * S::STAGE + SG_W_BYTES, xmap, (k0 + i) * SG_BK, 0, &full[s]);
            }
        } else {
            asm volatile("griddepcontrol.wait;" ::: "memory");
        }
    } else {   // consumers: warpgroup wg multiplies weight rows 64 (wg - 1) .. 64 wg - 1 of the tile
        asm volatile("griddepcontrol.wait;" ::: "memory");   // y may still be read by an earlier kernel
#pragma unroll
        for (int i = 0; i < MP / 2; ++i) d[i] = 0.f;
        for (int i = 0; i < iters; ++i) {
            const int s = i % S::STAGES;
            mbar_wait(&full[s], (i / S::STAGES) & 1);
            const unsigned int wa = shared_addr(stages + s * S::STAGE) + (wg - 1) * 64 * SG_ROW;
            const unsigned int xa = shared_addr(stages + s * S::STAGE + SG_W_BYTES);
            wgmma_fence();
#pragma unroll
            for (int kk = 0; kk < SG_BK / 16; ++kk)   // k-step kk: 32 bytes into each swizzled row
                wgmma_skinny<MP>(d, wgmma_desc_sw128(wa + kk * 32, 16, 1024), wgmma_desc_sw128(xa + kk * 32, 16, 1024));
            wgmma_commit();
            wgmma_wait<1>();   // the previous stage's wgmmas have read their operands: free that stage
            if (i > 0 && lane == 0) mbar_arrive(&empty[(i - 1) % S::STAGES]);
        }
        wgmma_wait<0>();
        wgmma_pin<MP / 2>(d);
    }
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
    __syncthreads();   // every wgmma has read its stage: the stages become the partial tile

    // partial tile part[m][n] (fp32, row stride LD): accumulator d[4j + e] holds weight row r (+ 8 for e >= 2)
    // and batch row 8j + 2 (lane % 4) + e % 2, r = 64 (wg - 1) + 16 warp + lane / 4 (wgmma.cuh's m64nN layout)
    float* part = reinterpret_cast<float*>(stages);
    if (wg > 0) {
        const int r = (wg - 1) * 64 + warp * 16 + (lane >> 2), m0 = 2 * (lane & 3);
#pragma unroll
        for (int j = 0; j < MP / 8; ++j) {
            float* p = part + (8 * j + m0) * S::LD + r;
            p[0] = d[4 * j];
            p[S::LD] = d[4 * j + 1];
            p[8] = d[4 * j + 2];
            p[S::LD + 8] = d[4 * j + 3];
        }
    }
    cluster_sync();   // every split's partials are staged (no cluster: a CTA barrier)

    // rank `split` sums chunks [lo, hi) of the tile's output (chunk c = batch row c / ROW_CHUNKS, 4 columns from
    // 4 (c % ROW_CHUNKS)) over the splits in rank order and stores them as bf16; SILU's 64 columns each combine
    // partial column j (gate) with column 64 + j (up)
    constexpr int COLS = SILU ? 64 : SG_BN, ROW_CHUNKS = COLS / 4, CHUNKS = MP * ROW_CHUNKS;
    const int lo = CHUNKS * split / splits, hi = CHUNKS * (split + 1) / splits;
    for (int c = lo + threadIdx.x; c < hi; c += SG_THREADS) {
        const int m = c / ROW_CHUNKS, nl = (c % ROW_CHUNKS) * 4, n = tile * COLS + nl;
        if (m >= M || n >= N) continue;
        const float4 acc = sum_splits(reinterpret_cast<const float4*>(part + m * S::LD + nl), splits);
        float v[4] = {acc.x, acc.y, acc.z, acc.w};
        if constexpr (SILU) {
            const float4 up = sum_splits(reinterpret_cast<const float4*>(part + m * S::LD + 64 + nl), splits);
            const float u[4] = {up.x, up.y, up.z, up.w};
#pragma unroll
            for (int e = 0; e < 4; ++e) v[e] = silu_mul_f32(round_bf16(v[e]), round_bf16(u[e]));
        }
        bf16* out = y + m * ldy + n;
#pragma unroll
        for (int e = 0; e < 4; ++e)
            if (n + e < N) out[e] = from_f32<bf16>(v[e]);
    }
    cluster_sync();   // the other ranks' shared memory stays until every rank has read it
#endif
}

// skinny_gemm_bf16_n<MP>: batch rows padded to MP. grid (ceil(N / 128), splits), block 384, cluster (1, splits, 1)
// when splits > 1, dynamic shared memory skinny_gemm.py's smem_bytes(MP). wmap: w [N][K] in boxes [128][64];
// xmap: x [M][K] in boxes [MP][64]; ktiles = ceil(K / 64).
// skinny_gemm_silu_bf16_n<MP>: the same with grid (ceil(inter / 64), splits), N = inter, wmap in boxes [64][64].
// ..._x2: built for two CTAs a SM (half the stages, registers capped for it).
#define SKINNY_GEMM_KERNEL(NAME, MP, SILU, PER_SM, TAG)                                                         \
    extern "C" __global__ void __launch_bounds__(SG_THREADS, PER_SM) NAME##MP##TAG(                             \
        const __grid_constant__ TensorMap wmap, const __grid_constant__ TensorMap xmap, bf16* __restrict__ y,   \
        long long ldy, int M, int N, int ktiles) {                                                              \
        skinny_gemm<MP, SILU, PER_SM>(&wmap, &xmap, y, ldy, M, N, ktiles);                                      \
    }
#define SKINNY_GEMM_WIDTHS(NAME, SILU, PER_SM, TAG)                                                     \
    SKINNY_GEMM_KERNEL(NAME, 8, SILU, PER_SM, TAG) SKINNY_GEMM_KERNEL(NAME, 16, SILU, PER_SM, TAG)      \
    SKINNY_GEMM_KERNEL(NAME, 32, SILU, PER_SM, TAG) SKINNY_GEMM_KERNEL(NAME, 64, SILU, PER_SM, TAG)

SKINNY_GEMM_WIDTHS(skinny_gemm_bf16_n, false, 1, )
SKINNY_GEMM_KERNEL(skinny_gemm_bf16_n, 128, false, 1, )
SKINNY_GEMM_WIDTHS(skinny_gemm_silu_bf16_n, true, 1, )
SKINNY_GEMM_KERNEL(skinny_gemm_silu_bf16_n, 128, true, 1, )
// two CTAs a SM up to width 64: at 128 the accumulators need more registers than two CTAs of 384 threads leave
SKINNY_GEMM_WIDTHS(skinny_gemm_bf16_n, false, 2, _x2)
SKINNY_GEMM_WIDTHS(skinny_gemm_silu_bf16_n, true, 2, _x2)
