// The fp8 KV cache's element: OCP e4m3 (finite, saturating at +-448, no scale), one byte. Written from the
// activation's value (rounded to nearest even, saturated). The attention kernels read it as f16 (one instruction
// converts two bytes; f16 holds every e4m3 value exactly) and run their tensor-core products in f16 over it, the
// query rounded to f16 once: a bf16 detour would take four instructions a pair, and measured, made the decode
// kernel issue-bound. The conversions are sm_89+ instructions; below, the kernels that use them trap (the loader
// refuses an fp8 cache there first).
#pragma once
#include "mma.cuh"   // mma_bf16 / mma_f16, pack_bf16x2 / pack_f16x2

// Four e4m3 bytes (a 32-bit word) as two f16x2 words: bytes 0, 1 to `lo`, bytes 2, 3 to `hi`, each byte pair's low
// byte to its low half. The word splits into its 16-bit halves by register (no masks or shifts), one conversion a pair.
__device__ __forceinline__ void e4m3x4_to_f16x4(unsigned int v, unsigned int& lo, unsigned int& hi) {
#if __CUDA_ARCH__ >= 890
    asm("{\n .reg .b16 a, b;\n mov.b32 {a, b}, %2;\n cvt.rn.f16x2.e4m3x2 %0, a;\n cvt.rn.f16x2.e4m3x2 %1, b;\n}"
        : "=r"(lo), "=r"(hi) : "r"(v));
#else
    __trap();
    lo = hi = 0u;
#endif
}

// Eight e4m3 bytes (8-byte word) as eight f16 (16-byte word), in order.
__device__ __forceinline__ uint4 e4m3x8_to_f16x8(uint2 v) {
    uint4 r;
    e4m3x4_to_f16x4(v.x, r.x, r.y);
    e4m3x4_to_f16x4(v.y, r.z, r.w);
    return r;
}

// A bf16x2 word rounded to f16x2 (the query of an fp8-cache kernel).
__device__ __forceinline__ unsigned int bf16x2_to_f16x2(unsigned int w) {
    return pack_f16x2(__uint_as_float(w << 16), __uint_as_float(w & 0xffff0000u));
}

// The products and the probabilities' packing of a kernel over bf16 caches (F16 false) or fp8 ones (true).
template <bool F16>
__device__ __forceinline__ void mma16(float* c, const unsigned int* a, unsigned int b0, unsigned int b1) {
    if constexpr (F16) mma_f16(c, a, b0, b1);
    else mma_bf16(c, a, b0, b1);
}

template <bool F16>
__device__ __forceinline__ unsigned int pack16(float lo, float hi) {
    if constexpr (F16) return pack_f16x2(lo, hi);
    else return pack_bf16x2(lo, hi);
}

// f32x2 of two floats as e4m3 bytes, x0 in the low byte: round to nearest even, saturate to +-448 (NaN stays NaN).
__device__ __forceinline__ unsigned short f32x2_to_e4m3x2(float x0, float x1) {
#if __CUDA_ARCH__ >= 890
    unsigned short r;
    asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(r) : "f"(x1), "f"(x0));
    return r;
#else
    __trap();
    return 0;
#endif
}
