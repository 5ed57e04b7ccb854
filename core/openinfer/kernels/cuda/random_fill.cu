// Random weights for `--load-format dummy`, drawn on the device in one pass of stores: element i of a
// tensor is mean + std * z_i, z_i a standard normal by Box-Muller from Philox4x32-10 (philox.cuh),
// counter (i / 4, its high word, 0, 0) under the tensor's key. A pure function of (key, i): no
// generator state to set up per tensor, no cuRAND library to load. Reference: philox.normals.
#include "common.cuh"
#include "philox.cuh"

// Two normals from two 32-bit words: the top 24 bits of each as a float uniform, u1 in (0, 1], u2 in [0, 1).
__device__ __forceinline__ void box_muller(unsigned int a, unsigned int b, float& z0, float& z1) {
    const float u1 = (float)((a >> 8) + 1u) * (1.0f / 16777216.0f);
    const float u2 = (float)(b >> 8) * (1.0f / 16777216.0f);
    const float r = sqrtf(-2.0f * logf(u1));
    float s, c;
    sincospif(2.0f * u2, &s, &c);
    z0 = r * c;
    z1 = r * s;
}

// out[i] = mean + std * z_i for i < n; each thread draws four elements per Philox call (grid-stride).
template <typename T>
__device__ void fill_normal(T* __restrict__ out, long long n, unsigned int k0, unsigned int k1, float mean,
                            float std) {
    pdl_begin();
    const long long groups = (n + 3) >> 2;
    for (long long g = blockIdx.x * (long long)blockDim.x + threadIdx.x; g < groups;
         g += (long long)gridDim.x * blockDim.x) {
        const Philox4 w = philox4x32_10((unsigned int)g, (unsigned int)(g >> 32), 0u, 0u, k0, k1);
        float z[4];
        box_muller(w.v[0], w.v[1], z[0], z[1]);
        box_muller(w.v[2], w.v[3], z[2], z[3]);
#pragma unroll
        for (int j = 0; j < 4; ++j)
            if (g * 4 + j < n) out[g * 4 + j] = from_f32<T>(mean + std * z[j]);
    }
}

#define FILL_KERNEL(suffix, T)                                                                          \
    extern "C" __global__ void fill_normal_##suffix(T* out, long long n, unsigned int k0, unsigned int k1, \
                                                    float mean, float std) {                            \
        fill_normal<T>(out, n, k0, k1, mean, std);                                                      \
    }

FOR_EACH_DTYPE(FILL_KERNEL)
