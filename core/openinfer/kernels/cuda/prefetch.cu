// Warming the L2 cache: start reading weights a decode step needs next while a latency-bound kernel (MLA attention
// at small batches) leaves the memory bus idle, so the kernels after it find them in L2. A hint only: nothing waits
// for the lines, and the kernels that read the weights read them as before, wherever they are.
//
// Up to PREFETCH_RANGES byte ranges, each 16-byte aligned with a length a multiple of 16 (ops.py's prefetch trims
// them), cut into PREFETCH_CHUNK-byte chunks; thread g of the grid takes chunks g, g + threads, ... of the ranges laid
// end to end. On sm_90 a chunk is one bulk prefetch (the SM's copy engine fetches it; the thread moves on), elsewhere
// one prefetch a 128-byte line.
#include "common.cuh"

#define PREFETCH_RANGES 8
#define PREFETCH_CHUNK 8192

__device__ __forceinline__ void prefetch_chunk(const char* p, unsigned int bytes) {
#if __CUDA_ARCH__ >= 900
    asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(p), "r"(bytes) : "memory");
#else
    for (unsigned int off = 0; off < bytes; off += 128) asm volatile("prefetch.global.L2 [%0];" ::"l"(p + off));
#endif
}

// The weights predate the step, so the prefetches go out before the PDL wait; the kernel still waits and triggers
// (common.cuh's rule) so that the chain of dependent launches runs through it.
extern "C" __global__ void __launch_bounds__(32) prefetch_l2(
    int count, const char* p0, long long n0, const char* p1, long long n1, const char* p2, long long n2,
    const char* p3, long long n3, const char* p4, long long n4, const char* p5, long long n5, const char* p6,
    long long n6, const char* p7, long long n7) {
    const char* ptr[PREFETCH_RANGES] = {p0, p1, p2, p3, p4, p5, p6, p7};
    const long long bytes[PREFETCH_RANGES] = {n0, n1, n2, n3, n4, n5, n6, n7};
    const long long stride = (long long)gridDim.x * blockDim.x;
    long long chunk = (long long)blockIdx.x * blockDim.x + threadIdx.x, first = 0;   // first: the range's chunk 0
    for (int r = 0; r < count && r < PREFETCH_RANGES; ++r) {
        const long long chunks = (bytes[r] + PREFETCH_CHUNK - 1) / PREFETCH_CHUNK;
        for (; chunk < first + chunks; chunk += stride) {
            const long long off = (chunk - first) * PREFETCH_CHUNK;
            prefetch_chunk(ptr[r] + off, (unsigned int)min((long long)PREFETCH_CHUNK, bytes[r] - off));
        }
        first += chunks;
    }
    pdl_begin();
}
