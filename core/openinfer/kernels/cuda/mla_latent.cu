// MLA's latent cache and its queries around the attention (mla.cu): the cache rows' write (c || k_pe), the
// interleaved rope of q_pe and k_pe, both fused with the latent's rms_norm (mla_rope_write), the gather of a
// sequence's rows for the expanded prefill form, and the packing of two per-head arrays into one.
//
// Mirrored in mla.py: the threads and grids of each kernel, the kernel names.
#include "common.cuh"
#include "mla_row.cuh"

// cache [num_blocks, block_size, 576] (any block stride): row slot = c[t] || k_pe[t]; negative slots are skipped.
extern "C" __global__ void mla_write_latent_bf16(bf16* cache, long long block_stride, int block_size, const bf16* c,
                                                 long long c_stride, const bf16* kpe, long long kpe_stride,
                                                 const long long* slots) {
    pdl_begin();
    const long long slot = slots[blockIdx.x];
    if (slot < 0) return;
    bf16* dst = cache + (slot / block_size) * block_stride + (slot % block_size) * (long long)MLA_D;
    for (int i = threadIdx.x; i < MLA_D; i += blockDim.x)
        dst[i] = i < MLA_R ? c[blockIdx.x * c_stride + i] : kpe[blockIdx.x * kpe_stride + i - MLA_R];
}

// DeepSeek's interleaved RoPE (numpy_mla_moe.mla_rope): pairs (x[2i], x[2i + 1]) turn by frequency i. q [T, nh, P]
// (token stride q_stride, head stride q_head), k [T, P] (row stride k_stride), both any slice; outputs packed.
// cos / sin [max_pos, half] fp32, P = 2 * half. A block per token, a thread per pair.
extern "C" __global__ void mla_rope_bf16(const bf16* q, long long q_stride, long long q_head, const bf16* k,
                                         long long k_stride, const int* positions, const float* cos, const float* sin,
                                         int half, int nh, bf16* q_out, bf16* k_out) {
    pdl_begin();
    const int t = blockIdx.x;
    const long long pos = positions[t];
    for (int i = threadIdx.x; i < (nh + 1) * half; i += blockDim.x) {
        const int head = i / half, j = i % half;
        const bf16* src = head < nh ? q + t * q_stride + head * q_head : k + t * k_stride;
        bf16* dst = head < nh ? q_out + ((long long)t * nh + head) * 2 * half : k_out + (long long)t * 2 * half;
        const float x0 = to_f32(src[2 * j]), x1 = to_f32(src[2 * j + 1]);
        const float c = cos[pos * half + j], s = sin[pos * half + j];
        dst[2 * j] = from_f32<bf16>(x0 * c - x1 * s);
        dst[2 * j + 1] = from_f32<bf16>(x1 * c + x0 * s);
    }
}

// mla_rope_bf16, rms_norm of the latent and mla_write_latent_bf16 in one launch (numpy_mla_moe.mla_rope_write): kv
// [T, 576] (row stride kv_stride) is kv_a_proj_with_mqa's output, c = kv[:, :512] normalised with norm_w (bf16 or
// fp32) and the rotated k_pe = kv[:, 512:] go to cache row slots[t] (skipped where negative); q [T, nh, P] rotated
// into q_out. A block of ROPE_WRITE_THREADS per token: the latent's sum of squares (block_sum), then rms_norm's
// x * inv * w per element. At decode one block does it all, so its time is its loads' latency: the latent and its
// weights are loaded first, the rotations (which do not wait for the norm) run while they land, and the norm's
// products are formed from those registers (x * inv * w, rms_norm's order).
constexpr int ROPE_WRITE_THREADS = 128, ROPE_WRITE_PER = MLA_R / ROPE_WRITE_THREADS;
static_assert(MLA_R % ROPE_WRITE_THREADS == 0, "each thread holds the same number of latent values");

template <typename W>
__device__ void mla_rope_write(const bf16* q, long long q_stride, long long q_head, const bf16* kv, long long kv_stride,
                               const W* norm_w, float eps, const int* positions, const float* cos, const float* sin,
                               int half, int nh, bf16* cache, long long block_stride, int block_size,
                               const long long* slots, bf16* q_out) {
    pdl_begin();
    const int t = blockIdx.x;
    const bf16* row = kv + t * kv_stride;
    const long long pos = positions[t], slot = slots[t];
    float x[ROPE_WRITE_PER], w[ROPE_WRITE_PER];   // element threadIdx.x + ROPE_WRITE_THREADS i of the latent
#pragma unroll
    for (int i = 0; i < ROPE_WRITE_PER; ++i) {
        x[i] = to_f32(row[threadIdx.x + ROPE_WRITE_THREADS * i]);
        w[i] = to_f32(norm_w[threadIdx.x + ROPE_WRITE_THREADS * i]);
    }
    bf16* dst = slot < 0 ? nullptr
                         : cache + (slot / block_size) * block_stride + (slot % block_size) * (long long)MLA_D;
    for (int i = threadIdx.x; i < (nh + 1) * half; i += ROPE_WRITE_THREADS) {
        const int head = i / half, j = i % half;
        const bf16* src = head < nh ? q + t * q_stride + head * q_head : row + MLA_R;
        bf16* out = head < nh ? q_out + ((long long)t * nh + head) * 2 * half : dst + MLA_R;
        if (head == nh && !dst) continue;
        const float x0 = to_f32(src[2 * j]), x1 = to_f32(src[2 * j + 1]);
        const float c = cos[pos * half + j], s = sin[pos * half + j];
        out[2 * j] = from_f32<bf16>(x0 * c - x1 * s);
        out[2 * j + 1] = from_f32<bf16>(x1 * c + x0 * s);
    }
    float ss = 0.f;
#pragma unroll
    for (int i = 0; i < ROPE_WRITE_PER; ++i) ss += x[i] * x[i];
    const float inv = 1.f / sqrtf(block_sum(ss) / MLA_R + eps);
    if (dst) {
#pragma unroll
        for (int i = 0; i < ROPE_WRITE_PER; ++i)
            dst[threadIdx.x + ROPE_WRITE_THREADS * i] = from_f32<bf16>(x[i] * inv * w[i]);
    }
}

#define MLA_ROPE_WRITE(sfx, W)                                                                                     \
    extern "C" __global__ void __launch_bounds__(ROPE_WRITE_THREADS) mla_rope_write_##sfx(                        \
        const bf16* q, long long q_stride, long long q_head, const bf16* kv, long long kv_stride, const W* norm_w,  \
        float eps, const int* positions, const float* cos, const float* sin, int half, int nh, bf16* cache,       \
        long long block_stride, int block_size, const long long* slots, bf16* q_out) {                            \
        mla_rope_write<W>(q, q_stride, q_head, kv, kv_stride, norm_w, eps, positions, cos, sin, half, nh, cache,   \
                          block_stride, block_size, slots, q_out);                                                \
    }
MLA_ROPE_WRITE(bf16, bf16)
MLA_ROPE_WRITE(bf16_wf32, float)

// The expanded form's gather (numpy_mla_moe.mla_gather_latent): row starts[b] + j of out [rows, 576] = the cache
// row of position j of sequence b for j < ctx[b], and out_tables[b, j] = starts[b] + j (0 for j past ctx[b], up to
// width). Grid (row tiles of MLA_GATHER_ROWS, sequence), 16-byte words (the cache rows are 16-byte aligned, as
// mla_attention reads them).
constexpr int MLA_GATHER_ROWS = 8;
extern "C" __global__ void mla_gather_latent_bf16(const bf16* cache, long long block_stride, int block_size,
                                                  const int* tables, int table_stride, const int* ctx,
                                                  const long long* starts, bf16* out, int* out_tables, int width) {
    pdl_begin();
    const int b = blockIdx.y, L = ctx[b], j0 = blockIdx.x * MLA_GATHER_ROWS;
    const long long first = starts[b];
    if (threadIdx.x < MLA_GATHER_ROWS && j0 + (int)threadIdx.x < width) {
        const int j = j0 + threadIdx.x;
        out_tables[(long long)b * width + j] = j < L ? (int)(first + j) : 0;
    }
    for (int i = threadIdx.x; i < MLA_GATHER_ROWS * MLA_CHUNKS; i += blockDim.x) {
        const int j = j0 + i / MLA_CHUNKS, c = i % MLA_CHUNKS;
        if (j >= L) return;
        const bf16* src = cache + tables[(long long)b * table_stride + j / block_size] * block_stride +
                          (long long)(j % block_size) * MLA_D + c * 8;
        *reinterpret_cast<uint4*>(out + (first + j) * MLA_D + c * 8) = *reinterpret_cast<const uint4*>(src);
    }
}

// Heads side by side (numpy_mla_moe.mla_pack_heads, one part): out row n, head h = a[n, h, :da] || b[n, h, :db] ||
// zeros up to width; b's head stride 0 shares one row among the heads (k_pe), db 0 takes none. out's rows (stride
// out_stride) hold the part's heads packed by width. A block a row; W is the unit moved: one bf16, or 16-byte words
// (the `_v_` kernel: every count, stride and pointer in whole words), every count and stride in units of W.
template <typename W>
__device__ __forceinline__ void mla_pack_heads(const W* a, long long a_stride, long long a_head, int da, const W* b,
                                               long long b_stride, long long b_head, int db, W* out,
                                               long long out_stride, int heads, int width, W zero) {
    const long long n = blockIdx.x;
    for (int i = threadIdx.x; i < heads * width; i += blockDim.x) {
        const int h = i / width, c = i % width;
        W v = zero;
        if (c < da) v = a[n * a_stride + h * a_head + c];
        else if (c < da + db) v = b[n * b_stride + h * b_head + c - da];
        out[n * out_stride + i] = v;
    }
}

extern "C" __global__ void mla_pack_heads_bf16(const bf16* a, long long a_stride, long long a_head, int da,
                                               const bf16* b, long long b_stride, long long b_head, int db, bf16* out,
                                               long long out_stride, int heads, int width) {
    pdl_begin();
    mla_pack_heads(a, a_stride, a_head, da, b, b_stride, b_head, db, out, out_stride, heads, width,
                   from_f32<bf16>(0.f));
}

extern "C" __global__ void mla_pack_heads_v_bf16(const uint4* a, long long a_stride, long long a_head, int da,
                                                 const uint4* b, long long b_stride, long long b_head, int db,
                                                 uint4* out, long long out_stride, int heads, int width) {
    pdl_begin();
    mla_pack_heads(a, a_stride, a_head, da, b, b_stride, b_head, db, out, out_stride, heads, width,
                   make_uint4(0, 0, 0, 0));
}
