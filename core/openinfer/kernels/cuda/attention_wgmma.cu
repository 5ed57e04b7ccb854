// Causal GQA prefill attention over paged KV with Hopper warpgroup MMA (sm_90a, bf16, head dim 128), the
// wgmma counterpart of attention_mma.cu with the same semantics and arguments: query j of a run of n
// tokens sits at position L - n + j (L = context length) and sees keys 0 .. L - n + j.
//
//   grid  (q tiles, kv head, sequence), longest tiles first; a block owns BM = 128 rows, a row being a
//         (token, head-in-group) pair (row = token * G + g), so one K/V tile serves the whole group.
//   block two warpgroups, each owning 64 rows: S = Q K^T by wgmma m64nBNk16 (Q and K from shared
//         memory), online softmax in the log2 domain on the fp32 accumulators (per warp the m16n8 C
//         layout, see wgmma.cuh), P packed to bf16 in registers as the A operand of O += P V by wgmma
//         m64n128k16 with V from shared memory as a transposed (MN-major) B operand.
//   smem  Q [2][BM][64] and two stages of K, V [2][BN][64] (bf16; a [rows][128] tile kept
//         as two halves of 64 columns = one 128-byte row each, 128-byte swizzled, 1024-byte aligned), filled
//         by cp.async 16-byte copies: tile t + 1 loads while tile t computes. K and V share the layout:
//         K is the K-major B of Q K^T, V the MN-major B of P V. Keys past the block's last visible key
//         are zero-filled.
//   order warpgroup 1 issues its S = Q K^T only once warpgroup 0's has completed (named barrier 1), so the
//         tensor cores run one warpgroup's GEMMs while the other does its softmax (FlashAttention-3's
//         ping-pong, here within each tile: S0 | S1 + softmax0 | PV0 + softmax1 | PV1). This schedule with
//         128-key tiles timed faster than 64-key tiles, than both warpgroups issuing freely, and than
//         FlashAttention-3's intra-warpgroup overlap (S of tile t + 1 during the softmax of tile t).
//   out   normalized rows are staged in the warp's own (swizzled) Q rows and stored as 16-byte words.
//   fp8   caches of e4m3 bytes (the _kv8 kernel): two stages hold K/V rows as stored, and two buffers their f16
//         conversions in the bf16 stages' layout: each thread converts tile t + 1 while its S = Q K^T of tile t
//         runs on the tensor cores, and only the chunks it copied itself (load_kv_tile_sw's and convert_kv_tile's
//         mappings are one), so its own cp.async wait is all the conversion waits for; tile t + 2's copies then
//         refill that stage. Q is rounded to f16 in place once, P packed to f16, the products f16 (fp8.cuh): the
//         numbers of attention_mma.cu's fp8 form.
//
// Mirrored in attention.py (WGMMA_* constants, the shared-memory size, the kernel names) and emulated
// in tests/kernels/test_attention_wgmma_emulation.py: change them together.
#include "common.cuh"
#include "mma.cuh"     // cp.async, ex2, bf16x2 packing
#include "wgmma.cuh"   // descriptors, fences, wgmma shapes, the swizzled layout
#include "fp8.cuh"     // e4m3 to f16, the f16 packing of an fp8-cache kernel
constexpr int WG_D = 128;                // head dim
constexpr int WG_GROUPS = 2;             // warpgroups per block, 64 rows each
constexpr int WG_THREADS = 128 * WG_GROUPS;
constexpr int WG_BM = 64 * WG_GROUPS;    // rows per block

// One K/V tile (keys k0 .. k0 + BN - 1) into a stage: a key row is CH 16-byte chunks (16 of bf16, 8 of e4m3
// bytes), so chunk i = pass * WG_THREADS + threadIdx.x is (row i / CH, chunk i % CH) and warp w copies rows
// pass * 8 RW + RW w + {0 .. RW - 1} (RW = 32 / CH rows a warp); lane l < RW * PASSES looks up the cache offset of
// row (l / RW) * 8 RW + RW w + l % RW (one block-table read) and the warp shares them by shuffle. bf16 rows land
// swizzled (sw128_offset), the wgmma operand; e4m3 rows as stored, [BN][128] bytes, for convert_kv_tile. Keys at or
// past kend are zero rows (masked; 0 * V stays finite).
template <int BN, typename E>
__device__ __forceinline__ void load_kv_tile_sw(unsigned char* ks, unsigned char* vs, const E* kc, const E* vc,
                                                const KvLayout& kv, const int* table, int kvh, int k0, int kend) {
    constexpr int CH = WG_D * sizeof(E) / 16, RW = 32 / CH, PASSES = BN * CH / WG_THREADS;
    static_assert(PASSES * WG_THREADS == BN * CH && RW * PASSES <= 32, "tile rows must split over the passes");
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    long long off = -1;
    if (lane < RW * PASSES) {
        const int key = k0 + (lane / RW) * 8 * RW + RW * warp + lane % RW;
        if (key < kend) off = kv.offset(table, key, kvh, WG_D);
    }
#pragma unroll
    for (int p = 0; p < PASSES; ++p) {
        const long long o = __shfl_sync(0xffffffffu, off, RW * p + lane / CH);
        const int r = p * 8 * RW + RW * warp + lane / CH, c = (lane % CH) * (16 / sizeof(E));
        const int dst = sizeof(E) == 1 ? r * WG_D + c : sw128_offset(r, c, BN);
        const long long src = o >= 0 ? o + c : 0;
        cp_async16(ks + dst, kc + src, o >= 0 ? 16 : 0);
        cp_async16(vs + dst, vc + src, o >= 0 ? 16 : 0);
    }
}

// An e4m3 K/V stage (convert_kv_tile's input: [BN][128] bytes as stored) to f16 tiles laid out as the bf16 stages
// (sw128_offset). Chunk i = pass * WG_THREADS + threadIdx.x is 16 bytes of row i / 8 at byte 16 (i % 8), the chunk
// this thread copied (load_kv_tile_sw, CH = 8): a warp reads 512 contiguous bytes and writes each 16-byte half of its
// conversion to a different bank group of 8 (the swizzle).
template <int BN>
__device__ __forceinline__ void convert_kv_tile(unsigned char* kf, unsigned char* vf, const unsigned char* ks,
                                                const unsigned char* vs) {
#pragma unroll
    for (int p = 0; p < BN * 8 / WG_THREADS; ++p) {
        const int i = p * WG_THREADS + threadIdx.x, r = i >> 3, c = (i & 7) * 16;
        const uint4 k = *reinterpret_cast<const uint4*>(ks + 16 * i), v = *reinterpret_cast<const uint4*>(vs + 16 * i);
        *reinterpret_cast<uint4*>(kf + sw128_offset(r, c, BN)) = e4m3x8_to_f16x8(make_uint2(k.x, k.y));
        *reinterpret_cast<uint4*>(kf + sw128_offset(r, c + 8, BN)) = e4m3x8_to_f16x8(make_uint2(k.z, k.w));
        *reinterpret_cast<uint4*>(vf + sw128_offset(r, c, BN)) = e4m3x8_to_f16x8(make_uint2(v.x, v.y));
        *reinterpret_cast<uint4*>(vf + sw128_offset(r, c + 8, BN)) = e4m3x8_to_f16x8(make_uint2(v.z, v.w));
    }
}

// S = Q K^T for one warpgroup (issued, not waited for): k-step kk reads columns 16kk .. 16kk + 15, 32 bytes
// into a swizzled row of half kk / 4 of the warpgroup's Q rows (qaddr) and of the K stage (kaddr).
template <int BN, bool F16>
__device__ __forceinline__ void issue_qk(float* s, unsigned int qaddr, unsigned int kaddr) {
#pragma unroll
    for (int i = 0; i < BN / 2; ++i) s[i] = 0.f;
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < WG_D / 16; ++kk) {
        const unsigned long long da = wgmma_desc_sw128(qaddr + (kk >> 2) * WG_BM * SW_ROW + (kk & 3) * 32, 16, 1024);
        const unsigned long long db = wgmma_desc_sw128(kaddr + (kk >> 2) * BN * SW_ROW + (kk & 3) * 32, 16, 1024);
        if constexpr (BN == 128) wgmma_m64n128k16_ss<F16>(s, da, db, 1);
        else wgmma_m64n64k16_ss<F16>(s, da, db, 1);
    }
    wgmma_commit();
}

template <int BN, typename E>
__device__ void prefill_wgmma(const bf16* q, long long q_stride, const E* kc, const E* vc, KvLayout kv,
                              const int* tables, int table_stride, const int* qstart, const int* ctx, bf16* out,
                              int nh, int nkv, float scale) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    constexpr int D = WG_D, BM = WG_BM, NS = BN / 2;
    constexpr bool KV8 = sizeof(E) == 1;       // an fp8 cache: stages as stored, converted to f16 tiles
    constexpr int TILE = BN * D * 2;            // bytes of one bf16 / f16 K (or V) tile
    constexpr int STAGE = BN * D * sizeof(E);   // bytes of one K (or V) stage
    constexpr int STAGES = 2;
    constexpr int AHEAD = STAGES - 1;
    extern __shared__ __align__(16) unsigned char smem_raw[];
    // the swizzle pattern repeats every 1024 bytes of absolute shared address: align the base (the
    // launcher adds 1024 bytes of slack)
    unsigned char* qs = smem_raw + ((1024 - (smem_addr(smem_raw) & 1023)) & 1023);   // [2][BM][64]
    unsigned char* ks = qs + BM * D * 2;                                                // [STAGES][2][BN][64]
    unsigned char* vs = ks + STAGES * STAGE;                                            // [STAGES][2][BN][64]
    unsigned char* kf = vs + STAGES * STAGE;   // KV8: two buffers of converted f16 K, V tiles, each [2][BN][64]
    const int b = blockIdx.z, kvh = blockIdx.y, G = nh / nkv;
    const int q0 = qstart[b], n = qstart[b + 1] - q0, L = ctx[b];
    const int rows = n * G, row0 = (gridDim.x - 1 - blockIdx.x) * BM;  // the longest tiles start first
    if (row0 >= rows) return;                                          // block-uniform (empty sequences too)
    const int lane = threadIdx.x & 31, warp = (threadIdx.x >> 5) & 3, wg = threadIdx.x >> 7;
    const int* table = tables + (long long)b * table_stride;
    const int kend = L - n + (min(row0 + BM, rows) - 1) / G + 1;  // keys any row of this block sees
    const int ntiles = (kend + BN - 1) / BN;

    // Q rows (zeros past the end) and the first K/V tile: cp.async group 0
#pragma unroll
    for (int p = 0; p < BM * 16 / WG_THREADS; ++p) {
        const int r = p * 16 + (threadIdx.x >> 4), c = (threadIdx.x & 15) * 8, row = row0 + r;
        const bf16* src = q;
        if (row < rows) src = q + (long long)(q0 + row / G) * q_stride + (long long)(kvh * G + row % G) * D + c;
        cp_async16(qs + sw128_offset(r, c, BM), src, row < rows ? 16 : 0);
    }
    load_kv_tile_sw<BN, E>(ks, vs, kc, vc, kv, table, kvh, 0, kend);
    cp_async_commit();
    if constexpr (KV8) {   // tile 1's copies go out too; Q and tile 0 are converted before the loop
        if (1 < ntiles) load_kv_tile_sw<BN, E>(ks + STAGE, vs + STAGE, kc, vc, kv, table, kvh, BN, kend);
        cp_async_commit();
        cp_async_wait<1>();
#pragma unroll
        for (int p = 0; p < BM * 16 / WG_THREADS; ++p) {   // this thread's Q chunks, to f16 in place
            uint4* w = reinterpret_cast<uint4*>(qs + sw128_offset(p * 16 + (threadIdx.x >> 4), (threadIdx.x & 15) * 8,
                                                                   BM));
            *w = make_uint4(bf16x2_to_f16x2(w->x), bf16x2_to_f16x2(w->y), bf16x2_to_f16x2(w->z),
                            bf16x2_to_f16x2(w->w));
        }
        convert_kv_tile<BN>(kf, kf + TILE, ks, vs);
    }

    // The warp's rows wrow .. wrow + 15 (of the block); this thread holds rows g = lane / 4 and g + 8
    // (h = 0, 1) and columns 2 * (lane % 4) + {0, 1} of every 8-column group of the accumulators.
    const int wrow = wg * 64 + warp * 16, kcol = 2 * (lane & 3);
    int qpos[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        const int r = row0 + wrow + (lane >> 2) + 8 * h;
        qpos[h] = r < rows ? L - n + r / G : -1;  // -1: past the end, sees nothing
    }
    const int qmin_wg = L - n + (row0 + wg * 64) / G;  // the warpgroup's smallest position
    const bool wg_tail = row0 + wg * 64 + 64 > rows;   // the warpgroup has rows past the end (always masked)
    const unsigned int qaddr = smem_addr(qs) + wg * 64 * SW_ROW;  // the warpgroup's 64 rows of half 0

    float o[64], m[2] = {NEG_INF, NEG_INF}, l[2] = {0.f, 0.f}, s[NS];
#pragma unroll
    for (int i = 0; i < 64; ++i) o[i] = 0.f;

    for (int t = 0; t < ntiles; ++t) {
        const int k0 = t * BN, st = t % STAGES;
        if constexpr (KV8) {   // tile t + 2 into tile t's stage, which this thread converted (its own chunks)
            if (t + STAGES < ntiles)
                load_kv_tile_sw<BN, E>(ks + st * STAGE, vs + st * STAGE, kc, vc, kv, table, kvh, k0 + STAGES * BN,
                                       kend);
            cp_async_commit();  // possibly empty, so that wait<1> always means "tile t + 1 has landed"
        } else {
            if (t + AHEAD < ntiles) {
                const int sa = (t + AHEAD) % STAGES;
                load_kv_tile_sw<BN, E>(ks + sa * STAGE, vs + sa * STAGE, kc, vc, kv, table, kvh, k0 + AHEAD * BN,
                                       kend);
            }
            cp_async_commit();  // possibly empty, so that wait<1> always means "tile t + AHEAD - 1 has landed"
            cp_async_wait<1>();
        }
        fence_proxy_async_smem();  // cp.async (and KV8's conversions) wrote through the generic proxy, wgmma reads
                                   // through the async one
        __syncthreads();           // (KV8: every thread's products of tile t - 1 are done, its buffer free)
        unsigned char* kt = KV8 ? kf + (t & 1) * 2 * TILE : ks + st * STAGE;
        const unsigned int vaddr = smem_addr(KV8 ? kt + TILE : vs + st * STAGE);

        if (wg == 1) asm volatile("bar.sync 1, %0;\n" ::"n"(WG_THREADS) : "memory");
        issue_qk<BN, KV8>(s, qaddr, smem_addr(kt));
        if constexpr (KV8) if (t + 1 < ntiles) {   // tile t + 1 converted while the tensor cores run S = Q K^T
            cp_async_wait<1>();
            unsigned char* next = kf + ((t + 1) & 1) * 2 * TILE;
            const int sn = (t + 1) % STAGES;
            convert_kv_tile<BN>(next, next + TILE, ks + sn * STAGE, vs + sn * STAGE);
        }
        wgmma_wait<0>();
        wgmma_pin<NS>(s);
        if (wg == 0) asm volatile("bar.arrive 1, %0;\n" ::"n"(WG_THREADS) : "memory");

        if (wg_tail || k0 + BN - 1 > qmin_wg) {  // causal mask (and keys past kend, rows past the end)
#pragma unroll
            for (int i = 0; i < NS; ++i)
                if (k0 + 8 * (i >> 2) + kcol + (i & 1) > qpos[(i >> 1) & 1]) s[i] = NEG_INF;
        }
        // online softmax: m in raw score units (scale > 0), probabilities exp2(s * scale - m * scale)
        float mx[2] = {m[0], m[1]};
#pragma unroll
        for (int i = 0; i < NS; ++i) mx[(i >> 1) & 1] = fmaxf(mx[(i >> 1) & 1], s[i]);
        float base[2], alpha[2];
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xffffffffu, mx[h], 1));
            mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xffffffffu, mx[h], 2));
            base[h] = mx[h] == NEG_INF ? 0.f : mx[h] * scale;  // a row that has seen nothing yet
            alpha[h] = fast_exp2(m[h] * scale - base[h]);      // m = -inf: 0
            m[h] = mx[h];
            l[h] *= alpha[h];
        }
#pragma unroll
        for (int i = 0; i < NS; ++i) {
            s[i] = fast_exp2(fmaf(s[i], scale, -base[(i >> 1) & 1]));
            l[(i >> 1) & 1] += s[i];
        }
#pragma unroll
        for (int i = 0; i < 64; ++i) o[i] *= alpha[(i >> 1) & 1];

        // O += P V: the S accumulators of columns 16kk .. 16kk + 15 are the register A fragment of k-step
        // kk; its B is keys 16kk .. 16kk + 15 (two 8-key groups 1024 bytes apart), d in two halves of 64
        unsigned int pa[BN / 16][4];
#pragma unroll
        for (int kk = 0; kk < BN / 16; ++kk) {
#pragma unroll
            for (int r = 0; r < 4; ++r) pa[kk][r] = pack16<KV8>(s[8 * kk + 2 * r], s[8 * kk + 2 * r + 1]);
        }
        wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < BN / 16; ++kk)
            wgmma_m64n128k16_rs_tb<KV8>(o, pa[kk], wgmma_desc_sw128(vaddr + kk * 16 * SW_ROW, BN * SW_ROW, 1024));
        wgmma_commit();
        wgmma_wait<0>();  // P V of tile t
        wgmma_pin<64>(o);
        if constexpr (!KV8) __syncthreads();  // stage st is consumed before a later iteration refills it (KV8: the
                                              // next iteration's barrier guards the converted buffer)
    }
    cp_async_wait<0>();  // only empty groups remain; keeps the tail tidy

    // normalize; stage the warp's 16 rows in its own Q rows (no other warp reads them, and this warpgroup's
    // wgmma reads of them are complete), then 16-byte stores
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        float lh = l[h];
        lh += __shfl_xor_sync(0xffffffffu, lh, 1);
        lh += __shfl_xor_sync(0xffffffffu, lh, 2);
        lh = lh > 0.f ? 1.f / lh : 0.f;  // 0: a row past the end (never stored)
        const int r = wrow + (lane >> 2) + 8 * h;
#pragma unroll
        for (int j = 0; j < D / 8; ++j)
            *(unsigned int*)(qs + sw128_offset(r, 8 * j, BM) + 2 * kcol) =
                pack_bf16x2(o[4 * j + 2 * h] * lh, o[4 * j + 2 * h + 1] * lh);
    }
    __syncwarp();
#pragma unroll
    for (int p = 0; p < 16 * 16 / 32; ++p) {
        const int r = p * 2 + (lane >> 4), c = (lane & 15) * 8, row = row0 + wrow + r;
        if (row < rows)
            *(uint4*)(out + ((long long)(q0 + row / G) * nh + kvh * G + row % G) * D + c) =
                *(const uint4*)(qs + sw128_offset(wrow + r, c, BM));
    }
#endif
}

// paged_prefill_wgmma_bf16_d128 (bf16 caches), paged_prefill_wgmma_bf16_kv8_d128 (fp8 caches): 128-key tiles
// (attention.py's WGMMA_BN)
#define WGMMA_KERNEL(NAME, E)                                                                                        \
    extern "C" __global__ void __launch_bounds__(WG_THREADS, 1) paged_prefill_wgmma_bf16_##NAME(                    \
        const bf16* q, long long q_stride, const E* kc, const E* vc, long long block_stride, long long token_stride, \
        int block_size, const int* tables, int table_stride, const int* qstart, const int* ctx, bf16* out, int nh,  \
        int nkv, float scale) {                                                                                     \
        pdl_begin();                                                                                                \
        prefill_wgmma<128, E>(q, q_stride, kc, vc, KvLayout{block_stride, token_stride, block_size}, tables,       \
                              table_stride, qstart, ctx, out, nh, nkv, scale);                                      \
    }
WGMMA_KERNEL(d128, bf16)
WGMMA_KERNEL(kv8_d128, unsigned char)
