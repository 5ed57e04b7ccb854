// Thread-block clusters (sm_90+): a barrier over every thread of the cluster's CTAs, and loads from another
// CTA's shared memory (distributed shared memory). Split reductions go through these instead of global
// partials, fences and arrival counters (gemv.cu's split-K, attention_decode.cu's split-KV).
// A kernel launched without cluster dims runs in clusters of one CTA: the barrier then spans the block.
#pragma once

__device__ __forceinline__ void cluster_sync() {
    asm volatile("barrier.cluster.arrive.release.aligned;\n\tbarrier.cluster.wait.acquire.aligned;" ::: "memory");
}

__device__ __forceinline__ unsigned int cluster_size() {   // CTAs in this CTA's cluster
    unsigned int n;
    asm("mov.u32 %0, %%cluster_nctarank;" : "=r"(n));
    return n;
}

__device__ __forceinline__ unsigned int cluster_remote(const void* local, int rank) {   // `local`'s twin in CTA `rank`
    const unsigned int addr = static_cast<unsigned int>(__cvta_generic_to_shared(local));
    unsigned int remote;
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(remote) : "r"(addr), "r"(rank));
    return remote;
}

__device__ __forceinline__ float ld_cluster(const float* local, int rank) {
    float v;
    asm volatile("ld.shared::cluster.f32 %0, [%1];" : "=f"(v) : "r"(cluster_remote(local, rank)) : "memory");
    return v;
}

__device__ __forceinline__ float4 ld_cluster(const float4* local, int rank) {
    float4 v;
    asm volatile("ld.shared::cluster.v4.f32 {%0,%1,%2,%3}, [%4];"
                 : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w) : "r"(cluster_remote(local, rank)) : "memory");
    return v;
}
