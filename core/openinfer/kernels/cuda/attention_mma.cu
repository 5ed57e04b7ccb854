// Causal GQA prefill attention over paged KV on the tensor cores (bf16 activations; bf16 or fp8 caches, see
// prefill_mma), FlashAttention-2 style.
// Same semantics as paged_prefill in attention.cu: query j of a run of n tokens sits at position
// L - n + j (L = context length) and sees keys 0 .. L - n + j.
//
//   grid  (q tiles, kv head, sequence); block MMA_WARPS warps; a block owns BM = 16 * MT * MMA_WARPS
//         rows, a row being a (token, head-in-group) pair (row = token * G + g), so one K/V tile in
//         shared memory serves every query head of the group. Tiles run longest-first (reversed x).
//   warp  owns MT m-tiles of 16 rows (MT = 2 for d64/d128: each K/V fragment feeds two mma; 1 for
//         d256): S = Q K^T and O += P V with mma.sync m16n8k16 (bf16 in, fp32 accumulate),
//         fragments by ldmatrix (.trans for V), P re-packed from the S accumulators in registers,
//         online softmax in the log2 domain (S scaled by scale * log2(e) in fp32, ex2.approx).
//   smem  Q [BM][D + 8] and two stages of K, V [BN][D + 8] (bf16; the 16-byte row pad keeps the
//         8 rows of every ldmatrix on distinct banks), filled by cp.async 16-byte copies: tile t + 1
//         loads while tile t computes. Keys past the block's last visible key are zero-filled.
//   out   normalized rows are staged in the warp's own Q rows and stored as 16-byte words.
//
// Mirrored in attention.py: MMA_WARPS, MT and BN per head dim, the shared-memory size, the kernel names.
#include "common.cuh"
#include "mma.cuh"   // cp.async, ldmatrix, mma.sync, ex2 and bf16x2 wrappers
#include "fp8.cuh"
constexpr int MMA_WARPS = 4;

// MT m-tiles of 16 rows per warp (2: every K/V fragment feeds two mma, halving the ldmatrix traffic
// per flop; the default for d64/d128, d256 has no registers for it), BN keys per tile, Q fragments
// kept in registers or re-read from smem every tile.
template <int D, int MT_> struct MmaTile {
    static constexpr int MT = MT_;
    static constexpr int BM = 16 * MT * MMA_WARPS;   // rows per block
    static constexpr int BN = D <= 128 ? 64 : 32;    // keys per tile
    static constexpr bool Q_IN_REGS = D * MT <= 128;
    static constexpr int LD = D + 8;                 // smem row stride in bf16 elements
};

// One K/V tile (keys k0 .. k0 + BN - 1) into a stage of rows of LD elements E (bf16, or fp8 bytes: fp8.cuh).
// Warp w copies rows w * RPW .. + RPW - 1; lane l looks up the row start of key k0 + w * RPW + l % RPW (one
// block-table read) and the warp shares them by shuffle. Keys at or past kend are zero rows (masked; 0 * V
// stays finite).
template <int D, typename E, int LD>
__device__ __forceinline__ void load_kv_tile(E* ks, E* vs, const E* kc, const E* vc, const KvLayout& kv,
                                             const int* table, int kvh, int k0, int kend) {
    constexpr int BN = MmaTile<D, 1>::BN, CH = 16 / sizeof(E), VW = D / CH, RPW = BN / MMA_WARPS;
    static_assert(RPW <= 32 && (RPW * VW) % 32 == 0, "tile rows must split evenly over the lanes");
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int key = k0 + warp * RPW + lane % RPW;
    const long long off = key < kend ? kv.offset(table, key, kvh, D) : -1;
#pragma unroll
    for (int it = 0; it < RPW * VW / 32; ++it) {
        const int idx = it * 32 + lane, r = idx / VW, c = idx % VW;
        const long long o = __shfl_sync(0xffffffffu, off, r);
        const int srow = warp * RPW + r, bytes = o >= 0 ? 16 : 0;
        const long long src = o >= 0 ? o + c * CH : 0;
        cp_async16(ks + srow * LD + c * CH, kc + src, bytes);
        cp_async16(vs + srow * LD + c * CH, vc + src, bytes);
    }
}

// An fp8 stage's K and V rows (BN rows of D bytes each) converted by the block into the f16 tiles kt, vt. Thread
// i takes word i % W of rows i / W, + STEP, ...: fixed strides, immediate offsets in the unrolled loop.
template <int D>
__device__ __forceinline__ void convert_kv_tile(bf16* kt, bf16* vt, const unsigned char* k8, const unsigned char* v8) {
    constexpr int BN = MmaTile<D, 1>::BN, LD = MmaTile<D, 1>::LD, W = D / 8, STEP = MMA_WARPS * 32 / W;
    static_assert(W <= MMA_WARPS * 32 && BN % STEP == 0, "whole rows a pass of the block");
    const int r0 = threadIdx.x / W, c = threadIdx.x % W;
#pragma unroll
    for (int r = r0; r < BN; r += STEP) {
        const uint2 k = *reinterpret_cast<const uint2*>(k8 + r * D + c * 8);
        const uint2 v = *reinterpret_cast<const uint2*>(v8 + r * D + c * 8);
        *reinterpret_cast<uint4*>(kt + r * LD + c * 8) = e4m3x8_to_f16x8(k);
        *reinterpret_cast<uint4*>(vt + r * LD + c * 8) = e4m3x8_to_f16x8(v);
    }
}

// E: the cache's element. bf16: K and V in two bf16 stages. fp8 bytes: two fp8 stages as stored, and one f16
// K and V tile that the block converts the current stage into (the fragments then read it as a bf16 stage); the
// products then run in f16, Q rounded to f16 in shared memory once it lands.
template <int D, int MT_, typename E>
__device__ void prefill_mma(const bf16* q, long long q_stride, const E* kc, const E* vc, KvLayout kv,
                            const int* tables, int table_stride, const int* qstart, const int* ctx, bf16* out,
                            int nh, int nkv, float scale) {
    using C = MmaTile<D, MT_>;
    constexpr int MT = C::MT, WR = 16 * MT, BM = C::BM, BN = C::BN, LD = C::LD;
    constexpr int VW = D / 8, NT = BN / 8, DT = D / 8, KC = D / 16;
    extern __shared__ __align__(16) unsigned char smem_raw[];
    constexpr bool KV8 = sizeof(E) == 1;
    constexpr int SLD = KV8 ? D : LD;   // a stage row's elements
    bf16* qs = (bf16*)smem_raw;         // [BM][LD]
    E* ks = (E*)(qs + BM * LD);         // [2][BN][SLD]
    E* vs = ks + 2 * BN * SLD;          // [2][BN][SLD]
    bf16* kc16 = (bf16*)(vs + 2 * BN * SLD);   // KV8: the converted (f16) tiles, [BN][LD] each
    bf16* vc16 = kc16 + BN * LD;
    const int b = blockIdx.z, kvh = blockIdx.y, G = nh / nkv;
    const int q0 = qstart[b], n = qstart[b + 1] - q0, L = ctx[b];
    const int rows = n * G, row0 = (gridDim.x - 1 - blockIdx.x) * BM;  // the longest tiles start first
    if (row0 >= rows) return;                                          // block-uniform (empty sequences too)
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int* table = tables + (long long)b * table_stride;
    const int kend = L - n + (min(row0 + BM, rows) - 1) / G + 1;  // keys any row of this block sees
    const int ntiles = (kend + BN - 1) / BN;

    // Q rows (zeros past the end) and the first K/V tile: cp.async group 0
    for (int i = threadIdx.x; i < BM * VW; i += blockDim.x) {
        const int r = i / VW, c = i % VW, row = row0 + r;
        const bf16* src = q;
        if (row < rows) src = q + (long long)(q0 + row / G) * q_stride + (long long)(kvh * G + row % G) * D + c * 8;
        cp_async16(qs + r * LD + c * 8, src, row < rows ? 16 : 0);
    }
    load_kv_tile<D, E, SLD>(ks, vs, kc, vc, kv, table, kvh, 0, kend);
    cp_async_commit();

    // The warp's rows wrow .. wrow + WR - 1 form MT m-tiles of 16; in m-tile mt this thread holds rows
    // g = lane / 4 and g + 8 (h = 0, 1) and key columns 2 * (lane % 4) + {0, 1} of every 8-wide n-tile.
    const int wrow = warp * WR, kcol = 2 * (lane & 3);
    int qpos[MT][2];
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const int r = row0 + wrow + mt * 16 + (lane >> 2) + 8 * h;
            qpos[mt][h] = r < rows ? L - n + r / G : -1;  // -1: past the end, sees nothing
        }
    const int qmin_warp = L - n + (row0 + wrow) / G;  // the warp's smallest position
    const bool warp_tail = row0 + wrow + WR > rows;    // the warp has rows past the end (always masked)

    float o[MT][DT][4], m[MT][2], l[MT][2];
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
        m[mt][0] = m[mt][1] = NEG_INF;
        l[mt][0] = l[mt][1] = 0.f;
#pragma unroll
        for (int j = 0; j < DT; ++j) o[mt][j][0] = o[mt][j][1] = o[mt][j][2] = o[mt][j][3] = 0.f;
    }
    unsigned int qf[C::Q_IN_REGS ? MT : 1][C::Q_IN_REGS ? KC : 1][4];
    // ldmatrix row addresses: A (Q) fragments, B (K) for two n-tiles, B (V, transposed) for two d-tiles
    const bf16* qa = qs + (wrow + (lane & 7) + ((lane >> 3) & 1) * 8) * LD + (lane >> 4) * 8;
    const int koff = ((lane & 7) + ((lane >> 4) & 1) * 8) * LD + ((lane >> 3) & 1) * 8;
    const int voff = ((lane & 7) + ((lane >> 3) & 1) * 8) * LD + (lane >> 4) * 8;

    for (int t = 0; t < ntiles; ++t) {
        const int k0 = t * BN, st = t & 1;
        if (t + 1 < ntiles)
            load_kv_tile<D, E, SLD>(ks + (st ^ 1) * BN * SLD, vs + (st ^ 1) * BN * SLD, kc, vc, kv, table, kvh,
                                    k0 + BN, kend);
        cp_async_commit();  // possibly empty, so that wait<1> always means "tile t has landed"
        cp_async_wait<1>();
        __syncthreads();
        if constexpr (KV8) if (t == 0) {   // Q, landed with tile 0, to f16 in place
            for (int i = threadIdx.x; i < BM * D / 2; i += blockDim.x) {
                unsigned int* w = reinterpret_cast<unsigned int*>(qs + (i / (D / 2)) * LD) + i % (D / 2);
                *w = bf16x2_to_f16x2(*w);
            }
            __syncthreads();
        }
        if constexpr (C::Q_IN_REGS) if (t == 0) {
#pragma unroll
            for (int mt = 0; mt < MT; ++mt)
#pragma unroll
                for (int kk = 0; kk < KC; ++kk) ldmatrix_x4(qf[mt][kk], qa + mt * 16 * LD + kk * 16);
        }
        const bf16* kt;
        const bf16* vt;
        if constexpr (KV8) {
            convert_kv_tile<D>(kc16, vc16, ks + st * BN * SLD, vs + st * BN * SLD);
            __syncthreads();
            kt = kc16;
            vt = vc16;
        } else {
            kt = ks + st * BN * LD;
            vt = vs + st * BN * LD;
        }

        float s[MT][NT][4];
#pragma unroll
        for (int mt = 0; mt < MT; ++mt)
#pragma unroll
            for (int j = 0; j < NT; ++j) s[mt][j][0] = s[mt][j][1] = s[mt][j][2] = s[mt][j][3] = 0.f;
#pragma unroll
        for (int kk = 0; kk < KC; ++kk) {
            unsigned int a[MT][4];
#pragma unroll
            for (int mt = 0; mt < MT; ++mt) {
                if constexpr (C::Q_IN_REGS) {
                    a[mt][0] = qf[mt][kk][0]; a[mt][1] = qf[mt][kk][1];
                    a[mt][2] = qf[mt][kk][2]; a[mt][3] = qf[mt][kk][3];
                } else {
                    ldmatrix_x4(a[mt], qa + mt * 16 * LD + kk * 16);
                }
            }
#pragma unroll
            for (int jp = 0; jp < NT / 2; ++jp) {
                unsigned int bk[4];
                ldmatrix_x4(bk, kt + jp * 16 * LD + koff + kk * 16);
#pragma unroll
                for (int mt = 0; mt < MT; ++mt) {
                    mma16<KV8>(s[mt][2 * jp], a[mt], bk[0], bk[1]);
                    mma16<KV8>(s[mt][2 * jp + 1], a[mt], bk[2], bk[3]);
                }
            }
        }
        if (warp_tail || k0 + BN - 1 > qmin_warp) {  // causal mask (and keys past kend, rows past the end)
#pragma unroll
            for (int mt = 0; mt < MT; ++mt)
#pragma unroll
                for (int j = 0; j < NT; ++j)
#pragma unroll
                    for (int e = 0; e < 4; ++e)
                        if (k0 + 8 * j + kcol + (e & 1) > qpos[mt][e >> 1]) s[mt][j][e] = NEG_INF;
        }
        // online softmax: m in raw score units (scale > 0), probabilities exp2(s * scale - m * scale)
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
            float mx[2] = {m[mt][0], m[mt][1]};
#pragma unroll
            for (int j = 0; j < NT; ++j) {
                mx[0] = fmaxf(mx[0], fmaxf(s[mt][j][0], s[mt][j][1]));
                mx[1] = fmaxf(mx[1], fmaxf(s[mt][j][2], s[mt][j][3]));
            }
            float base[2], alpha[2];
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xffffffffu, mx[h], 1));
                mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xffffffffu, mx[h], 2));
                base[h] = mx[h] == NEG_INF ? 0.f : mx[h] * scale;  // a row that has seen nothing yet
                alpha[h] = fast_exp2(m[mt][h] * scale - base[h]);       // m = -inf: 0
                m[mt][h] = mx[h];
                l[mt][h] *= alpha[h];
            }
#pragma unroll
            for (int j = 0; j < NT; ++j)
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    s[mt][j][e] = fast_exp2(fmaf(s[mt][j][e], scale, -base[e >> 1]));
                    l[mt][e >> 1] += s[mt][j][e];
                }
#pragma unroll
            for (int j = 0; j < DT; ++j) {
                o[mt][j][0] *= alpha[0]; o[mt][j][1] *= alpha[0];
                o[mt][j][2] *= alpha[1]; o[mt][j][3] *= alpha[1];
            }
        }
        // O += P V: the S accumulators of n-tiles 2kk, 2kk + 1 are the A fragment of keys 16kk .. 16kk + 15
#pragma unroll
        for (int kk = 0; kk < BN / 16; ++kk) {
            unsigned int a[MT][4];
#pragma unroll
            for (int mt = 0; mt < MT; ++mt) {
                a[mt][0] = pack16<KV8>(s[mt][2 * kk][0], s[mt][2 * kk][1]);
                a[mt][1] = pack16<KV8>(s[mt][2 * kk][2], s[mt][2 * kk][3]);
                a[mt][2] = pack16<KV8>(s[mt][2 * kk + 1][0], s[mt][2 * kk + 1][1]);
                a[mt][3] = pack16<KV8>(s[mt][2 * kk + 1][2], s[mt][2 * kk + 1][3]);
            }
#pragma unroll
            for (int dp = 0; dp < D / 16; ++dp) {
                unsigned int bv[4];
                ldmatrix_x4_trans(bv, vt + kk * 16 * LD + voff + dp * 16);
#pragma unroll
                for (int mt = 0; mt < MT; ++mt) {
                    mma16<KV8>(o[mt][2 * dp], a[mt], bv[0], bv[1]);
                    mma16<KV8>(o[mt][2 * dp + 1], a[mt], bv[2], bv[3]);
                }
            }
        }
        __syncthreads();  // stage st (and the converted tiles) consumed before the next iteration refills it
    }
    cp_async_wait<0>();  // only empty groups remain; keeps the tail tidy

    // normalize; stage the warp's rows in its own Q rows (only this warp ever read them), then 16-byte stores
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            float lh = l[mt][h];
            lh += __shfl_xor_sync(0xffffffffu, lh, 1);
            lh += __shfl_xor_sync(0xffffffffu, lh, 2);
            lh = lh > 0.f ? 1.f / lh : 0.f;  // 0: a row past the end (never stored)
            unsigned int* srow = (unsigned int*)(qs + (wrow + mt * 16 + (lane >> 2) + 8 * h) * LD);
#pragma unroll
            for (int j = 0; j < DT; ++j)
                srow[4 * j + (lane & 3)] = pack_bf16x2(o[mt][j][2 * h] * lh, o[mt][j][2 * h + 1] * lh);
        }
    }
    __syncwarp();
#pragma unroll
    for (int idx = lane; idx < WR * VW; idx += 32) {
        const int r = idx / VW, c = idx % VW, row = row0 + wrow + r;
        if (row < rows)
            *(uint4*)(out + ((long long)(q0 + row / G) * nh + kvh * G + row % G) * D + c * 8) =
                *(const uint4*)(qs + (wrow + r) * LD + c * 8);
    }
}

// paged_prefill_mma_bf16_d<D> (bf16 caches), paged_prefill_mma_bf16_kv8_d<D> (fp8 caches): MT m-tiles of 16 rows
// per warp (attention.py's MMA_MT)
#define MMA_KERNEL(D, MT, NAME, E)                                                                              \
    extern "C" __global__ void __launch_bounds__(MMA_WARPS * 32) paged_prefill_mma_bf16_##NAME(                 \
        const bf16* q, long long q_stride, const E* kc, const E* vc, long long block_stride,                     \
        long long token_stride, int block_size, const int* tables, int table_stride, const int* qstart,        \
        const int* ctx, bf16* out, int nh, int nkv, float scale) { pdl_begin();                                \
        prefill_mma<D, MT, E>(q, q_stride, kc, vc, KvLayout{block_stride, token_stride, block_size}, tables,     \
                              table_stride, qstart, ctx, out, nh, nkv, scale);                                 \
    }

MMA_KERNEL(64, 2, d64, bf16)
MMA_KERNEL(128, 2, d128, bf16)
MMA_KERNEL(256, 1, d256, bf16)
MMA_KERNEL(64, 2, kv8_d64, unsigned char)
MMA_KERNEL(128, 2, kv8_d128, unsigned char)
MMA_KERNEL(256, 1, kv8_d256, unsigned char)
