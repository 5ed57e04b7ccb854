// A research kernel for scripts/gemv_chain_bench.py: can one persistent kernel run the batch-1 decode's chain
// of GEMVs faster than one kernel per GEMV? Each GEMV in its own kernel pays a launch, a ramp (nothing arrives
// from HBM for the first ~microsecond) and a tail (the last CTAs finish alone); stop 12 measured the 145 GEMVs
// of a Qwen3-4B step at ~3.1 TB/s against 4.3 TB/s of copy bandwidth.
//
// Both kernels compute the same units the same way, so their outputs are bit-identical:
//   unit   16 rows of one op's w [n, k] (bf16) against its x [k] (M = 1), fp32 sums, y stored bf16.
//          Warp q of 4 takes rows 4q..4q+3; each lane streams 16-byte chunks of those 4 rows (4 loads in
//          flight per step, 2 steps unrolled) and the matching chunk of x; warp sums, lane 0 stores.
//   gemv_units   one op: a CTA a unit (grid = n / 16), launched once per op (the baseline).
//   gemv_chain   every op, persistently: grid = every CTA the GPU holds at once (G); global unit u (op i's units
//                numbered from unit_base[i]) belongs to CTA u % G, and each CTA takes its units in op order.
//                Before a unit of op i it optionally prefetches the unit's weights into L2 (they do not depend
//                on op i - 1), then waits until op i - 1's counter reaches its unit count; after the unit it
//                counts it. A CTA with no unit left in op i moves on to op i + 1 and prefetches there while the
//                other CTAs finish op i: the overlap that separate launches cannot have. Units are taken in
//                op order and all G CTAs are resident, so every wait ends. `done` must be zero at launch.
#include "common.cuh"

struct Op {             // mirrored by OP_DTYPE in gemv_chain_bench.py: 32 bytes
    const bf16* w;      // [n, k], rows packed
    const bf16* x;      // [k]
    bf16* y;            // [n]
    int n;              // a multiple of 16
    int k;              // a multiple of 8
};

namespace {

constexpr int ROWS = 16, WARPS = 4, ROWS_PER_WARP = ROWS / WARPS;

__device__ __forceinline__ uint4 ld_stream(const uint4* p) {
    uint4 v;
    asm("ld.global.nc.L1::no_allocate.L2::256B.v4.u32 {%0,%1,%2,%3}, [%4];"
        : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
    return v;
}

__device__ __forceinline__ float dot8(uint4 w, uint4 x) {   // 8 bf16 products, summed in a fixed order
    const unsigned int a[4] = {w.x, w.y, w.z, w.w}, b[4] = {x.x, x.y, x.z, x.w};
    float s = 0.f;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        s = fmaf(__uint_as_float(a[i] << 16), __uint_as_float(b[i] << 16), s);
        s = fmaf(__uint_as_float(a[i] & 0xffff0000u), __uint_as_float(b[i] & 0xffff0000u), s);
    }
    return s;
}

// x is written by the previous op in a chained run: read through L2 (__ldcg), never a stale L1 line
__device__ __forceinline__ void unit(const Op& op, int t) {
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, chunks = op.k / 8;
    const int row0 = t * ROWS + warp * ROWS_PER_WARP;
    const uint4* w = reinterpret_cast<const uint4*>(op.w + (long long)row0 * op.k);
    const uint4* x = reinterpret_cast<const uint4*>(op.x);
    float acc[ROWS_PER_WARP] = {0.f, 0.f, 0.f, 0.f};
    int c = lane;
    for (; c + 32 < chunks; c += 64) {   // two steps: 8 weight loads in flight
        uint4 a[2][ROWS_PER_WARP];
#pragma unroll
        for (int s = 0; s < 2; ++s)
#pragma unroll
            for (int r = 0; r < ROWS_PER_WARP; ++r) a[s][r] = ld_stream(w + (long long)r * chunks + c + 32 * s);
        const uint4 x0 = __ldcg(x + c), x1 = __ldcg(x + c + 32);
#pragma unroll
        for (int r = 0; r < ROWS_PER_WARP; ++r) acc[r] += dot8(a[0][r], x0) + dot8(a[1][r], x1);
    }
    if (c < chunks) {
        const uint4 xc = __ldcg(x + c);
#pragma unroll
        for (int r = 0; r < ROWS_PER_WARP; ++r) acc[r] += dot8(ld_stream(w + (long long)r * chunks + c), xc);
    }
#pragma unroll
    for (int r = 0; r < ROWS_PER_WARP; ++r) {
        const float s = warp_sum(acc[r]);
        if (lane == 0) op.y[row0 + r] = from_f32<bf16>(s);
    }
}

__device__ __forceinline__ void prefetch_unit(const Op& op, int t) {
    const char* w = reinterpret_cast<const char*>(op.w + (long long)t * ROWS * op.k);
    const int lines = ROWS * op.k * 2 / 128;   // 128-byte lines of the unit's contiguous rows
    for (int i = threadIdx.x; i < lines; i += blockDim.x)
        asm volatile("prefetch.global.L2::evict_normal [%0];" :: "l"(w + 128LL * i));
}

__device__ __forceinline__ int load_acquire(const int* p) {
    int v;
    asm volatile("ld.acquire.gpu.global.s32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    return v;
}

}  // namespace

extern "C" __global__ void __launch_bounds__(128, 4) gemv_units(const Op* ops, int i) {
    const Op op = ops[i];
    unit(op, blockIdx.x);
}

extern "C" __global__ void __launch_bounds__(128, 4) gemv_chain(const Op* ops, const int* unit_base, int num_ops,
                                                             int* done, int prefetch) {
    const int G = gridDim.x;
    for (int i = 0; i < num_ops; ++i) {
        const Op op = ops[i];
        const int units = op.n / ROWS, base = unit_base[i];
        bool waited = i == 0;
        for (int t = ((int)blockIdx.x - base % G + G) % G; t < units; t += G) {
            if (!waited) {
                if (prefetch) prefetch_unit(op, t);
                if (threadIdx.x == 0) {
                    const int need = ops[i - 1].n / ROWS;
                    while (load_acquire(done + i - 1) < need) __nanosleep(64);
                }
                __syncthreads();   // the whole CTA sees op i - 1 complete (thread 0's acquire, then the barrier)
                waited = true;
            }
            unit(op, t);
            __threadfence();   // this thread's stores of y are visible device-wide ...
            __syncthreads();   // ... for every thread of the CTA, before the unit is counted
            if (threadIdx.x == 0) atomicAdd(done + i, 1);
        }
    }
}

// gemv_stream   every op, persistently, with the weights streamed through shared memory ahead of the math.
//   The question: does a step that never stops streaming weights (across op boundaries, while the math waits for
//   the previous op) read them at the rate of one long copy (lm_head's ~4.2 TB/s on the H200) instead of each
//   GEMV's own ramp and tail (~3.3 TB/s summed)? gemv_chain could not: its look-ahead is what a CTA's registers
//   hold (~16 KB a SM) or an L2 prefetch that measured slower.
//   grid   one CTA a SM (all resident: the waits on `done` rely on it); CTA c of G takes rows
//          [n c / G, n (c + 1) / G) of every op: one contiguous byte range of w, the same share of every op.
//   warp 8 (lane 0), the producer: copies the CTA's rows of op after op into a ring of `stages` slots
//          (slot_bytes each, whole rows, at most RMAX) with cp.async.bulk, each completing on its slot's full
//          mbarrier; it waits only for a slot to be released, never for an op's x, so the copies run ahead
//          across op boundaries by up to the ring (stages * slot_bytes a SM).
//   warps 0-7, the consumers: before op i, wait until every CTA has counted op i - 1 (x may be its y), copy x
//          into shared memory; then warp w takes slots w, w + 8, ... on its own (no block barrier a slot: a first
//          version with four warps sharing each slot and meeting at a barrier ran at 1.6 TB/s on an H100, and
//          four warps each on its own slots at 1.6-1.8, issue-bound: 1.25 warps a scheduler):
//          each lane sums its 16-byte chunks of the slot's rows against x, the warp reduces, lane 0 releases the
//          slot and stores the rows' y.
//          After the op each CTA counts it once in done[i] (`done` zero at launch).
// dynamic smem: stages * slot_bytes + the largest k * 2 + 64 (x). Outputs are not bit-identical to gemv_units (other
// summation order); the bench checks them against it and numpy with a tolerance.
namespace {

constexpr int RMAX = 8, MAX_STAGES = 16;

__device__ __forceinline__ unsigned int smem_u32(const void* p) {
    return static_cast<unsigned int>(__cvta_generic_to_shared(p));
}

__device__ __forceinline__ void bar_wait(unsigned long long* bar, unsigned int parity) {
    asm volatile("{\n .reg .pred p;\n WAIT_%=:\n"
                 " mbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n"
                 " @!p bra WAIT_%=;\n}" :: "r"(smem_u32(bar)), "r"(parity) : "memory");
}

template <int CONSUMERS>
__device__ __forceinline__ void consumers_sync() {   // the consumer warps only: the producer never joins
    asm volatile("bar.sync 1, %0;" :: "n"(CONSUMERS) : "memory");
}

// a slot's rows in shared memory: packed, or (MMA) each padded by 64 bytes so that the two rows 8 lanes read at
// once fall in different bank halves
template <bool MMA> __device__ __forceinline__ int row_stride(int k) { return 2 * k + (MMA ? 64 : 0); }
template <bool MMA> __device__ __forceinline__ int rows_per_slot(int k, int slot_bytes) {
    return max(1, min(RMAX, slot_bytes / row_stride<MMA>(k)));
}

// MMA: y = w x on the tensor cores (mma.sync m16n8k16), as gemv.cu's GEMV, for a slot of up to 8 rows. Row g is
// both A row g (its first half of k) and A row g + 8 (its second half); B column 0 is x's first half and column 1
// its second half, so C[g][0] + C[g + 8][1] is row g's sum. Lane (g, q) loads one 16-byte chunk of each half
// of row g and the chunk of column g of x; a chunk's 8 values are the k slots {2q, 2q + 1 | 2q + 8, 2q + 9} of
// two k-steps, the same for A and B. Needs k % 64 == 0 (each half whole rounds of 4 chunks).
__device__ __forceinline__ void mma2(float* c, const uint4& a, const uint4& b, const uint4& xv) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
                 "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a.x), "r"(b.x), "r"(a.y), "r"(b.y), "r"(xv.x), "r"(xv.y));
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
                 "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a.z), "r"(b.z), "r"(a.w), "r"(b.w), "r"(xv.z), "r"(xv.w));
}

template <int CONSUMERS, bool UNROLL, bool MMA>
__device__ __forceinline__ void stream(const Op* ops, int num_ops, int* done, int stages, int slot_bytes) {
    extern __shared__ __align__(128) unsigned char smem[];
    __shared__ __align__(8) unsigned long long full[MAX_STAGES], empty[MAX_STAGES];
    const int G = gridDim.x, c = blockIdx.x, tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    // Slot s is always taken by warp s % warps: were it shared, a warp waiting for its second use could find the
    // parity of the slot's current phase already "complete" and read it early (this faulted on the H100).
    if (stages % (CONSUMERS / 32) != 0 || stages > MAX_STAGES) __trap();
    if (tid == 0) {
        for (int s = 0; s < stages; ++s) {
            asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" :: "r"(smem_u32(&full[s])));
            asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" :: "r"(smem_u32(&empty[s])));
        }
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    __syncthreads();
    unsigned char* ring = smem;
    uint4* xs = reinterpret_cast<uint4*>(smem + stages * slot_bytes);

    if (warp == CONSUMERS / 32) {   // the producer
        if (lane != 0) return;
        int it = 0;
        for (int i = 0; i < num_ops; ++i) {
            const Op op = ops[i];
            const int r0 = (int)((long long)op.n * c / G), r1 = (int)((long long)op.n * (c + 1) / G);
            const int rps = rows_per_slot<MMA>(op.k, slot_bytes), rs = row_stride<MMA>(op.k);
            for (int r = r0; r < r1; r += rps, ++it) {
                const int s = it % stages, nr = min(rps, r1 - r);
                if (it >= stages) bar_wait(&empty[s], ((it / stages) - 1) & 1);
                asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;"
                             :: "r"(smem_u32(&full[s])), "r"((unsigned int)(nr * op.k * 2)) : "memory");
                // packed rows: one copy; padded rows: a copy a row
                for (int q = 0; q < (MMA ? nr : 1); ++q)
                    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes "
                                 "[%0], [%1], %2, [%3];"
                                 :: "r"(smem_u32(ring + s * slot_bytes + q * rs)),
                                    "l"(op.w + (long long)(r + q) * op.k),
                                    "r"((unsigned int)((MMA ? 1 : nr) * op.k * 2)), "r"(smem_u32(&full[s])) : "memory");
            }
        }
        return;
    }

    int it = 0;
    for (int i = 0; i < num_ops; ++i) {
        const Op op = ops[i];
        const int r0 = (int)((long long)op.n * c / G), r1 = (int)((long long)op.n * (c + 1) / G);
        const int rps = rows_per_slot<MMA>(op.k, slot_bytes), chunks = op.k / 8, half = chunks / 2;
        if (MMA && op.k % 64 != 0) __trap();
        if (i > 0 && tid == 0)
            while (load_acquire(done + i - 1) < G) __nanosleep(32);
        consumers_sync<CONSUMERS>();   // op i - 1 is complete everywhere, for every consumer thread
        // MMA: x's second half 64 bytes further on, off the banks of the first
        for (int j = tid; j < chunks; j += CONSUMERS)
            xs[j + (MMA && j >= half ? 4 : 0)] = __ldcg(reinterpret_cast<const uint4*>(op.x) + j);
        consumers_sync<CONSUMERS>();
        for (int r = r0; r < r1; r += rps, ++it) {
            if (it % (CONSUMERS / 32) != warp) continue;   // slot `it` is this warp's: no block barrier a slot
            const int s = it % stages, nr = min(rps, r1 - r);
            bar_wait(&full[s], (it / stages) & 1);
            const uint4* slot = reinterpret_cast<const uint4*>(ring + s * slot_bytes);
            if constexpr (MMA) {
                const int g = lane >> 2, q = lane & 3;
                const uint4* row = slot + min(g, nr - 1) * (row_stride<MMA>(op.k) / 16);   // rows past nr: unused
                const uint4* xcol = xs + (g == 1 ? half + 4 : 0);
                float acc[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll 4
                for (int cc = q; cc < half; cc += 4) mma2(acc, row[cc], row[half + cc], xcol[cc]);
                __syncwarp();   // every lane's reads of the slot are done
                if (lane == 0)
                    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" :: "r"(smem_u32(&empty[s])) : "memory");
                if (q == 0 && g < nr) op.y[r + g] = from_f32<bf16>(acc[0] + acc[3]);
                continue;
            }
            float acc[RMAX] = {};
            int j = lane;
            for (; UNROLL && j + 32 < chunks; j += 64) {   // two chunks a row at once: their loads overlap
                const uint4 x0 = xs[j], x1 = xs[j + 32];
#pragma unroll
                for (int q = 0; q < RMAX; ++q)
                    if (q < nr) acc[q] += dot8(slot[q * chunks + j], x0) + dot8(slot[q * chunks + j + 32], x1);
            }
            for (; j < chunks; j += 32) {
                const uint4 x0 = xs[j];
#pragma unroll
                for (int q = 0; q < RMAX; ++q)
                    if (q < nr) acc[q] += dot8(slot[q * chunks + j], x0);
            }
#pragma unroll
            for (int q = 0; q < RMAX; ++q)
                if (q < nr) acc[q] = warp_sum(acc[q]);   // every lane's reads of the slot are in its sums now
            if (lane == 0) {
                asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" :: "r"(smem_u32(&empty[s])) : "memory");
#pragma unroll
                for (int q = 0; q < RMAX; ++q)
                    if (q < nr) op.y[r + q] = from_f32<bf16>(acc[q]);
            }
        }
        __threadfence();    // this thread's stores of y are visible device-wide ...
        consumers_sync<CONSUMERS>();   // ... for every consumer, before the CTA counts the op
        if (tid == 0) atomicAdd(done + i, 1);
    }
}

}  // namespace

// CONSUMERS / 32 consumer warps and the producer's; _r1: a chunk a row at a time; _mma: the tensor cores
#define STREAM_KERNEL(NAME, CONSUMERS, UNROLL, MMA)                                                              \
    extern "C" __global__ void __launch_bounds__(CONSUMERS + 32, 1) NAME(const Op* ops, int num_ops, int* done, \
                                                                          int stages, int slot_bytes) {         \
        stream<CONSUMERS, UNROLL, MMA>(ops, num_ops, done, stages, slot_bytes);                                  \
    }
STREAM_KERNEL(gemv_stream, 256, true, false)
STREAM_KERNEL(gemv_stream_w8_r1, 256, false, false)
STREAM_KERNEL(gemv_stream_w4, 128, true, false)
STREAM_KERNEL(gemv_stream_w4_r1, 128, false, false)
STREAM_KERNEL(gemv_stream_mma, 256, true, true)
