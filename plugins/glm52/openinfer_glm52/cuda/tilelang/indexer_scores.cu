#if defined(_MSC_VER) && !defined(__clang__) && _MSC_VER < 1940
#define _tl_orig_alignas alignas
#define alignas(N) _tl_orig_alignas((N) <= 64 ? (N) : 64)
#include <cuda.h>
#undef alignas
#define alignas _tl_orig_alignas
#endif
#include <tl_templates/cuda/instruction/wgmma.h>
#include <tl_templates/cuda/intrin.h>
#include <tl_templates/cuda/barrier.h>
#include <math_constants.h>
#include <tl_templates/cuda/reduce.h>
#include <tl_templates/cuda/scan.h>
#include <tl_templates/cuda/ldsm.h>
#include <tl_templates/cuda/threadblock_swizzle.h>
#include <tl_templates/cuda/debug.h>
#ifdef ENABLE_BF16
#include <tl_templates/cuda/cuda_bf16_fallbacks.cuh>
#endif

extern "C" __global__ void indexer_scores(const int* BlockTable, const bfloat16_t* K, const int* Positions, const bfloat16_t* Q, float* Scores, const int* TokenSeq, const float* W, int block_rows, int block_size, int kv_rows, int n_seq, float scale, int t_n, int tw, int width);
extern "C" __global__ void __launch_bounds__(128, 1) indexer_scores(const int* BlockTable, const bfloat16_t* K, const int* Positions, const bfloat16_t* Q, float* Scores, const int* TokenSeq, const float* W, int block_rows, int block_size, int kv_rows, int n_seq, float scale, int t_n, int tw, int width) {
  extern __shared__ __align__(1024) uchar buf_dyn_shmem[];
  void* Q_shared = ((void*)((char*)buf_dyn_shmem + 0));
  void* w_shared = ((void*)((char*)buf_dyn_shmem + 8192));
  void* rows = ((void*)((char*)buf_dyn_shmem + 8320));
  void* K_shared = ((void*)((char*)buf_dyn_shmem + 9216));
  float acc[32];
  float score[4];
  cudaGridDependencySynchronize();
  cudaTriggerProgrammaticLaunchCompletion();
  int pos = Positions[((int64_t)((int)blockIdx.x))];
  int seq = TokenSeq[((int64_t)((int)blockIdx.x))];
  #pragma unroll
  for (int i = 0; i < 4; ++i) {
    *(uint4*)(((bfloat16_t*)Q_shared) + ((((((((((int)threadIdx.x) & 15) >> 3) * 2048) + (i * 512)) + ((((int)threadIdx.x) >> 4) * 64)) + ((((((int)threadIdx.x) >> 6) + ((((int)threadIdx.x) & 7) >> 2)) & 1) * 32)) + (((((((int)threadIdx.x) & 63) >> 5) + ((((int)threadIdx.x) & 3) >> 1)) & 1) * 16)) + (((((((int)threadIdx.x) & 31) >> 4) + (((int)threadIdx.x) & 1)) & 1) * 8))) = *(uint4*)(Q + (((((int64_t)((int)blockIdx.x)) * (int64_t)4096) + (((int64_t)i) * (int64_t)1024)) + (((int64_t)((int)threadIdx.x)) * (int64_t)8)));
  }
  if (((int)threadIdx.x) < 32) {
    ((float*)w_shared)[((int)threadIdx.x)] = W[((((int64_t)((int)blockIdx.x)) * (int64_t)32) + ((int64_t)((int)threadIdx.x)))];
  }
  int rmod = (min(((((int)blockIdx.y) * 128) + ((int)threadIdx.x)), pos) % block_size);
  int rdiv = (min(((((int)blockIdx.y) * 128) + ((int)threadIdx.x)), pos) / block_size);
  int rmod_1 = (min(((((int)blockIdx.y) * 128) + ((int)threadIdx.x)), pos) % block_size);
  int rdiv_1 = (min(((((int)blockIdx.y) * 128) + ((int)threadIdx.x)), pos) / block_size);
  int condval;
  if (((((0 <= ((((0 <= block_size) && (0 <= rmod)) || ((block_size < 0) && (rmod <= 0))) ? rdiv : (rdiv - 1))) && (((((0 <= block_size) && (0 <= rmod_1)) || ((block_size < 0) && (rmod_1 <= 0))) ? rdiv_1 : (rdiv_1 - 1)) < tw)) && (0 <= seq)) && (seq < n_seq))) {
    int64_t rmod_2 = (min(((((int64_t)((int)blockIdx.y)) * (int64_t)128) + ((int64_t)((int)threadIdx.x))), ((int64_t)pos)) % ((int64_t)block_size));
    int64_t rdiv_2 = (min(((((int64_t)((int)blockIdx.y)) * (int64_t)128) + ((int64_t)((int)threadIdx.x))), ((int64_t)pos)) / ((int64_t)block_size));
    int64_t rmod_3 = (min(((((int64_t)((int)blockIdx.y)) * (int64_t)128) + ((int64_t)((int)threadIdx.x))), ((int64_t)pos)) % ((int64_t)block_size));
    int64_t rdiv_3 = (min(((((int64_t)((int)blockIdx.y)) * (int64_t)128) + ((int64_t)((int)threadIdx.x))), ((int64_t)pos)) / ((int64_t)block_size));
    condval = BlockTable[((((int64_t)seq) * ((int64_t)tw)) + (((((int64_t)0 <= ((int64_t)block_size)) && ((int64_t)0 <= rmod_3)) || ((((int64_t)block_size) < (int64_t)0) && (rmod_3 <= (int64_t)0))) ? rdiv_3 : (rdiv_3 - (int64_t)1)))];
  } else {
    condval = 0;
  }
  int rmod_4 = (min(((((int)blockIdx.y) * 128) + ((int)threadIdx.x)), pos) % block_size);
  ((int*)rows)[((int)threadIdx.x)] = ((condval * block_rows) + ((((0 <= block_size) && (0 <= rmod_4)) || ((block_size < 0) && (rmod_4 <= 0))) ? rmod_4 : (rmod_4 + block_size)));
  __syncthreads();
  #pragma unroll
  for (int i_1 = 0; i_1 < 16; ++i_1) {
    bfloat16_t broadcast_var = bfloat16_t(0x0p+0f/*0.000000e+00*/);
    uint4 condval_1;
    if (((0 <= ((int*)rows)[((i_1 * 8) + (((int)threadIdx.x) >> 4))]) && (((int*)rows)[((i_1 * 8) + (((int)threadIdx.x) >> 4))] < kv_rows))) {
      condval_1 = *(uint4*)(K + ((((int64_t)((int*)rows)[((((int64_t)i_1) * (int64_t)8) + (((int64_t)((int)threadIdx.x)) >> (int64_t)4))]) * (int64_t)128) + ((((int64_t)((int)threadIdx.x)) & (int64_t)15) * (int64_t)8)));
    } else {
      condval_1 = make_uint4(__pack_nv_bfloat162(broadcast_var, broadcast_var), __pack_nv_bfloat162(broadcast_var, broadcast_var), __pack_nv_bfloat162(broadcast_var, broadcast_var), __pack_nv_bfloat162(broadcast_var, broadcast_var));
    }
    *(uint4*)(((bfloat16_t*)K_shared) + ((((((((((int)threadIdx.x) & 15) >> 3) * 8192) + (i_1 * 512)) + ((((int)threadIdx.x) >> 4) * 64)) + ((((((int)threadIdx.x) >> 6) + ((((int)threadIdx.x) & 7) >> 2)) & 1) * 32)) + (((((((int)threadIdx.x) & 63) >> 5) + ((((int)threadIdx.x) & 3) >> 1)) & 1) * 16)) + (((((((int)threadIdx.x) & 31) >> 4) + (((int)threadIdx.x) & 1)) & 1) * 8))) = condval_1;
  }
  #pragma unroll
  for (int i_2 = 0; i_2 < 8; ++i_2) {
    float broadcast_var_1 = 0x0p+0f/*0.000000e+00*/;
    *(float4*)(acc + (i_2 * 4)) = make_float4(broadcast_var_1, broadcast_var_1, broadcast_var_1, broadcast_var_1);
  }
  {
    tl::GmmaDescriptor desc_a;
    tl::GmmaDescriptor desc_b;
    __syncthreads();
    tl::initialize_wgmma_descriptor<1, 1, 64>(desc_a, (&(((bfloat16_t*)K_shared)[0])));
    tl::initialize_wgmma_descriptor<1, 1, 64>(desc_b, (&(((bfloat16_t*)Q_shared)[0])));
    tl::warpgroup_fence_operand(reinterpret_cast<float*>(acc + 0), 32);
    tl::warpgroup_arrive();
    tl::fence_proxy_async();
    #pragma unroll
    for (int i_3 = 0; i_3 < 2; ++i_3) {
      #pragma unroll
      for (int ki = 0; ki < 8; ++ki) {
        tl::wgmma_ss<tl::DataType::kBFloat16, tl::DataType::kBFloat16, tl::DataType::kFloat32, 64, 32, 16, false, false, 1, 1>(uint64_t(desc_a + (((((ki >> 2) * 16384) + (i_3 * 8192)) + ((ki & 3) * 32)) >> 4)), uint64_t(desc_b + ((((ki >> 2) * 4096) + ((ki & 3) * 32)) >> 4)), ((uint32_t*)(acc + (i_3 * 16))), 1);
      }
    }
    tl::warpgroup_commit_batch();
    tl::warpgroup_wait<0>();
    tl::warpgroup_fence_operand(reinterpret_cast<float*>(acc + 0), 32);
  }
  #pragma unroll
  for (int i_4 = 0; i_4 < 16; ++i_4) {
    float broadcast_var_2 = 0x0p+0f/*0.000000e+00*/;
    float2 __1;
      float2 v_ = *(float2*)(((float*)w_shared) + ((((i_4 & 7) >> 1) * 8) + ((((int)threadIdx.x) & 3) * 2)));
      float2 __2;
        float2 __3;
          float2 v__1 = *(float2*)(acc + (i_4 * 2));
          float2 v__2 = make_float2(scale, scale);
          __3.x = (v__1.x*v__2.x);
          __3.y = (v__1.y*v__2.y);
        float2 v__3 = make_float2(broadcast_var_2, broadcast_var_2);
        __2.x = max(__3.x, v__3.x);
        __2.y = max(__3.y, v__3.y);
      __1.x = (v_.x*__2.x);
      __1.y = (v_.y*__2.y);
    *(float2*)(acc + (i_4 * 2)) = __1;
  }
  #pragma unroll
  for (int i_5 = 0; i_5 < 4; ++i_5) {
    score[i_5] = 0x0p+0f/*0.000000e+00*/;
    #pragma unroll
    for (int rv = 0; rv < 8; ++rv) {
      score[i_5] = (score[i_5] + acc[(((((i_5 >> 1) * 16) + ((rv & 3) * 4)) + ((i_5 & 1) * 2)) + (rv >> 2))]);
    }
    score[i_5] = tl::AllReduce<tl::SumOp, 4, 1, 0, tl::NamedBarrier<128>>::run(score[i_5]);
  }
  if ((((int)threadIdx.x) % 4) == 0) {
    #pragma unroll
    for (int i_6 = 0; i_6 < 4; ++i_6) {
      if ((((((((int)blockIdx.y) * 128) + ((i_6 >> 1) * 64)) + ((((int)threadIdx.x) >> 5) * 16)) + ((i_6 & 1) * 8)) + ((((int)threadIdx.x) & 31) >> 2)) < width) {
        float condval_2;
        if (((((((((int)blockIdx.y) * 128) + ((i_6 >> 1) * 64)) + ((((int)threadIdx.x) >> 5) * 16)) + ((i_6 & 1) * 8)) + ((((int)threadIdx.x) & 31) >> 2)) <= pos)) {
          condval_2 = score[i_6];
        } else {
          condval_2 = -CUDART_INF_F;
        }
        Scores[((((((((int64_t)((int)blockIdx.y)) * (int64_t)128) + ((((int64_t)i_6) >> (int64_t)1) * (int64_t)64)) + ((((int64_t)((int)threadIdx.x)) >> (int64_t)5) * (int64_t)16)) + ((((int64_t)i_6) & (int64_t)1) * (int64_t)8)) + ((((int64_t)((int)threadIdx.x)) & (int64_t)31) >> (int64_t)2)) + (((int64_t)((int)blockIdx.x)) * ((int64_t)width)))] = condval_2;
      }
    }
  }
}

