// Shared device helpers. NVRTC ships no cuda_bf16.h, so bf16 is a 16-bit storage type with
// explicit fp32 conversions: every kernel loads to float, computes in fp32 and rounds on store.
#pragma once

#define NEG_INF (-__int_as_float(0x7f800000))
#define POS_INF __int_as_float(0x7f800000)

struct bf16 { unsigned short bits; };

__device__ __forceinline__ float to_f32(float x) { return x; }
__device__ __forceinline__ float to_f32(bf16 x) { return __uint_as_float(((unsigned int)x.bits) << 16); }

template <typename T> __device__ __forceinline__ T from_f32(float x);
template <> __device__ __forceinline__ float from_f32<float>(float x) { return x; }
template <> __device__ __forceinline__ bf16 from_f32<bf16>(float x) {
    unsigned int u = __float_as_uint(x);
    bf16 r;
    if ((u & 0x7fffffffu) > 0x7f800000u) { r.bits = 0x7fc0; return r; }  // NaN stays a quiet NaN
    u += 0x7fffu + ((u >> 16) & 1u);                                      // round to nearest even
    r.bits = (unsigned short)(u >> 16);
    return r;
}

// Programmatic dependent launch: on sm_90+ module.launch may start a kernel while the previous kernel
// in the stream is still finishing, which hides launch latency and CTA ramp-up between the small
// kernels of a decode step. Every kernel calls pdl_begin() before it reads anything the previous kernel
// may write: griddepcontrol.wait returns once the previous grid has completed and its writes are visible,
// then launch_dependents lets the next kernel be scheduled. Launched without the attribute, both are no-ops.
// Since every kernel triggers only after its own wait, a kernel starts after the one two places back has
// completed: before its wait it may read what no kernel of the current step writes (weights, the step's
// inputs, a layer's KV of earlier tokens or its recurrent state), and the decode kernels do (gemv.cu,
// attention_decode.cu, the Qwen3.5 conv and delta-rule updates). A kernel must never trigger before its wait,
// and some thread of every grid must wait (CTAs may leave early, but never all of them), or the chain breaks.
__device__ __forceinline__ void pdl_wait() {
#if __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

__device__ __forceinline__ void pdl_trigger() {
#if __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

__device__ __forceinline__ void pdl_begin() {
    pdl_wait();
    pdl_trigger();
}
// A kernel of many CTAs streaming weights (gemv.cu, the grouped expert GEMMs of moe.cu and quant.cu) calls
// pdl_wait() first and pdl_trigger() only after its main loop: the next kernel's CTAs, launched at the trigger,
// would otherwise hold SM slots through the whole loop (measured slower for the GEMV, pdl.py).

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

// Reduce over the block (blockDim.x a multiple of 32, at most 1024) with a warp reduction and its
// identity; every thread gets the result.
template <float (*WARP)(float)>
__device__ __forceinline__ float block_reduce(float v, float identity) {
    __shared__ float partial[32];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
    v = WARP(v);
    __syncthreads();  // partial[] may still be read by a previous call
    if (lane == 0) partial[warp] = v;
    __syncthreads();
    return WARP(lane < nwarps ? partial[lane] : identity);
}
__device__ __forceinline__ float block_sum(float v) { return block_reduce<warp_sum>(v, 0.f); }
__device__ __forceinline__ float block_max(float v) { return block_reduce<warp_max>(v, NEG_INF); }

// 32-bit words of packed elements: attention moves K/V/Q rows as words (2 bf16 or 1 float each).
template <typename T> struct Pack;
template <> struct Pack<float> {
    static constexpr int N = 1;
    __device__ static void unpack(unsigned int w, float* f) { f[0] = __uint_as_float(w); }
    __device__ static unsigned int pack(const float* f) { return __float_as_uint(f[0]); }
};
template <> struct Pack<bf16> {
    static constexpr int N = 2;  // little-endian: element 0 in the low half
    __device__ static void unpack(unsigned int w, float* f) {
        f[0] = __uint_as_float(w << 16);
        f[1] = __uint_as_float(w & 0xffff0000u);
    }
    __device__ static unsigned int pack(const float* f) {
        return (unsigned int)from_f32<bf16>(f[0]).bits | ((unsigned int)from_f32<bf16>(f[1]).bits << 16);
    }
};

// V consecutive elements <-> floats. Where V elements fill whole 16-byte words they move as uint4 (the
// caller keeps the pointer 16-byte aligned); otherwise one element at a time. VEC<T> elements fill one word.
template <typename T> constexpr int VEC = 16 / sizeof(T);

template <int V, typename T>
__device__ __forceinline__ void load_f32(const T* __restrict__ p, float* f) {
    if constexpr (V * sizeof(T) % 16 == 0) {
#pragma unroll
        for (int k = 0; k < V / VEC<T>; ++k) {
            const uint4 word = reinterpret_cast<const uint4*>(p)[k];
            const T* e = reinterpret_cast<const T*>(&word);
#pragma unroll
            for (int j = 0; j < VEC<T>; ++j) f[k * VEC<T> + j] = to_f32(e[j]);
        }
    } else {
#pragma unroll
        for (int j = 0; j < V; ++j) f[j] = to_f32(p[j]);
    }
}

template <int V, typename T>
__device__ __forceinline__ void store_f32(T* __restrict__ p, const float* f) {
    if constexpr (V * sizeof(T) % 16 == 0) {
#pragma unroll
        for (int k = 0; k < V / VEC<T>; ++k) {
            uint4 word;
            T* e = reinterpret_cast<T*>(&word);
#pragma unroll
            for (int j = 0; j < VEC<T>; ++j) e[j] = from_f32<T>(f[k * VEC<T> + j]);
            reinterpret_cast<uint4*>(p)[k] = word;
        }
    } else {
#pragma unroll
        for (int j = 0; j < V; ++j) p[j] = from_f32<T>(f[j]);
    }
}

// SwiGLU's elementwise step in fp32: silu(gate) * up. One definition for silu_mul (elementwise.cu) and
// the GEMV epilogue that folds it in (gemv.cu), so the two give the same bits.
__device__ __forceinline__ float silu_mul_f32(float gate, float up) { return gate / (1.f + expf(-gate)) * up; }

// Where key t of a sequence sits in a paged cache: a [num_blocks, block_size, nkv, D] view with an
// arbitrary block stride (a layer's slice of the KV pool), rows packed inside a block.
struct KvLayout {
    long long block_stride, token_stride;
    int block_size;
    __device__ long long offset(const int* table, int t, int kvh, int d) const {
        return (long long)table[t / block_size] * block_stride + (long long)(t % block_size) * token_stride +
               (long long)kvh * d;
    }
};

// Instantiates KERNEL(suffix, T) for the two storage types; each expands to extern "C" entry points.
#define FOR_EACH_DTYPE(KERNEL) KERNEL(bf16, bf16) KERNEL(f32, float)

// Norm kernels: KERNEL(suffix, T, W) for activations T with weights W of the same type, and bf16
// activations with float32 weights (norm weights folded at load in fp32, like Qwen3.5's 1 + w,
// which bf16 would round to steps of 2^-7).
#define FOR_EACH_NORM_DTYPE(KERNEL) KERNEL(bf16, bf16, bf16) KERNEL(f32, float, float) KERNEL(bf16_wf32, bf16, float)
