// The block-wide best (value, index) pair, ordered by (value descending, index ascending) so ties
// pick the lowest index as numpy's argmax does. Shared by the sampling kernels.
#pragma once

#define NO_INDEX 0x7fffffff

__device__ __forceinline__ bool better(float v, int i, float bv, int bi) { return v > bv || (v == bv && i < bi); }

// The block's best (v, i); every thread gets it.
__device__ void block_best(float& v, int& i) {
    __shared__ float sv[32];
    __shared__ int si[32];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        const float ov = __shfl_xor_sync(0xffffffffu, v, o);
        const int oi = __shfl_xor_sync(0xffffffffu, i, o);
        if (better(ov, oi, v, i)) { v = ov; i = oi; }
    }
    __syncthreads();  // sv/si may still be read by a previous call
    if (lane == 0) { sv[warp] = v; si[warp] = i; }
    __syncthreads();
    v = lane < (int)(blockDim.x >> 5) ? sv[lane] : NEG_INF;
    i = lane < (int)(blockDim.x >> 5) ? si[lane] : NO_INDEX;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        const float ov = __shfl_xor_sync(0xffffffffu, v, o);
        const int oi = __shfl_xor_sync(0xffffffffu, i, o);
        if (better(ov, oi, v, i)) { v = ov; i = oi; }
    }
}

