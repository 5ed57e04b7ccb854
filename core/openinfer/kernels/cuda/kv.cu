// Paged KV write: scatter this step's k/v rows into their cache slots. The caches are
// [num_blocks, block_size, nkv, d] views whose block stride may exceed block_size*nkv*d (a layer's
// slice of a [num_blocks, layers, ...] pool), so the block stride is an argument.
#include "common.cuh"
#include "fp8.cuh"

#define WRITE_KV_KERNEL(suffix, T)                                                                      \
    extern "C" __global__ void write_kv_##suffix(T* k_cache, T* v_cache, long long block_stride,         \
                                                 int block_size, const T* k, long long k_stride,         \
                                                 const T* v, long long v_stride, const long long* slots, \
                                                 int row) { pdl_begin();                                 \
        const long long slot = slots[blockIdx.x];                                                       \
        if (slot < 0) return; /* padded token: nothing to store */                                      \
        const long long dst = (slot / block_size) * block_stride + (slot % block_size) * (long long)row; \
        const T* ks = k + blockIdx.x * k_stride;                                                        \
        const T* vs = v + blockIdx.x * v_stride;                                                        \
        for (int i = threadIdx.x; i < row; i += blockDim.x) {                                           \
            k_cache[dst + i] = ks[i];                                                                   \
            v_cache[dst + i] = vs[i];                                                                   \
        }                                                                                               \
    }

FOR_EACH_DTYPE(WRITE_KV_KERNEL)

// The same scatter into fp8 (e4m3) caches: each element rounded from the activation's value (fp8.cuh). Rows hold
// an even number of elements, so a thread stores two at a time.
#define WRITE_KV_FP8_KERNEL(suffix, T)                                                                   \
    extern "C" __global__ void write_kv_fp8_##suffix(unsigned char* k_cache, unsigned char* v_cache,     \
                                                     long long block_stride, int block_size, const T* k, \
                                                     long long k_stride, const T* v, long long v_stride, \
                                                     const long long* slots, int row) { pdl_begin();     \
        const long long slot = slots[blockIdx.x];                                                       \
        if (slot < 0) return;                                                                           \
        const long long dst = (slot / block_size) * block_stride + (slot % block_size) * (long long)row; \
        const T* ks = k + blockIdx.x * k_stride;                                                        \
        const T* vs = v + blockIdx.x * v_stride;                                                        \
        for (int i = 2 * threadIdx.x; i < row; i += 2 * blockDim.x) {                                   \
            const unsigned short k2 = f32x2_to_e4m3x2(to_f32(ks[i]), to_f32(ks[i + 1]));                \
            const unsigned short v2 = f32x2_to_e4m3x2(to_f32(vs[i]), to_f32(vs[i + 1]));                \
            *reinterpret_cast<unsigned short*>(k_cache + dst + i) = k2;                                 \
            *reinterpret_cast<unsigned short*>(v_cache + dst + i) = v2;                                 \
        }                                                                                               \
    }

FOR_EACH_DTYPE(WRITE_KV_FP8_KERNEL)
