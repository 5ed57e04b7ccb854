// The fp8 KV cache's element: OCP e4m3 (finite, saturating at +-448, no scale), one byte. Written from the
// activation's value (rounded to nearest even, saturated), read back as bf16, which holds every e4m3 value
// exactly: attention over an fp8 cache is the bf16 kernels' arithmetic on the rounded keys and values.
// The conversions are sm_89+ instructions; below, the kernels that use them trap (the loader refuses an fp8
// cache there first).
#pragma once

// Two e4m3 bytes (the low one first) as a bf16x2 word (its low half first).
__device__ __forceinline__ unsigned int e4m3x2_to_bf16x2(unsigned int two) {
#if __CUDA_ARCH__ >= 890
    unsigned int r;
    asm("{\n .reg .b16 p, lo, hi;\n .reg .f32 flo, fhi;\n cvt.u16.u32 p, %1;\n"
        " cvt.rn.f16x2.e4m3x2 %0, p;\n mov.b32 {lo, hi}, %0;\n cvt.f32.f16 flo, lo;\n cvt.f32.f16 fhi, hi;\n"
        " cvt.rn.bf16x2.f32 %0, fhi, flo;\n}" : "=r"(r) : "r"(two));
    return r;
#else
    __trap();
    return 0u;
#endif
}

// Eight e4m3 bytes (8-byte word) as eight bf16 (16-byte word), in order.
__device__ __forceinline__ uint4 e4m3x8_to_bf16x8(uint2 v) {
    return make_uint4(e4m3x2_to_bf16x2(v.x & 0xffffu), e4m3x2_to_bf16x2(v.x >> 16), e4m3x2_to_bf16x2(v.y & 0xffffu),
                      e4m3x2_to_bf16x2(v.y >> 16));
}

// e4m3 bytes of two floats, x0 in the low byte: round to nearest even, saturate to +-448 (NaN stays NaN).
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
