// Research kernels for scripts/hbm_read_bench.py: how fast can one kernel read a weight matrix of each decode
// shape from HBM, doing nothing with it? The answer bounds what any GEMV or skinny GEMM on that shape can reach.
//   read_ldg    every thread streams 16-byte loads (ld.global.nc, no L1 allocation, as the GEMV loads), grid-stride,
//               4 loads in flight a thread; the bytes are xor-folded so the loads stay.
//   read_bulk   TMA bulk copies (cp.async.bulk, sm_90): thread 0 of each CTA keeps `stages` copies of `chunk`
//               bytes in flight into shared memory, completion counted on one mbarrier per stage; the CTA's
//               threads xor-fold each landed chunk, as a consumer would read it.
#include "common.cuh"

namespace {

__device__ __forceinline__ uint4 ld_stream(const uint4* p) {
    uint4 v;
    asm volatile("ld.global.nc.L1::no_allocate.L2::256B.v4.u32 {%0,%1,%2,%3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
    return v;
}

__device__ __forceinline__ unsigned int fold(uint4 v) { return v.x ^ v.y ^ v.z ^ v.w; }

__device__ __forceinline__ unsigned int smem_addr(const void* p) {
    return static_cast<unsigned int>(__cvta_generic_to_shared(p));
}

__device__ __forceinline__ void mbar_init(unsigned long long* bar) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" :: "r"(smem_addr(bar)));
}

__device__ __forceinline__ void bulk_load(void* dst, const void* src, unsigned int bytes, unsigned long long* bar) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" :: "r"(smem_addr(bar)), "r"(bytes) : "memory");
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];"
                 :: "r"(smem_addr(dst)), "l"(src), "r"(bytes), "r"(smem_addr(bar)) : "memory");
}

__device__ __forceinline__ void mbar_wait(unsigned long long* bar, unsigned int parity) {
    asm volatile("{\n .reg .pred p;\n WAIT_%=:\n"
                 " mbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n"
                 " @!p bra WAIT_%=;\n}" :: "r"(smem_addr(bar)), "r"(parity) : "memory");
}

}  // namespace

extern "C" __global__ void __launch_bounds__(256) read_ldg(const uint4* __restrict__ p, long long n16, unsigned int* out) {
    const long long stride = (long long)gridDim.x * blockDim.x;
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    unsigned int acc = 0;
    for (; i + 3 * stride < n16; i += 4 * stride) {
        const uint4 a = ld_stream(p + i), b = ld_stream(p + i + stride), c = ld_stream(p + i + 2 * stride),
                    d = ld_stream(p + i + 3 * stride);
        acc ^= fold(a) ^ fold(b) ^ fold(c) ^ fold(d);
    }
    for (; i < n16; i += stride) acc ^= fold(ld_stream(p + i));
    if (acc == 0x9e3779b9u) out[0] = acc;   // never true for random data; keeps the loads
}

// chunk: bytes per copy (a multiple of 16); the byte count is a multiple of chunk; dynamic smem = stages * chunk
extern "C" __global__ void __launch_bounds__(128) read_bulk(const char* __restrict__ p, long long nbytes, int chunk,
                                                            int stages, unsigned int* out) {
    extern __shared__ __align__(128) unsigned char buf[];
    __shared__ __align__(8) unsigned long long bars[16];
    const long long chunks = nbytes / chunk;
    if (threadIdx.x == 0) {
        for (int s = 0; s < stages; ++s) mbar_init(&bars[s]);
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    __syncthreads();
    long long c = blockIdx.x;
    if (threadIdx.x == 0)
        for (int s = 0; s < stages && c + (long long)s * gridDim.x < chunks; ++s)
            bulk_load(buf + s * chunk, p + (c + (long long)s * gridDim.x) * chunk, chunk, &bars[s]);
    unsigned int acc = 0;
    for (int it = 0; c < chunks; c += gridDim.x, ++it) {
        const int s = it % stages;
        mbar_wait(&bars[s], (it / stages) & 1);
        const uint4* v = reinterpret_cast<const uint4*>(buf + s * chunk);
        for (int j = threadIdx.x; j < chunk / 16; j += blockDim.x) acc ^= fold(v[j]);
        __syncthreads();   // every thread is done with stage s before it is refilled
        const long long next = c + (long long)stages * gridDim.x;
        if (threadIdx.x == 0 && next < chunks) bulk_load(buf + s * chunk, p + next * chunk, chunk, &bars[s]);
    }
    if (acc == 0x9e3779b9u) out[0] = acc;
}
