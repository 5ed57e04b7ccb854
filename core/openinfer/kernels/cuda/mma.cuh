// Tensor-core and async-copy building blocks (sm_80+ PTX): cp.async 16- and 4-byte copies, ldmatrix, mma.sync
// m16n8k16 bf16 -> fp32, ex2.approx and bf16x2 packing, shared by the tensor-core attention kernels.
#pragma once

__device__ __forceinline__ unsigned int smem_addr(const void* p) {
    return (unsigned int)__cvta_generic_to_shared(p);
}

// 16-byte global -> shared copy; src_bytes = 0 writes 16 zero bytes and reads nothing.
__device__ __forceinline__ void cp_async16(void* dst, const void* src, int src_bytes) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_addr(dst)), "l"(src), "r"(src_bytes)
                 : "memory");
}
// 4-byte global -> shared copy (through L1: a small strided read); src_bytes = 0 writes zeros.
__device__ __forceinline__ void cp_async4(void* dst, const void* src, int src_bytes) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(smem_addr(dst)), "l"(src), "r"(src_bytes)
                 : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int N> __device__ __forceinline__ void cp_async_wait() {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

__device__ __forceinline__ void ldmatrix_x4(unsigned int* r, const void* p) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(smem_addr(p)));
}
__device__ __forceinline__ void ldmatrix_x4_trans(unsigned int* r, const void* p) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(smem_addr(p)));
}

// c += a (16x16, row) * b (16x8, col), fp32 accumulators: mma_bf16 on bf16 inputs, mma_f16 on f16 ones (the
// attention kernels over fp8 caches, fp8.cuh).
#define MMA_M16N8K16(NAME, TYPE)                                                                                \
    __device__ __forceinline__ void NAME(float* c, const unsigned int* a, unsigned int b0, unsigned int b1) {    \
        asm volatile("mma.sync.aligned.m16n8k16.row.col.f32." TYPE "." TYPE ".f32 {%0, %1, %2, %3}, "          \
                     "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"                                          \
                     : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])                                           \
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));                           \
    }
MMA_M16N8K16(mma_bf16, "bf16")
MMA_M16N8K16(mma_f16, "f16")

// c = a * b, the accumulators' old values ignored (the first product of a sum: no zeroing moves).
__device__ __forceinline__ void mma_bf16_first(float* c, const unsigned int* a, unsigned int b0, unsigned int b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%10, %10, %10, %10};\n"
        : "=f"(c[0]), "=f"(c[1]), "=f"(c[2]), "=f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1), "f"(0.f));
}

// x = hi + lo, both TF32 (round to nearest, ties away): the split of 3xTF32, whose products hi*hi + hi*lo + lo*hi
// keep close to fp32's accuracy on the tensor cores (lo*lo, ~2^-22 relative, is left out). The tensor cores ignore a
// TF32 operand's 13 low bits, so half an ulp added to the bits rounds as cvt.rna.tf32.f32 does for every finite x,
// without the infinity test cvt.rna compiles to (3 instructions a value): 4 instructions a split instead of 8, in
// loops (the GDN state walk) that are bound by instruction issue.
__device__ __forceinline__ void split_tf32(float x, unsigned int& hi, unsigned int& lo) {
    hi = __float_as_uint(x) + 0x1000u;
    lo = __float_as_uint(x - __uint_as_float(hi & 0xffffe000u)) + 0x1000u;
}

// c += a (16x8, row) * b (8x8, col): TF32 inputs (fp32 bit patterns), fp32 accumulators.
__device__ __forceinline__ void mma_tf32(float* c, const unsigned int* a, unsigned int b0, unsigned int b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// 2^x on the SFU, denormal results flushed to zero (exp2f adds a range fix-up around every call);
// 2^-inf = 0.
__device__ __forceinline__ float fast_exp2(float x) {
    float r;
    asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(r) : "f"(x));
    return r;
}

// Two floats -> a bf16x2 word (lo in the low half), round to nearest even.
__device__ __forceinline__ unsigned int pack_bf16x2(float lo, float hi) {
    unsigned int r;
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;\n" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
}

__device__ __forceinline__ unsigned int pack_f16x2(float lo, float hi) {
    unsigned int r;
    asm("cvt.rn.f16x2.f32 %0, %1, %2;\n" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
}
