// The routed experts' grouped GEMMs of prefill-sized steps on Hopper warpgroup MMA (sm_90a; elsewhere the bodies
// compile to nothing and moe.py runs moe_gemm.cuh's 128-row tiles). Same contract as moe.cu's moe_gate_up_bf16_m8 /
// moe_down_bf16_m8: the row tiles of moe_align (128 rows, one expert each), gate_up writing h = silu(gate x) * up x
// in bf16 in sorted order, down writing weight * (h . W_down^T) in fp32 at each pair's own row.
//
// Why: at a 1k-token prefill of V2-Lite every expert is chosen, so a layer streams all its expert weights (1.1 GB)
// for ~96 rows an expert: the step is bound by the weights' read, and mma.sync's 128 x 64 tiles in 4 warps (2 blocks
// an SM, 3 stages) kept too few bytes in flight. Here:
//   block (n tile, row tile), two warpgroups of 64 rows: C[128 x 128] = A rows . W_e^T over K, in stages of 64
//   columns; a stage is the 128 A rows (gathered: x rows of the tile's tokens for gate_up, h rows for down) and the
//   128 W rows, each as [128][64] bf16 with the 128-byte swizzle (wgmma.cuh), filled by cp.async (a thread copies
//   16-byte chunks, eight threads a 128-byte row), MW_STAGES deep; each warpgroup issues four m64n128k16 on it.
//   gate_up: W rows 0-63 are gate rows n0.., 64-127 the matching up rows, so a thread's accumulator columns j and
//   j + 64 are gate and up of one output; down: the 128 W rows are 128 output columns.
// The pipeline: at k-step kt a thread waits for its own copies of stage kt, fences them to the async proxy, and the
// block barrier publishes every thread's; the barrier also means every warpgroup has retired the wgmma of step
// kt - 2 (each waits until one group is pending after issuing), so stage kt + MW_STAGES - 2 refills that slot.
// Mirrored in moe.py (MW_* constants, the shared-memory size).
#include "common.cuh"
#include "mma.cuh"     // cp.async, smem_addr, bf16x2 packing
#include "wgmma.cuh"   // descriptors, fences, m64n128k16, the swizzled layout

constexpr int MW_THREADS = 256, MW_BM = 128, MW_BN = 128, MW_BK = 64, MW_STAGES = 5;
constexpr int MW_TILE = 128 * 128;          // bytes of [128][64] bf16 (A or W) in a stage
constexpr int MW_STAGE = 2 * MW_TILE;

// Chunk i of 128 rows x 8 chunks into a swizzled [128][64] tile (wgmma.cuh's layout): row i / 8, 16-byte chunk
// i % 8; rows[r] null or k at or past K: zeros (the copy names `any`, reads nothing).
__device__ __forceinline__ void copy_chunk(unsigned char* tile, int i, const bf16* const* rows, int k0, int K,
                                           const bf16* any) {
    const int r = i >> 3, c = i & 7, k = k0 + c * 8;
    const bool ok = rows[r] != nullptr && k < K;
    cp_async16(tile + sw128_offset(r, c * 8, MW_BM), ok ? rows[r] + k : any, ok ? 16 : 0);
}

template <bool GATE_UP>
__device__ void moe_gemm_wgmma(const bf16* a, long long a_stride, const int* sorted, int topk, const bf16* w,
                               long long w_expert_stride, int N, int K, const int* tile_expert, const int* tile_start,
                               const int* tile_end, const int* num_tiles, const float* route_w, void* out,
                               long long out_stride) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    extern __shared__ __align__(16) unsigned char smem_raw[];
    // the swizzle pattern repeats every 1024 bytes of shared address: align the base (moe.py adds the slack)
    unsigned char* smem = smem_raw + ((1024 - (smem_addr(smem_raw) & 1023)) & 1023);
    __shared__ const bf16* a_rows[MW_BM];
    __shared__ const bf16* w_rows[MW_BN];   // null past N
    __shared__ int pair_of[MW_BM];
    pdl_wait();   // the trigger follows the main loop (common.cuh)
    const int slot = blockIdx.y;
    if (slot >= *num_tiles) return;
    const int e = tile_expert[slot], r0 = tile_start[slot], m = min(MW_BM, tile_end[slot] - r0);
    const int n0 = blockIdx.x * (GATE_UP ? MW_BN / 2 : MW_BN);   // first output column of the block
    const bf16* we = w + e * w_expert_stride;
    for (int i = threadIdx.x; i < MW_BM + MW_BN; i += MW_THREADS) {
        if (i < MW_BM) {
            const int p = i < m ? sorted[r0 + i] : -1;
            pair_of[i] = p;
            const long long row = GATE_UP ? p / topk : r0 + i;   // gate_up: the token's x row; down: h, sorted
            a_rows[i] = p < 0 ? nullptr : a + row * a_stride;
        } else {
            const int r = i - MW_BM, col = n0 + (GATE_UP ? r % (MW_BN / 2) : r);
            w_rows[r] = col >= N ? nullptr : we + (long long)(GATE_UP && r >= MW_BN / 2 ? N + col : col) * K;
        }
    }
    __syncthreads();
    auto load_stage = [&](int s, int k0) {
        unsigned char* st = smem + (s % MW_STAGES) * MW_STAGE;
#pragma unroll
        for (int p = 0; p < MW_BM * 8 / MW_THREADS; ++p) {
            const int i = p * MW_THREADS + threadIdx.x;
            copy_chunk(st, i, a_rows, k0, K, a);
            copy_chunk(st + MW_TILE, i, w_rows, k0, K, w);
        }
    };
    const int nk = (K + MW_BK - 1) / MW_BK;
#pragma unroll
    for (int s = 0; s < MW_STAGES - 2; ++s) {
        if (s < nk) load_stage(s, s * MW_BK);
        cp_async_commit();
    }
    const int wg = threadIdx.x >> 7;
    const unsigned int base = smem_addr(smem);
    float acc[64];
#pragma unroll
    for (int i = 0; i < 64; ++i) acc[i] = 0.f;
    for (int kt = 0; kt < nk; ++kt) {
        cp_async_wait<MW_STAGES - 3>();   // this thread's copies of stage kt
        fence_proxy_async_smem();
        __syncthreads();
        const int pre = kt + MW_STAGES - 2;
        if (pre < nk) load_stage(pre, pre * MW_BK);
        cp_async_commit();
        const unsigned int st = base + (kt % MW_STAGES) * MW_STAGE;
        wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < MW_BK / 16; ++kk) {
            const unsigned long long da = wgmma_desc_sw128(st + wg * 64 * 128 + kk * 32, 16, 1024);
            const unsigned long long db = wgmma_desc_sw128(st + MW_TILE + kk * 32, 16, 1024);
            wgmma_m64n128k16_ss(acc, da, db, 1);
        }
        wgmma_commit();
        wgmma_wait<1>();
    }
    wgmma_wait<0>();
    wgmma_pin<64>(acc);
    cp_async_wait<0>();
    pdl_trigger();
    // acc[4j + 2h + c]: row 16 warp + lane / 4 + 8h of the warpgroup's 64, column 8j + 2 (lane % 4) + c (wgmma.cuh)
    const int lane = threadIdx.x & 31, warp = (threadIdx.x >> 5) & 3, tq = lane & 3;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        const int row = wg * 64 + warp * 16 + (lane >> 2) + 8 * h;
        if (row >= m) continue;
        if constexpr (GATE_UP) {
            bf16* hrow = (bf16*)out + (long long)(r0 + row) * out_stride;
#pragma unroll
            for (int j = 0; j < 8; ++j) {
                const int col = n0 + 8 * j + 2 * tq;   // N % 8 == 0: col + 1 < N with col
                if (col < N)
                    *reinterpret_cast<unsigned int*>(hrow + col) =
                        pack_bf16x2(silu_mul_f32(acc[4 * j + 2 * h], acc[32 + 4 * j + 2 * h]),
                                    silu_mul_f32(acc[4 * j + 2 * h + 1], acc[32 + 4 * j + 2 * h + 1]));
            }
        } else {
            const int p = pair_of[row];
            const float rw = route_w[p];
            float* yrow = (float*)out + (long long)p * out_stride;
#pragma unroll
            for (int j = 0; j < 16; ++j) {
                const int col = n0 + 8 * j + 2 * tq;
                if (col < N)
                    *reinterpret_cast<float2*>(yrow + col) =
                        make_float2(rw * acc[4 * j + 2 * h], rw * acc[4 * j + 2 * h + 1]);
            }
        }
    }
#endif
}

extern "C" __global__ void __launch_bounds__(MW_THREADS, 1) moe_gate_up_bf16_wgmma(
    const bf16* x, long long x_stride, const int* sorted, int topk, const bf16* w, long long w_expert_stride, int N,
    int K, const int* tile_expert, const int* tile_start, const int* tile_end, const int* num_tiles, bf16* h,
    long long h_stride) {
    moe_gemm_wgmma<true>(x, x_stride, sorted, topk, w, w_expert_stride, N, K, tile_expert, tile_start, tile_end,
                         num_tiles, nullptr, h, h_stride);
}

extern "C" __global__ void __launch_bounds__(MW_THREADS, 1) moe_down_bf16_wgmma(
    const bf16* h, long long h_stride, const int* sorted, int topk, const bf16* w, long long w_expert_stride, int N,
    int K, const int* tile_expert, const int* tile_start, const int* tile_end, const int* num_tiles,
    const float* route_w, float* y, long long y_stride) {
    moe_gemm_wgmma<false>(h, h_stride, sorted, topk, w, w_expert_stride, N, K, tile_expert, tile_start, tile_end,
                          num_tiles, route_w, y, y_stride);
}
