// Hopper warpgroup MMA building blocks (sm_90a only: wgmma needs the arch-specific target): the swizzled tile
// layout, shared-memory matrix descriptors for the 128-byte-swizzle canonical layout, the fence / commit / wait
// protocol and the wgmma shapes the prefill kernels issue (attention_wgmma.cu, moe_wgmma.cu). Facts from the PTX ISA
// ("Asynchronous Warpgroup Level Matrix Shared Memory Layout", "Matrix Descriptor Format"):
//   descriptor bits 0-13 start address >> 4, 16-29 leading byte offset >> 4, 32-45 stride byte offset >> 4,
//   49-51 base offset (0: every swizzle pattern starts 1024-byte aligned), 62-63 swizzle (1 = 128 B).
//   128 B swizzle: 16-byte chunk c of the 128-byte row r of a 1024-byte-aligned 8-row pattern lives at
//   chunk c ^ (r % 8); the hardware applies the XOR to the address it computes, so a descriptor may start
//   32 bytes into a row (the k-steps of a K-major operand).
//   K-major operand (rows x 16 k): rows 8 apart by the stride byte offset, a row's 16 k in 2 chunks.
//   MN-major operand (16 k x n): 64 n contiguous in a 128-byte row, k rows 128 B apart, 8-k groups apart
//   by the stride byte offset, 64-n groups apart by the leading byte offset.
// The accumulator fragment of m64nN: warp w of the warpgroup holds rows 16w .. 16w + 15, laid out per
// 8 columns as the mma.sync m16n8 C fragment (d[4j .. 4j + 3] = rows g, g, g + 8, g + 8 of columns
// 8j + 2 (lane % 4) + {0, 1}, g = lane / 4). Emulated in tests/kernels/test_attention_wgmma_emulation.py.
#pragma once

constexpr int SW_ROW = 128;   // bytes of one swizzled row (64 bf16)

// Byte offset of the 16 bytes holding elements (r, c .. c + 7), c % 8 == 0, of a [R][C] bf16 tile stored as
// [R][64] column halves one after the other, each with the 128-byte swizzle (chunk c / 8 % 8 of row r at
// chunk (c / 8 % 8) ^ (r % 8)). The tile must start 1024-byte aligned.
__device__ __forceinline__ int sw128_offset(int r, int c, int R) {
    return (c >> 6) * R * SW_ROW + r * SW_ROW + ((((c >> 3) & 7) ^ (r & 7)) << 4);
}

__device__ __forceinline__ unsigned long long wgmma_desc_sw128(unsigned int smem_byte_addr, unsigned int lbo,
                                                                unsigned int sbo) {
    return (unsigned long long)((smem_byte_addr & 0x3FFFF) >> 4) | ((unsigned long long)((lbo >> 4) & 0x3FFF) << 16) |
           ((unsigned long long)((sbo >> 4) & 0x3FFF) << 32) | (1ull << 62);
}

// Orders this thread's register writes (accumulators, register A) before the next wgmma reads them.
__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
// Waits until at most N committed groups are pending (N = 0: every wgmma done, accumulators readable,
// its shared-memory operands free to overwrite).
template <int N> __device__ __forceinline__ void wgmma_wait() {
    asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}
// Pins accumulator registers at this point of the program: the compiler sees a wgmma write its
// accumulators when it is issued, so without this it could move their reads above the wgmma_wait.
template <int N> __device__ __forceinline__ void wgmma_pin(float* r) {
#pragma unroll
    for (int i = 0; i < N; ++i) asm volatile("" : "+f"(r[i])::"memory");
}
// Makes this thread's generic-proxy shared-memory writes (cp.async, st.shared) visible to the async proxy
// that wgmma reads its descriptors' operands through; a barrier after it publishes them to the warpgroup.
__device__ __forceinline__ void fence_proxy_async_smem() {
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}

// The wgmma shapes, in bf16 (F16 false) or f16 (true; the fp8-cache kernels' products, fp8.cuh): the accumulator
// operands of m64n64 / m64n128 (32 / 64 fp32 registers a thread), their place-holders, and each shape's text.
#define WGMMA_REGS32 "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, " \
    "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31"
#define WGMMA_REGS64 WGMMA_REGS32 ", %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, " \
    "%47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"
#define WGMMA_D32 "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), \
    "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),      \
    "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),    \
    "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
#define WGMMA_D64 WGMMA_D32,                                                                                    \
    "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),    \
    "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),    \
    "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),    \
    "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
#define WGMMA_SS_N64(T) "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"                                           \
    "wgmma.mma_async.sync.aligned.m64n64k16.f32." T "." T " {" WGMMA_REGS32 "}, %32, %33, p, 1, 1, 0, 0;\n}\n"
#define WGMMA_SS_N128(T) "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"                                          \
    "wgmma.mma_async.sync.aligned.m64n128k16.f32." T "." T " {" WGMMA_REGS64 "}, %64, %65, p, 1, 1, 0, 0;\n}\n"
#define WGMMA_RS_TB_N128(T) "{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"                                       \
    "wgmma.mma_async.sync.aligned.m64n128k16.f32." T "." T " {" WGMMA_REGS64 "}, {%64, %65, %66, %67}, %68, p, 1, " \
    "1, 1;\n}\n"

// d (m64 x n64, fp32) (+)= A (64 x 16, smem descriptor, K-major) * B (16 x 64, smem descriptor, K-major);
// scale_d = 0 overwrites d.
template <bool F16 = false>
__device__ __forceinline__ void wgmma_m64n64k16_ss(float* d, unsigned long long a, unsigned long long b, int scale_d) {
    if constexpr (F16) asm volatile(WGMMA_SS_N64("f16") : WGMMA_D32 : "l"(a), "l"(b), "r"(scale_d));
    else asm volatile(WGMMA_SS_N64("bf16") : WGMMA_D32 : "l"(a), "l"(b), "r"(scale_d));
}

// d (m64 x n128, fp32) (+)= A (64 x 16, smem descriptor, K-major) * B (16 x 128, smem descriptor, K-major);
// scale_d = 0 overwrites d.
template <bool F16 = false>
__device__ __forceinline__ void wgmma_m64n128k16_ss(float* d, unsigned long long a, unsigned long long b, int scale_d) {
    if constexpr (F16) asm volatile(WGMMA_SS_N128("f16") : WGMMA_D64 : "l"(a), "l"(b), "r"(scale_d));
    else asm volatile(WGMMA_SS_N128("bf16") : WGMMA_D64 : "l"(a), "l"(b), "r"(scale_d));
}

// d (m64 x n128, fp32) += A (64 x 16, registers: the mma.sync m16n8k16 A fragment of the warp's 16 rows)
// * B (16 x 128, smem descriptor, MN-major: imm-trans-b = 1).
template <bool F16 = false>
__device__ __forceinline__ void wgmma_m64n128k16_rs_tb(float* d, const unsigned int* a, unsigned long long b) {
    if constexpr (F16)
        asm volatile(WGMMA_RS_TB_N128("f16") : WGMMA_D64 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(1));
    else
        asm volatile(WGMMA_RS_TB_N128("bf16") : WGMMA_D64 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(1));
}
