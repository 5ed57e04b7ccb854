// The packed quantized weight formats (openinfer/quant), decoded exactly with integer bit moves: INT4
// pack-quantized (group 32, symmetric) and FP8 e4m3 with 128x128 block scales, read as 16-byte "chunks" (INT4: one
// group of 32 weights, FP8: 16 weights of one 128-block), so each chunk has one scale. Shared by quant.cu's GEMV
// kernels (a warp streams rows from global memory) and moe_gemm.cuh's grouped GEMM (chunks staged in shared memory).
//
// INT4: q is int32 [rows, K/8] (nibble i of word w = weight 8w + i, stored as value + 8), scale [rows, K/32] in the
// activations' dtype (the checkpoint's bf16); expert stacks in 16-row tiles (Int4Tiles: Int4Layout). FP8: q is
// uint8 [rows, K] (K % 16 == 0), scale float32 [rows, ceil(K/128)] (the 128x128 block scales repeated per row at
// load).
#pragma once
#include "common.cuh"

__device__ __forceinline__ uint4 ld_stream(const uint4* p) {   // read once: no L1 allocation
    uint4 v;
    asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
    return v;
}

__device__ __forceinline__ unsigned int ld_stream(const unsigned int* p) {
    unsigned int v;
    asm volatile("ld.global.nc.L1::no_allocate.u32 %0, [%1];" : "=r"(v) : "l"(p));
    return v;
}

__device__ __forceinline__ unsigned int word_of(const uint4& v, int j) {
    return j == 0 ? v.x : j == 1 ? v.y : j == 2 ? v.z : v.w;
}

// A bf16 pair whose halves are 0x4300 | nibble (exponent 7: 128 + nibble, exactly) -> the pair of nibble - 8, the
// unscaled INT4 weights, exactly and with no conversion instruction: one bf16x2 fma subtracts 136.
__device__ __forceinline__ unsigned int int4_biased_to_bf16x2(unsigned int biased) {
    unsigned int out;
    asm("fma.rn.bf16x2 %0, %1, %2, %3;" : "=r"(out) : "r"(biased), "r"(0x3f803f80u), "r"(0xc308c308u));
    return out;
}

// INT4 in the checkpoint's row layout (TILES false: Linears), or as expert stacks are staged (TILES true;
// openinfer/quant/int4.py, tile_int4): an expert's rows in tiles of 16, tile j holding rows 8j .. 8j + 7 and
// N/2 + 8j .. N/2 + 8j + 7 (tile rows 0..7, 8..15), stored chunk by chunk with each chunk's 16 rows together; the
// scales likewise by chunk pairs, a row's two side by side. A tiled stack row is tile * 16 + tile row, so an expert's
// tiles follow one another as its rows did, and a 16-byte chunk of one row stays contiguous.
template <bool TILES>
struct Int4Layout {
    static constexpr int WORDS = 4;   // 8-weight words of a chunk
    static constexpr int CHUNK = 32;  // weights of a chunk
    static constexpr int GROUP = 32;  // weights a scale covers along a row
    static __device__ __forceinline__ int chunks(int K) { return K >> 5; }
    static __device__ __forceinline__ int scale_cols(int K) { return TILES ? ((K >> 5) + 1) & ~1 : K >> 5; }
    // the stack row of row r of expert e (N rows an expert), which load and scale take
    static __device__ __forceinline__ long long stack_row(int e, int r, int N) {
        if constexpr (!TILES) return (long long)e * N + r;
        const int half = N >> 1, upper = r >= half, rr = r - upper * half;
        return ((long long)e * (N >> 4) + (rr >> 3)) * 16 + 8 * upper + (rr & 7);
    }
    // chunk c of stack row `row`: its 16-byte index, its scale's index
    static __device__ __forceinline__ long long chunk_index(long long row, int K, int c) {
        if constexpr (!TILES) return row * (K >> 5) + c;
        return ((row >> 4) * (K >> 5) + c) * 16 + (row & 15);
    }
    static __device__ __forceinline__ long long scale_index(long long row, int K, int c) {
        if constexpr (!TILES) return row * scale_cols(K) + c;
        return ((row >> 4) * scale_cols(K) + (c & ~1)) * 16 + 2 * (row & 15) + (c & 1);
    }
    static __device__ __forceinline__ uint4 load(const void* q, long long row, int K, int c) {
        return ld_stream(reinterpret_cast<const uint4*>(q) + chunk_index(row, K, c));
    }
    template <typename S>
    static __device__ __forceinline__ float scale(const S* s, long long row, int K, int c) {
        return to_f32(s[scale_index(row, K, c)]);
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
    // the same 8 weights as bf16 (a 16-byte word): the nibbles of weights 2p and 2p + 1 masked into a bf16 pair's
    // mantissas (int4_biased_to_bf16x2).
    static __device__ __forceinline__ uint4 expand_bf16(const uint4& raw, int j) {
        const unsigned int w = word_of(raw, j);
        unsigned int out[4];
#pragma unroll
        for (int p = 0; p < 4; ++p) {
            const unsigned int t = w >> (8 * p);
            out[p] = int4_biased_to_bf16x2((t & 0xfu) | ((t << 12) & 0xf0000u) | 0x43004300u);
        }
        return make_uint4(out[0], out[1], out[2], out[3]);
    }
};

using Int4 = Int4Layout<false>;
using Int4Tiles = Int4Layout<true>;

struct Fp8 {
    static constexpr int WORDS = 2;
    static constexpr int CHUNK = 16;
    static constexpr int GROUP = 128;
    static __device__ __forceinline__ int chunks(int K) { return K >> 4; }
    static __device__ __forceinline__ int scale_cols(int K) { return (K + 127) >> 7; }
    static __device__ __forceinline__ long long stack_row(int e, int r, int N) { return (long long)e * N + r; }
    static __device__ __forceinline__ long long chunk_index(long long row, int K, int c) { return row * (K >> 4) + c; }
    static __device__ __forceinline__ long long scale_index(long long row, int K, int c) {
        return row * scale_cols(K) + (c >> 3);
    }
    static __device__ __forceinline__ uint4 load(const void* q, long long row, int K, int c) {
        return ld_stream(reinterpret_cast<const uint4*>(q) + chunk_index(row, K, c));
    }
    // times 2^8: expand yields the weights / 2^8
    template <typename S>
    static __device__ __forceinline__ float scale(const S* s, long long row, int K, int c) {
        return to_f32(s[scale_index(row, K, c)]) * 256.f;
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
    // the same 8 weights as bf16 (a 16-byte word), unscaled, exactly and with no conversion instruction: a byte's
    // sign, exponent and mantissa placed as a float's (exponent bias 127 for 7: the weight / 2^120, a denormal for
    // the e4m3 subnormals) times 2^120 (exact; the kernels are built without flush-to-zero) is the weight, whose
    // upper half is its bf16 (3 mantissa bits).
    static __device__ __forceinline__ uint4 expand_bf16(const uint4& raw, int j) {
        unsigned int out[4];
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const unsigned int v = word_of(raw, 2 * j + h);
            unsigned int f[4];
#pragma unroll
            for (int b = 0; b < 4; ++b) {
                const unsigned int t = v << (24 - 8 * b);   // byte b on top
                f[b] = __float_as_uint(__uint_as_float((t & 0x80000000u) | ((t >> 4) & 0x07f00000u)) * 0x1p120f);
            }
            out[2 * h] = __byte_perm(f[0], f[1], 0x7632);
            out[2 * h + 1] = __byte_perm(f[2], f[3], 0x7632);
        }
        return make_uint4(out[0], out[1], out[2], out[3]);
    }
};
