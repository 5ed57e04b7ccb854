// Skinny GEMM for small-batch decode: y[M, N] = x[M, K] @ w[N, K]^T in bf16 with fp32
// accumulation, M <= 8. Weight-bandwidth bound, so the whole design is about keeping HBM busy:
//
// * One CTA = 4 warps = one 16-row tile of w (rows n0..n0+15) over one K range ("split");
//   the 4 warps split that range again and reduce through shared memory.
// * The math runs on the tensor cores (mma.sync m16n8k16 bf16 -> fp32): A = 16 rows of w,
//   B = x^T (its 8 columns are the M <= 8 rows of x; columns past M repeat row M-1, never stored). Thread
//   (g = lane/4, q = lane%4) loads one 16-byte chunk of w rows g and g+8 and the same chunk of
//   x row g; since a k-sum may be taken in any order, a chunk's 8 physical k values serve as the
//   logical k slots {2q, 2q+1, 2q+8, 2q+9} of two mma k-steps. Loads are exactly the 16-byte
//   vectors the memory wants; no shuffles, no shared-memory staging, 4 fp32 accumulators.
// * U chunks per thread per iteration: 2U independent 16-byte weight loads in flight
//   (ld.global.nc, no L1 allocation: w is streamed once), x by ordinary loads through L1 (it is
//   tiny and read by every CTA).
// * Split-K across CTAs (gridDim.y > 1; the factor per weight timed at start-up, gemv_tune.py): the splits of a
//   tile form one thread-block cluster; rank 0 sums their fp32 partial tiles over distributed shared memory
//   in split order (deterministic) and writes bf16, with no global workspace, fence or arrival counter on the
//   tail of a split GEMV.
// * Programmatic dependent launch (when the wrapper launches with it): the weights do not depend
//   on the previous kernel, so the first iteration's weights are loaded into registers before
//   griddepcontrol.wait; only x is read after it. A CTA lets the next
//   kernel launch (launch_dependents) once its main loop is done, so that kernel's CTAs take the SMs
//   this grid's tail leaves idle. On the H200 (Qwen3-4B, batch 1) that order measured 3.27 ms a step
//   against 3.52 (trigger after the wait) and 3.75 (before it: the next kernel's CTAs then wait through
//   this whole GEMV), and an L2 prefetch of further weights before the wait cost more than it hid.
//   Without PDL both instructions are no-ops.
// * The x loader is a template parameter (LoadX reads x as given), the place where an elementwise
//   step before the GEMV can be folded in. SiLU-and-multiply folded in this way was measured slower
//   on the H200 (31 vs 17.5 us for the 4B down projection at M = 1): the 8 lane groups of the mma's B
//   operand each recompute the activation of their row, 8x redundant at M = 1.
// * The epilogue is a template parameter too: which rows of w a tile takes and what becomes of its
//   final sums. An elementwise step after the GEMV is folded in there, where each value is computed
//   once: StoreY (plain y), SiluMul (w = [gate; up], silu(gate) * up stored). The add + RMSNorm after
//   the o / down projections was tried there too (the grid's last CTA normalising the M rows) and taken
//   out: its one-CTA tail cost more than the kernel boundary it saved (o at M = 1: 12.5 vs 11.5 us, M = 8:
//   26.1 vs 12.0 us on the H200).
// Requirements (checked by the wrapper): K % 8 == 0, w/x/rows 16-byte aligned, M <= 8.
#include "common.cuh"
#include "cluster.cuh"   // cluster_sync, ld_cluster

namespace {

__device__ __forceinline__ uint4 ld_stream(const uint4* p) {
    uint4 v;
    asm("ld.global.nc.L1::no_allocate.L2::256B.v4.u32 {%0,%1,%2,%3}, [%4];"
        : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
    return v;
}

// x is written by the previous kernel, which under PDL may still be running when this grid starts:
// an ordinary (coherent) load, kept after griddepcontrol.wait by being volatile, not ld.global.nc.
__device__ __forceinline__ uint4 ld_x(const uint4* p) {
    uint4 v;
    asm volatile("ld.global.v4.u32 {%0,%1,%2,%3}, [%4];" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
    return v;
}

// One 16-byte chunk c (8 consecutive k) of the B operand, from the x row of this lane's group.
struct LoadX {
    const uint4* row;
    __device__ LoadX(const bf16* x, int) : row(reinterpret_cast<const uint4*>(x)) {}
    __device__ uint4 operator()(int c) const { return ld_x(row + c); }
};

__device__ __forceinline__ void mma_bf16(float* c, const uint4& a, const uint4& b, const uint4& xv) {
    // two k-steps: (a.x, b.x, a.y, b.y | xv.x, xv.y) and (a.z, b.z, a.w, b.w | xv.z, xv.w);
    // a = row g, b = row g+8 of the tile (A fragment order: a0 row g, a1 row g+8, a2 row g, a3 row g+8)
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a.x), "r"(b.x), "r"(a.y), "r"(b.y), "r"(xv.x), "r"(xv.y));
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a.z), "r"(b.z), "r"(a.w), "r"(b.w), "r"(xv.z), "r"(xv.w));
}

// --- epilogues. row(tile, r): the w row a tile takes as its row r (lane group g loads rows g and g + 8);
// store(s, ...): the tile's final fp32 sums s = (row g: x rows 2q, 2q + 1 | row g + 8: x rows 2q, 2q + 1).

// y[M, n] in bf16: tile t = rows 16t .. 16t + 15; rows past n repeat n - 1 and are not stored.
struct StoreY {
    bf16* y;
    long long ldy;
    int n;
    __device__ int row(int tile, int r) const { return min(tile * 16 + r, n - 1); }
    __device__ void store(float4 s, int M, int tile, int g, int q) const {
        const int m0 = 2 * q, m1 = 2 * q + 1, r0 = tile * 16 + g, r1 = r0 + 8;
        if (r0 < n) {
            if (m0 < M) y[m0 * ldy + r0] = from_f32<bf16>(s.x);
            if (m1 < M) y[m1 * ldy + r0] = from_f32<bf16>(s.y);
        }
        if (r1 < n) {
            if (m0 < M) y[m0 * ldy + r1] = from_f32<bf16>(s.z);
            if (m1 < M) y[m1 * ldy + r1] = from_f32<bf16>(s.w);
        }
    }
};

__device__ __forceinline__ float round_bf16(float v) { return to_f32(from_f32<bf16>(v)); }

// out[M, inter] = silu(gate) * up for w = [gate; up] ([2 inter, K], inter % 8 == 0): tile t takes gate rows
// 8t .. 8t + 7 as its rows 0..7 and the matching up rows as 8..15, so a lane holds both factors of
// out[2q, 8t + g] (s.x, s.z) and of out[2q + 1, 8t + g] (s.y, s.w). Both are rounded to bf16 as linear
// stores them and combined as silu_mul does: the bits of silu_mul(linear(x, w)).
struct SiluMul {
    bf16* out;
    long long ldo;
    int inter;
    __device__ int row(int tile, int r) const { return r < 8 ? tile * 8 + r : inter + tile * 8 + r - 8; }
    __device__ void store(float4 s, int M, int tile, int g, int q) const {
        const int m0 = 2 * q, m1 = 2 * q + 1, j = tile * 8 + g;
        if (m0 < M) out[m0 * ldo + j] = from_f32<bf16>(silu_mul_f32(round_bf16(s.x), round_bf16(s.z)));
        if (m1 < M) out[m1 * ldo + j] = from_f32<bf16>(silu_mul_f32(round_bf16(s.y), round_bf16(s.w)));
    }
};

// Split-K through a thread-block cluster: a tile's splits run as one cluster (cluster dims (1, splits, 1), so
// cluster rank = split). Each keeps its partial sums in its own shared memory; after a cluster barrier rank 0
// reads them over distributed shared memory in split order (deterministic) and stores; a second barrier keeps
// the other CTAs, and their shared memory, alive until it has. No workspace, counters or global round trips.
constexpr int WARPS = 4;

template <int U, typename XLoad, typename Epi>
__device__ __forceinline__ void gemv_tile(const bf16* x, long long ldx, const bf16* __restrict__ w, long long ldw,
                                          int M, int chunks, const Epi& epi) {
    const int tile = blockIdx.x, split = blockIdx.y, splits = gridDim.y;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, q = lane & 3;
    // this split's chunk range, then this warp's quarter of it (chunk = 8 consecutive k)
    const int s_lo = (int)((long long)chunks * split / splits), s_hi = (int)((long long)chunks * (split + 1) / splits);
    const int lo = s_lo + (s_hi - s_lo) * warp / WARPS, hi = s_lo + (s_hi - s_lo) * (warp + 1) / WARPS;
    const uint4* wa = reinterpret_cast<const uint4*>(w + (long long)epi.row(tile, g) * ldw);
    const uint4* wb = reinterpret_cast<const uint4*>(w + (long long)epi.row(tile, g + 8) * ldw);
    // B column g is output row m = g: groups g >= M read row M-1 and their columns are never stored
    // (branch-free loads keep the weight loads of one iteration in flight together)
    const XLoad xr(x + (long long)min(g, M - 1) * ldx, chunks);

    // The first iteration's weights are loaded into registers before griddepcontrol.wait: they do not depend
    // on the previous kernel, so under PDL their latency hides behind its tail (without PDL the wait is a
    // no-op and this is the loop's first iteration, the same operations in the same order).
    float acc[4] = {0.f, 0.f, 0.f, 0.f};
    const uint4 zero = make_uint4(0u, 0u, 0u, 0u);
    int base = lo;
    const bool first = base + 4 * U <= hi;
    uint4 a0[U], b0[U];
    if (first) {
#pragma unroll
        for (int u = 0; u < U; ++u) {
            a0[u] = ld_stream(wa + base + 4 * u + q);
            b0[u] = ld_stream(wb + base + 4 * u + q);
        }
    }
#if __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
    if (first) {
        uint4 xv[U];
#pragma unroll
        for (int u = 0; u < U; ++u) xv[u] = xr(base + 4 * u + q);
#pragma unroll
        for (int u = 0; u < U; ++u) mma_bf16(acc, a0[u], b0[u], xv[u]);
        base += 4 * U;
    }
    for (; base + 4 * U <= hi; base += 4 * U) {
        uint4 a[U], b[U], xv[U];
#pragma unroll
        for (int u = 0; u < U; ++u) {
            a[u] = ld_stream(wa + base + 4 * u + q);
            b[u] = ld_stream(wb + base + 4 * u + q);
        }
#pragma unroll
        for (int u = 0; u < U; ++u) xv[u] = xr(base + 4 * u + q);
#pragma unroll
        for (int u = 0; u < U; ++u) mma_bf16(acc, a[u], b[u], xv[u]);
    }
    if (base < hi) {  // the last < 4U chunks: predicated loads, every lane still takes part in the mma
        uint4 a[U], b[U], xv[U];
#pragma unroll
        for (int u = 0; u < U; ++u) {
            // the load asm is not volatile, so the compiler may execute it unconditionally:
            // clamp the address into the range and zero the value instead of skipping the load
            const int c = base + 4 * u + q;
            const bool ok = c < hi;
            const int cc = ok ? c : lo;
            a[u] = ld_stream(wa + cc);
            b[u] = ld_stream(wb + cc);
            xv[u] = xr(cc);
            if (!ok) a[u] = b[u] = xv[u] = zero;
        }
#pragma unroll
        for (int u = 0; u < U; ++u) mma_bf16(acc, a[u], b[u], xv[u]);
    }

#if __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
    __shared__ float4 red[WARPS][32];
    red[warp][lane] = make_float4(acc[0], acc[1], acc[2], acc[3]);
    __syncthreads();
    if (warp == 0) {
        float4 s = red[0][lane];
#pragma unroll
        for (int i = 1; i < WARPS; ++i) {  // fixed order: bit-identical across runs
            const float4 t = red[i][lane];
            s.x += t.x; s.y += t.y; s.z += t.z; s.w += t.w;
        }
        if (splits == 1) epi.store(s, M, tile, g, q);
        red[0][lane] = s;   // this split's partial sums, for rank 0 (each lane rewrites only what it read)
    }
    if (splits == 1) return;
    cluster_sync();
    if (split == 0 && warp == 0) {
        float4 s = make_float4(0.f, 0.f, 0.f, 0.f);
        for (int i = 0; i < splits; ++i) {
            const float4 t = ld_cluster(&red[0][lane], i);
            s.x += t.x; s.y += t.y; s.z += t.z; s.w += t.w;
        }
        epi.store(s, M, tile, g, q);
    }
    cluster_sync();
}

}  // namespace

// grid (tiles, splits), block 128, launched with cluster dims (1, splits, 1) when splits > 1 (at most 8, the
// portable cluster size); then the epilogue's arguments. U = 4 chunks a thread (8 weight loads in flight) and min 1
// CTA per SM in the launch bounds, so ptxas keeps all of an iteration's loads in flight (with the default it sank
// them between the mmas, ~3 in flight): in the engine's decode step this beat 2 and 8 chunks, and 4 capped at 64
// registers for 8 CTAs an SM, though the last was faster on some weights alone.
// EPI: the epilogue built from the trailing parameters.
#define GEMV_KERNEL(NAME, EPI, ...)                                                                        \
    extern "C" __global__ void __launch_bounds__(128, 1) NAME(                                             \
        const bf16* x, long long ldx, const bf16* __restrict__ w, long long ldw, int M, int chunks,        \
        __VA_ARGS__) {                                                                                     \
        gemv_tile<4, LoadX>(x, ldx, w, ldw, M, chunks, EPI);                                               \
    }

// tiles = ceil(n / 16)
GEMV_KERNEL(gemv_bf16, (StoreY{y, ldy, n}), bf16* __restrict__ y, long long ldy, int n)
// tiles = inter / 8 (w: [2 inter, K])
GEMV_KERNEL(gemv_silu_bf16, (SiluMul{out, ldo, inter}), bf16* __restrict__ out, long long ldo, int inter)

// A linear map of its own per head (MLA's W_UK and W_UV at decode): grid (ceil(n / 16), 1, heads), head h = blockIdx.z
// reading x, w and y from h times their head strides; one split (a head's K, 128 or 512, is under a split's depth).
extern "C" __global__ void __launch_bounds__(128, 1) gemv_heads_bf16(
    const bf16* x, long long ldx, long long x_head, const bf16* __restrict__ w, long long ldw, long long w_head, int M,
    int chunks, bf16* __restrict__ y, long long ldy, long long y_head, int n) {
    const long long h = blockIdx.z;
    gemv_tile<4, LoadX>(x + h * x_head, ldx, w + h * w_head, ldw, M, chunks, StoreY{y + h * y_head, ldy, n});
}
