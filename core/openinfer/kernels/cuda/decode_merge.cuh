// The last step of both split-KV decode kernels (attention.cu, attention_decode.cu): merge the block's
// NW warps' online-softmax states of its gc query heads and store the normalised rows (one split) or
// this split's partials (o, m, l) for paged_combine. Warp w's state of head g sits at row w * ROWS + g:
// max wm (log2 units), sum wl, unnormalised output wo[row * D ..]. Call after a __syncthreads().
#pragma once

template <typename T, int NW, int ROWS, int D>
__device__ __forceinline__ void store_merged_warps(const float* wm, const float* wl, const float* wo, int gc,
                                                   int head0, int nh, int q0, int b, int split, int num_splits,
                                                   T* out, float* part_o, float* part_m, float* part_l) {
    for (int idx = threadIdx.x; idx < gc * D; idx += blockDim.x) {
        const int g = idx / D, dd = idx % D, head = head0 + g;
        float M = NEG_INF, lsum = 0.f, o = 0.f;
#pragma unroll
        for (int w = 0; w < NW; ++w) M = fmaxf(M, wm[w * ROWS + g]);
        if (M != NEG_INF)
#pragma unroll
            for (int w = 0; w < NW; ++w) {
                const float f = exp2f(wm[w * ROWS + g] - M);
                lsum += f * wl[w * ROWS + g];
                o += f * wo[(w * ROWS + g) * D + dd];
            }
        if (num_splits == 1) {
            out[((long long)q0 * nh + head) * D + dd] = from_f32<T>(o / lsum);
        } else {
            const long long p = ((long long)b * nh + head) * num_splits + split;
            part_o[p * D + dd] = lsum > 0.f ? o / lsum : 0.f;
            if (dd == 0) { part_m[p] = M; part_l[p] = lsum; }
        }
    }
}
