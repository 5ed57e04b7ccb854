// The INT4 routed experts at decode on the tensor cores: the same grouping and outputs as quant.cu's GEMV kernels
// (moe_plan's slots and pairs in, h and yk out), with each weight tile's multiply-adds done by mma.sync m16n8k16.
// On CUDA cores an INT4 weight costs ~3 instructions (two to become an fp32, an FMA per pair), and an INT4 byte holds
// two weights, so those kernels were bound by instruction issue, not by the bytes they stream. Here two nibbles
// become a bf16 pair in three instructions (shift, mask-or, one bf16x2 fma), and the products and sums are the mma's.
//
// Tiles: a warp takes one 16-row tile of the staged stack (quant.cuh's Int4Tiles: gate_up, the gate and up rows of 8
// outputs; down, rows 8j .. 8j + 7 and D/2 + 8j ..) and up to 8 pairs (the mma's n). Lane (g, t) = (lane / 4, lane % 4)
// reads word t of each 16-byte chunk of tile rows g and g + 8 (the quad reads the chunk's 16 bytes): as the tile stores
// a chunk's 16 rows together, each of a warp's weight loads reads one whole 128-byte line, and a pass of 8 chunks reads
// 2 KB in a row (in the checkpoint's row layout a load took 16 bytes of each of 8 rows' lines). A chunk is one scale
// group of 32 weights and two mmas: mma m takes the bf16 pairs (nibble 2m, nibble 2m + 4) and (2m + 1, 2m + 5) of each
// lane's word as its k pairs (2t, 2t + 1) and (2t + 8, 2t + 9). The dot product does not care which physical k a
// logical k is, as long as the activations (B, column g = pair g) follow the same map:
// b0 = (x[8t + 2m], x[8t + 2m + 4]), b1 = (x[8t + 2m + 1], x[8t + 2m + 5]) of the chunk. The chunk's two mmas start
// from zero and its fp32 sums are scaled once, as the GEMV kernels scale a chunk's partial sums.
//
// gate_up reads x (bf16) from global memory: at each chunk's mmas, or where a pass has one column (an expert with one
// pair: every expert at one token, most at small batches) each lane loads one chunk's 16 bytes of the pass's window
// right after the weights and the chunks pass between lanes by shuffles, so no chunk waits on a load of x. The
// weights and scales are read without L1 allocation (each load takes whole lines once). down's h is float32: the
// block stages each pair's h as two bf16 parts, hi = bf16(h) and lo = bf16(h - hi), already in the b0/b1 order, and
// runs both through the mma (the weights are exact in bf16), so a product keeps ~16 bits of h (relative error
// ~2^-17), near the fp32 GEMV's. One column or several, a pair gets the same products in the same order, so its
// bits do not depend on what it is batched with.
#include "common.cuh"
#include "mma.cuh"
#include "quant.cuh"

constexpr int MMA_WARPS = 8;     // warps a block
constexpr int MMA_PAIRS = 8;     // pairs a pass: the mma's n
constexpr int MMA_CHUNKS = 8;    // chunks a lane loads (per row) before the first is used
constexpr int PAIR_PAD = 4;      // words after a staged pair: a quarter warp's two pairs in distinct banks

// The 4 bf16 pairs (nibble j, nibble j + 4) of an INT4 word, unscaled (nibble - 8), exactly: nibble j sits at bit
// 4j and nibble j + 4 at bit 16 + 4j, so one shift and mask put both in a bf16 pair's mantissas.
__device__ __forceinline__ void int4_pairs(unsigned int w, unsigned int (&p)[4]) {
#pragma unroll
    for (int j = 0; j < 4; ++j) p[j] = int4_biased_to_bf16x2(((w >> (4 * j)) & 0x000f000fu) | 0x43004300u);
}

// The float of the bf16 in half `hi` of a word (the low half first: the lower chunk of a scale pair)
__device__ __forceinline__ float bf16_half(unsigned int w, int hi) {
    return __uint_as_float(hi ? w & 0xffff0000u : w << 16);
}

// The B words of a chunk's two mmas from a lane's 8 bf16 activations v (positions 8t .. 8t + 7 of the chunk, 2 a
// word): b[m] = {b0, b1} = {(v[2m], v[2m + 4]), (v[2m + 1], v[2m + 5])}, the lower position in the low half.
__device__ __forceinline__ void chunk_b(const uint4& v, unsigned int (&b)[2][4]) {
    b[0][0] = __byte_perm(v.x, v.z, 0x5410);
    b[0][1] = __byte_perm(v.x, v.z, 0x7632);
    b[1][0] = __byte_perm(v.y, v.w, 0x5410);
    b[1][1] = __byte_perm(v.y, v.w, 0x7632);
}

// The B sources of mma_rows: fetch(c0, C) runs after a pass's weight and scale loads are issued, words(u, c, b) gives
// chunk c's (the pass's u-th) B words: b[m][0..1] for mma m and, for down, b[m][2..3], the lo parts.

// gate_up, one column: every lane's column is the same token. Lane (g, t) holds words 8t .. 8t + 7 of the pass's
// chunk c0 + g; chunk u's come from lane (u, t).
struct XOneColumn {
    const bf16* xt;   // the token's row + 8t
    uint4 v;
    __device__ __forceinline__ void fetch(int c0, int C) {
        const int c = min(c0 + ((threadIdx.x & 31) >> 2), C - 1);
        v = *reinterpret_cast<const uint4*>(xt + 32 * c);
    }
    __device__ __forceinline__ void words(int u, int, unsigned int (&b)[2][4]) const {
        const int src = 4 * u + (threadIdx.x & 3);
        chunk_b(make_uint4(__shfl_sync(~0u, v.x, src), __shfl_sync(~0u, v.y, src), __shfl_sync(~0u, v.z, src),
                           __shfl_sync(~0u, v.w, src)), b);
    }
};

// gate_up, up to 8 columns: lane (g, t) reads words 8t .. 8t + 7 of column g's token at each chunk.
struct XColumns {
    const bf16* xg;   // column g's token's row + 8t
    __device__ __forceinline__ void fetch(int, int) {}
    __device__ __forceinline__ void words(int, int c, unsigned int (&b)[2][4]) const {
        chunk_b(*reinterpret_cast<const uint4*>(xg + 32 * c), b);
    }
};

// down: pair g's staged h words in shared memory, hi and lo parts already in the mma's order.
struct StagedH {
    const uint4* col;
    __device__ __forceinline__ void fetch(int, int) {}
    __device__ __forceinline__ void words(int, int c, unsigned int (&b)[2][4]) const {
#pragma unroll
        for (int m = 0; m < 2; ++m) {
            const uint4 v = col[8 * c + m];
            b[m][0] = v.x; b[m][1] = v.y; b[m][2] = v.z; b[m][3] = v.w;
        }
    }
};

// acc (the C fragment: rows g, g + 8 x pairs 2t, 2t + 1) += tile `tile`'s 16 rows times src's activations, over
// its K / 32 chunks, a pass of MMA_CHUNKS at a time: the pass's weight words of both rows and its scales (a bf16x2
// word a row and chunk pair) are loaded, then src fetches, then each chunk's two mmas start from zero and are scaled
// once (LO: the lo parts' products are added too).
template <bool LO, typename Src>
__device__ __forceinline__ void mma_rows(const void* __restrict__ q, const bf16* __restrict__ scale, long long tile,
                                         int K, Src& src, float (&acc)[4]) {
    const int g = (threadIdx.x & 31) >> 2, t = threadIdx.x & 3, C = K >> 5;
    const unsigned int* wg = reinterpret_cast<const unsigned int*>(q) + (tile * C * 16 + g) * 4 + t;   // + 32: g + 8
    const unsigned int* sg = reinterpret_cast<const unsigned int*>(scale) + tile * Int4Tiles::scale_cols(K) * 8 + g;
    for (int c0 = 0; c0 < C; c0 += MMA_CHUNKS) {
        unsigned int w[2][MMA_CHUNKS], sw[2][MMA_CHUNKS / 2];
#pragma unroll
        for (int u = 0; u < MMA_CHUNKS; ++u) {
            const bool in = c0 + u < C;
            w[0][u] = in ? ld_stream(wg + 64 * (c0 + u)) : 0u;   // a warp reads one whole 128-byte line a load
            w[1][u] = in ? ld_stream(wg + 64 * (c0 + u) + 32) : 0u;
        }
#pragma unroll
        for (int u = 0; u < MMA_CHUNKS / 2; ++u) {   // chunks c0 + 2u and c0 + 2u + 1 (c0 is even)
            const bool in = c0 + 2 * u < C;
            sw[0][u] = in ? ld_stream(sg + 16 * (c0 / 2 + u)) : 0u;
            sw[1][u] = in ? ld_stream(sg + 16 * (c0 / 2 + u) + 8) : 0u;
        }
        src.fetch(c0, C);
#pragma unroll
        for (int u = 0; u < MMA_CHUNKS; ++u) {
            if (c0 + u >= C) break;
            unsigned int pg[4], pg8[4];
            int4_pairs(w[0][u], pg);
            int4_pairs(w[1][u], pg8);
            unsigned int b[2][4];
            src.words(u, c0 + u, b);
            float part[4];
#pragma unroll
            for (int m = 0; m < 2; ++m) {
                const unsigned int a[4] = {pg[2 * m], pg8[2 * m], pg[2 * m + 1], pg8[2 * m + 1]};
                if (m == 0) mma_bf16_first(part, a, b[m][0], b[m][1]);
                else mma_bf16(part, a, b[m][0], b[m][1]);
                if (LO) mma_bf16(part, a, b[m][2], b[m][3]);
            }
            const float s0 = bf16_half(sw[0][u >> 1], u & 1), s1 = bf16_half(sw[1][u >> 1], u & 1);
            acc[0] = fmaf(s0, part[0], acc[0]);
            acc[1] = fmaf(s0, part[1], acc[1]);
            acc[2] = fmaf(s1, part[2], acc[2]);
            acc[3] = fmaf(s1, part[3], acc[3]);
        }
    }
}

// h[pair, o] = silu(gate_e x[t]) * up_e x[t] for the pairs of slot blockIdx.y (t = pair / k): grid (ceil(I / (8 *
// MMA_WARPS)), slots); a warp's tile j holds the gate and up rows of outputs o0 = 8j .. o0 + 7 (I % 8 == 0), its
// tile rows g and g + 8 those of output o0 + g. q/scale: the staged expert stack [E_local, 2I, D] (Int4Tiles, gate
// rows first), x bf16 [T, D]. Launch bounds: 3 blocks an SM caps registers at 85 (64 used), under which ptxas issues
// a pass's loads before its first chunk's mmas (with no minimum it sank some below them).
extern "C" __global__ void __launch_bounds__(32 * MMA_WARPS, 3) moe_q_mma_gate_up_int4(
    const bf16* __restrict__ x, const void* __restrict__ q, const bf16* __restrict__ scale,
    const int* __restrict__ slot_expert, const int* __restrict__ slot_start, const int* __restrict__ pair_list,
    int k, int D, int I, float* __restrict__ h) {
    pdl_wait();   // the trigger follows the main loop (common.cuh)
    const int e = slot_expert[blockIdx.y];
    const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const int j = blockIdx.x * MMA_WARPS + (threadIdx.x >> 5), o0 = 8 * j;
    if (e < 0 || o0 >= I) return;   // whole warps: every lane takes part in the mmas
    const long long tile = (long long)e * (I >> 3) + j;
    const int first = slot_start[blockIdx.y], last = slot_start[blockIdx.y + 1];
    for (int p0 = first; p0 < last; p0 += MMA_PAIRS) {
        const int n = min(MMA_PAIRS, last - p0);
        const bf16* xg = x + (long long)(pair_list[p0 + min(g, n - 1)] / k) * D + 8 * t;   // column g's token
        float acc[4] = {0.f, 0.f, 0.f, 0.f};
        if (n == 1) {
            XOneColumn src{xg};
            mma_rows<false>(q, scale, tile, D, src, acc);
        } else {
            XColumns src{xg};
            mma_rows<false>(q, scale, tile, D, src, acc);
        }
#pragma unroll
        for (int i = 0; i < 2; ++i) {   // pairs 2t and 2t + 1 of the pass: acc[i] the gate, acc[2 + i] the up sum
            const int p = 2 * t + i;
            if (p < n) h[(long long)pair_list[p0 + p] * I + o0 + g] = silu_mul_f32(acc[i], acc[2 + i]);
        }
    }
    pdl_trigger();
}

// yk[pair, r] = weights[pair] * down_e h[pair] for the pairs of slot blockIdx.y: grid (ceil(D / (16 * MMA_WARPS)),
// slots), a warp per tile j of the staged stack (Int4Tiles): tile rows g and g + 8 are rows 8j + g and D/2 + 8j + g
// (D % 16 == 0). Dynamic shared memory: stage_pairs (<= MMA_PAIRS) pairs' h, each as I / 32 chunks of 4 lanes x 8
// words (mma 0's hi b0, b1, lo b0, b1, then mma 1's), PAIR_PAD words after each pair.
extern "C" __global__ void __launch_bounds__(32 * MMA_WARPS) moe_q_mma_down_int4(
    const float* __restrict__ h, const void* __restrict__ q, const bf16* __restrict__ scale,
    const int* __restrict__ slot_expert, const int* __restrict__ slot_start, const int* __restrict__ pair_list,
    const float* __restrict__ weights, int D, int I, int stage_pairs, float* __restrict__ yk) {
    extern __shared__ uint4 stage_words[];
    unsigned int* stage = reinterpret_cast<unsigned int*>(stage_words);
    pdl_wait();   // h is gate_up's; the trigger follows the main loop
    const int e = slot_expert[blockIdx.y];
    if (e < 0) return;   // the whole block
    const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const int j = blockIdx.x * MMA_WARPS + (threadIdx.x >> 5);
    const bool works = 16 * j < D;   // whole warps: every lane takes part in the syncs
    const long long tile = (long long)e * (D >> 4) + j;
    const int C = I >> 5, pair_words = 32 * C + PAIR_PAD;
    const int first = slot_start[blockIdx.y], last = slot_start[blockIdx.y + 1];
    for (int p0 = first; p0 < last; p0 += stage_pairs) {
        const int n = min(stage_pairs, last - p0);
        __syncthreads();   // the previous pass's reads of the stage are done
        // a thread per (pair, chunk, lane t): its 8 values of h, split, as the 4 words lane t reads
        for (int i = threadIdx.x; i < n * C * 4; i += blockDim.x) {
            const int p = i / (C * 4), c = (i >> 2) % C, tt = i & 3;
            float v[8];
            load_f32<8>(h + (long long)pair_list[p0 + p] * I + 32 * c + 8 * tt, v);
            float lo[8];
#pragma unroll
            for (int i = 0; i < 8; ++i) lo[i] = v[i] - to_f32(from_f32<bf16>(v[i]));
            uint4* dst = reinterpret_cast<uint4*>(stage + p * pair_words + 32 * c + 8 * tt);
#pragma unroll
            for (int m = 0; m < 2; ++m)   // b0 = (v[2m], v[2m + 4]), b1 = (v[2m + 1], v[2m + 5])
                dst[m] = make_uint4(pack_bf16x2(v[2 * m], v[2 * m + 4]), pack_bf16x2(v[2 * m + 1], v[2 * m + 5]),
                                    pack_bf16x2(lo[2 * m], lo[2 * m + 4]), pack_bf16x2(lo[2 * m + 1], lo[2 * m + 5]));
        }
        __syncthreads();
        if (!works) continue;
        StagedH src{reinterpret_cast<const uint4*>(stage + min(g, n - 1) * pair_words + 8 * t)};   // pair g
        float acc[4] = {0.f, 0.f, 0.f, 0.f};
        mma_rows<true>(q, scale, tile, I, src, acc);
#pragma unroll
        for (int i = 0; i < 4; ++i) {   // acc: (tile row g | g + 8) x (pair 2t | 2t + 1)
            const int p = 2 * t + (i & 1), r = 8 * j + g + (i >> 1) * (D >> 1);
            if (p < n) {
                const int pair = pair_list[p0 + p];
                yk[(long long)pair * D + r] = weights[pair] * acc[i];
            }
        }
    }
    pdl_trigger();
}
