// Hopper tensor memory accelerator (TMA, sm_90) and the shared-memory barriers (mbarrier) that track its copies.
// A tensor map (CUtensorMap, 128 bytes, encoded on the host by cuTensorMapEncodeTiled: tma.py) is passed by value
// as a __grid_constant__ kernel parameter; one thread issues a 2-D box copy global -> shared, and the copy signals
// completion on an mbarrier as bytes ("transactions"). Facts from the PTX ISA ("Tensor Copy", "mbarrier"):
//   * an mbarrier phase completes when its pending arrivals reach zero and its transaction count is back to zero;
//     arrive.expect_tx arrives once and adds the bytes the copies will deliver (the whole box, also the parts
//     outside the tensor, which arrive as zeros);
//   * try_wait.parity P returns true once the phase of parity P has completed; a freshly initialised barrier is in
//     phase 0, so a wait for parity 1 passes at once (a producer's first pass over empty stages);
//   * with CU_TENSOR_MAP_SWIZZLE_128B and a 128-byte inner box, row r of a box lands at byte 128 r with its 16-byte
//     chunk c at chunk c ^ (r % 8) (1024-byte aligned destination): the canonical layout wgmma's 128-byte-swizzle
//     descriptors read (wgmma.cuh).
#pragma once

struct alignas(64) TensorMap {   // CUtensorMap's 128 opaque bytes
    unsigned long long opaque[16];
};

__device__ __forceinline__ unsigned int shared_addr(const void* p) {
    return static_cast<unsigned int>(__cvta_generic_to_shared(p));
}

__device__ __forceinline__ void mbar_init(unsigned long long* bar, unsigned int arrivals) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(shared_addr(bar)), "r"(arrivals) : "memory");
}

// Makes initialised barriers visible to the async proxy (the TMA unit) and to the cluster; a CTA barrier follows.
__device__ __forceinline__ void mbar_init_fence() {
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
}

__device__ __forceinline__ void mbar_arrive(unsigned long long* bar) {
    asm volatile("{\n.reg .b64 st;\nmbarrier.arrive.shared::cta.b64 st, [%0];\n}" ::"r"(shared_addr(bar)) : "memory");
}

__device__ __forceinline__ void mbar_arrive_expect_tx(unsigned long long* bar, unsigned int bytes) {
    asm volatile("{\n.reg .b64 st;\nmbarrier.arrive.expect_tx.shared::cta.b64 st, [%0], %1;\n}"
                 ::"r"(shared_addr(bar)), "r"(bytes) : "memory");
}

// Waits for the phase of `parity` to complete. A wait that never ends (a transaction count that cannot be met, a
// lost arrival) traps after 2^24 unsuccessful tries (each may suspend the thread for a hardware-defined time) instead
// of hanging the GPU for good: the launch then fails with an error.
__device__ __forceinline__ void mbar_wait(unsigned long long* bar, unsigned int parity) {
    unsigned int done = 0;
    for (unsigned int tries = 0; !done; ++tries) {
        asm volatile(
            "{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}"
            : "=r"(done) : "r"(shared_addr(bar)), "r"(parity) : "memory");
        if (tries == (1u << 24)) __trap();
    }
}

// The box at (inner coordinate c0, outer coordinate c1) of `map` into shared memory at `dst`, signalled on `bar`.
__device__ __forceinline__ void tma_load_2d(void* dst, const TensorMap* map, int c0, int c1, unsigned long long* bar) {
    asm volatile(
        "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];"
        ::"r"(shared_addr(dst)), "l"(reinterpret_cast<unsigned long long>(map)), "r"(c0), "r"(c1), "r"(shared_addr(bar))
        : "memory");
}

__device__ __forceinline__ void tma_prefetch_map(const TensorMap* map) {
    asm volatile("prefetch.tensormap [%0];" ::"l"(reinterpret_cast<unsigned long long>(map)) : "memory");
}
