// The first step of merging MLA's split decode (mla.cu): the states of a thread-block cluster's CTAs, each a split of
// one sequence's keys, merged over distributed shared memory, every CTA taking its own slice of the 512 latent
// columns; the result is the output rows, or the cluster's partial that decode_merge.cuh's merge_splits_if_last
// then merges with the sequence's other clusters, slice by slice.
#pragma once
#include "common.cuh"
#include "mma.cuh"       // pack_bf16x2
#include "cluster.cuh"
#include "mla_row.cuh"   // MLA_R

constexpr int MLA_MAX_CLUSTER = 8;     // CTAs of a decode cluster (the portable cluster size)

// A barrier over the cluster's CTAs, or the block's alone where the launch has no clusters (cs = 1)
__device__ __forceinline__ void mla_cluster_sync(int cs) {
    if (cs > 1) cluster_sync();
    else __syncthreads();
}

// Where a CTA's merged columns go: the output rows (a sequence of one cluster) or cluster `cluster`'s partial,
// slot `cluster` of the `slots` of each row.
struct MlaStore {
    bf16* out;
    float *part_o, *part_m, *part_l;   // part_m / part_l: this rank's copies
    int q0, row0, nh, b, cluster, slots, used;
};

// CTA q's copy of `local`, over distributed shared memory; a cluster of one reads its own, plainly
template <int CS, typename V>
__device__ __forceinline__ V mla_ld_rank(const V* local, int q) {
    if constexpr (CS == 1) return *local;
    else return ld_cluster(local, q);
}

// The states of the cluster's CS CTAs (O [row][512] unnormalised, m in log2 units, l; CTA q's in its shared
// memory at mo, mm, ml) merged over distributed shared memory: this CTA (rank) takes columns rank * 512 / CS ..
// of every row, weights exp2(m_q - M) (M the row's max over the cluster) summed in CTA order, so the bits do not
// depend on which CTA is where. A thread keeps MLA_MAX_CLUSTER remote loads in flight (MLA_MAX_CLUSTER / CS
// float4s of output). cw, cl: this CTA's scratch for the weights and sums. Call after mla_cluster_sync().
template <int ROWS, int CS>
__device__ __forceinline__ void mla_merge_cluster(const float* mo, const float* mm, const float* ml, float* cw,
                                                  float* cl, int gc, int rank, const MlaStore& st) {
    constexpr int WIDTH = MLA_R / CS, V = WIDTH / 4, PER = MLA_MAX_CLUSTER / CS;
    const int c0 = rank * WIDTH;
    if (threadIdx.x < gc) {
        const int g = threadIdx.x;
        float mq[CS], lq[CS], M = NEG_INF, lsum = 0.f;
#pragma unroll
        for (int q = 0; q < CS; ++q) {
            mq[q] = mla_ld_rank<CS>(mm + g, q);
            lq[q] = mla_ld_rank<CS>(ml + g, q);
        }
#pragma unroll
        for (int q = 0; q < CS; ++q) M = fmaxf(M, mq[q]);
#pragma unroll
        for (int q = 0; q < CS; ++q) {
            const float w = M == NEG_INF ? 0.f : exp2f(mq[q] - M);   // a cluster that saw no key: all 0
            cw[g * MLA_MAX_CLUSTER + q] = w;
            lsum += w * lq[q];
        }
        cl[g] = lsum;
        if (st.used > 1) {
            const long long p = ((long long)st.b * st.nh + st.row0 + g) * st.slots + st.cluster;
            __stcg(st.part_m + p, M);
            __stcg(st.part_l + p, lsum);
        }
    }
    __syncthreads();
    for (int i0 = threadIdx.x; i0 < gc * V; i0 += PER * blockDim.x) {
        float4 v[PER][CS];
#pragma unroll
        for (int k = 0; k < PER; ++k) {   // every load in flight before the first use
            const int idx = i0 + k * blockDim.x;
            if (idx < gc * V) {
                const float4* src = reinterpret_cast<const float4*>(mo + idx / V * MLA_R + c0 + 4 * (idx % V));
#pragma unroll
                for (int q = 0; q < CS; ++q) v[k][q] = mla_ld_rank<CS>(src, q);
            }
        }
#pragma unroll
        for (int k = 0; k < PER; ++k) {
            const int idx = i0 + k * blockDim.x, g = idx / V, c = c0 + 4 * (idx % V);
            if (idx >= gc * V) break;
            float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
            for (int q = 0; q < CS; ++q) {
                const float w = cw[g * MLA_MAX_CLUSTER + q];
                acc.x = fmaf(w, v[k][q].x, acc.x);
                acc.y = fmaf(w, v[k][q].y, acc.y);
                acc.z = fmaf(w, v[k][q].z, acc.z);
                acc.w = fmaf(w, v[k][q].w, acc.w);
            }
            const float lsum = cl[g];
            if (st.used == 1) {
                bf16* o = st.out + ((long long)st.q0 * st.nh + st.row0 + g) * MLA_R + c;
                *reinterpret_cast<uint2*>(o) = make_uint2(pack_bf16x2(acc.x / lsum, acc.y / lsum),
                                                          pack_bf16x2(acc.z / lsum, acc.w / lsum));
            } else {   // decode: row0 + g is the head
                const float inv = lsum > 0.f ? 1.f / lsum : 0.f;
                const long long p = ((long long)st.b * st.nh + st.row0 + g) * st.slots + st.cluster;
                __stcg(reinterpret_cast<float4*>(st.part_o + p * MLA_R + c),
                       make_float4(acc.x * inv, acc.y * inv, acc.z * inv, acc.w * inv));
            }
        }
    }
}
