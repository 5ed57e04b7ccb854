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
#include <tl_templates/cuda/copy.h>
#include <math_constants.h>
#include <tl_templates/cuda/reduce.h>
#include <tl_templates/cuda/scan.h>
#include <tl_templates/cuda/ldsm.h>
#include <tl_templates/cuda/threadblock_swizzle.h>
#include <tl_templates/cuda/debug.h>
#ifdef ENABLE_BF16
#include <tl_templates/cuda/cuda_bf16_fallbacks.cuh>
#endif

extern "C" __global__ void sparse_mla(const bfloat16_t* KV, float* LsePart, float* OPart, const bfloat16_t* QL, const bfloat16_t* QP, const int* Rows, int heads, int kv_rows, int per, float scale, int splits, int t_n, int topk);
extern "C" __global__ void __launch_bounds__(256, 1) sparse_mla(const bfloat16_t* KV, float* LsePart, float* OPart, const bfloat16_t* QL, const bfloat16_t* QP, const int* Rows, int heads, int kv_rows, int per, float scale, int splits, int t_n, int topk) {
  extern __shared__ __align__(1024) uchar buf_dyn_shmem[];
  void* Q_shared = ((void*)((char*)buf_dyn_shmem + 0));
  void* QP_shared = ((void*)((char*)buf_dyn_shmem + 65536));
  void* KV_shared = ((void*)((char*)buf_dyn_shmem + 73728));
  void* KP_shared = ((void*)((char*)buf_dyn_shmem + 139264));
  void* S_shared = ((void*)((char*)buf_dyn_shmem + 147456));
  void* workspace = ((void*)((char*)buf_dyn_shmem + 155648));
  void* workspace_1 = ((void*)((char*)buf_dyn_shmem + 156672));
  void* workspace_2 = ((void*)((char*)buf_dyn_shmem + 157696));
  void* workspace_3 = ((void*)((char*)buf_dyn_shmem + 158720));
  float acc_o[128];
  float sumexp[2];
  float m_i[2];
  signed char mask[8];
  float acc_s[16];
  float m_i_prev[2];
  float alpha[2];
  float sumexp_i[2];
  float m_i_clear[2];
  float m_i_clear_1[2];
  cudaGridDependencySynchronize();
  cudaTriggerProgrammaticLaunchCompletion();
  #pragma unroll
  for (int i = 0; i < 16; ++i) {
    bfloat16_t broadcast_var = bfloat16_t(0x0p+0f/*0.000000e+00*/);
    uint4 condval;
    if (((((((int)blockIdx.y) * 64) + (i * 4)) + (((int)threadIdx.x) >> 6)) < heads)) {
      condval = *(uint4*)(QL + (((min((((((int64_t)((int)blockIdx.y)) * (int64_t)64) + (((int64_t)i) * (int64_t)4)) + (((int64_t)((int)threadIdx.x)) >> (int64_t)6)), (((int64_t)heads) - (int64_t)1)) * (int64_t)512) + ((((int64_t)((int)blockIdx.x)) * ((int64_t)heads)) * (int64_t)512)) + ((((int64_t)((int)threadIdx.x)) & (int64_t)63) * (int64_t)8)));
    } else {
      condval = make_uint4(__pack_nv_bfloat162(broadcast_var, broadcast_var), __pack_nv_bfloat162(broadcast_var, broadcast_var), __pack_nv_bfloat162(broadcast_var, broadcast_var), __pack_nv_bfloat162(broadcast_var, broadcast_var));
    }
    *(uint4*)(((bfloat16_t*)Q_shared) + ((((((((((int)threadIdx.x) & 63) >> 3) * 4096) + (i * 256)) + ((((int)threadIdx.x) >> 6) * 64)) + (((((((int)threadIdx.x) & 7) >> 2) + (i & 1)) & 1) * 32)) + ((((((int)threadIdx.x) >> 7) + ((((int)threadIdx.x) & 3) >> 1)) & 1) * 16)) + (((((((int)threadIdx.x) & 127) >> 6) + (((int)threadIdx.x) & 1)) & 1) * 8))) = condval;
  }
  #pragma unroll
  for (int i_1 = 0; i_1 < 2; ++i_1) {
    bfloat16_t broadcast_var_1 = bfloat16_t(0x0p+0f/*0.000000e+00*/);
    uint4 condval_1;
    if (((((((int)blockIdx.y) * 64) + (i_1 * 32)) + (((int)threadIdx.x) >> 3)) < heads)) {
      condval_1 = *(uint4*)(QP + (((min((((((int64_t)((int)blockIdx.y)) * (int64_t)64) + (((int64_t)i_1) * (int64_t)32)) + (((int64_t)((int)threadIdx.x)) >> (int64_t)3)), (((int64_t)heads) - (int64_t)1)) * (int64_t)64) + ((((int64_t)((int)blockIdx.x)) * ((int64_t)heads)) * (int64_t)64)) + ((((int64_t)((int)threadIdx.x)) & (int64_t)7) * (int64_t)8)));
    } else {
      condval_1 = make_uint4(__pack_nv_bfloat162(broadcast_var_1, broadcast_var_1), __pack_nv_bfloat162(broadcast_var_1, broadcast_var_1), __pack_nv_bfloat162(broadcast_var_1, broadcast_var_1), __pack_nv_bfloat162(broadcast_var_1, broadcast_var_1));
    }
    *(uint4*)(((bfloat16_t*)QP_shared) + (((((i_1 * 2048) + ((((int)threadIdx.x) >> 3) * 64)) + (((((((int)threadIdx.x) & 63) >> 5) + ((((int)threadIdx.x) & 7) >> 2)) & 1) * 32)) + (((((((int)threadIdx.x) & 31) >> 4) + ((((int)threadIdx.x) & 3) >> 1)) & 1) * 16)) + (((((((int)threadIdx.x) & 15) >> 3) + (((int)threadIdx.x) & 1)) & 1) * 8))) = condval_1;
  }
  __syncthreads();
  for (int sp = 0; sp < per; ++sp) {
    #pragma unroll
    for (int i_2 = 0; i_2 < 32; ++i_2) {
      float broadcast_var_2 = 0x0p+0f/*0.000000e+00*/;
      *(float4*)(acc_o + (i_2 * 4)) = make_float4(broadcast_var_2, broadcast_var_2, broadcast_var_2, broadcast_var_2);
    }
    float broadcast_var_3 = 0x0p+0f/*0.000000e+00*/;
    *(float2*)(sumexp + 0) = make_float2(broadcast_var_3, broadcast_var_3);
    float broadcast_var_4 = -0x1p+30f/*-1.073742e+09*/;
    *(float2*)(m_i + 0) = make_float2(broadcast_var_4, broadcast_var_4);
    int rmod = (((((((topk + 63) >> 6) + splits) - (((int)blockIdx.z) * per)) - sp) - 1) % splits);
    int rdiv = (((((((topk + 63) >> 6) + splits) - (((int)blockIdx.z) * per)) - sp) - 1) / splits);
    if (0 < ((((0 <= splits) && (0 <= rmod)) || ((splits < 0) && (rmod <= 0))) ? rdiv : (rdiv - 1))) {
      #pragma unroll
      for (int i_3 = 0; i_3 < 2; ++i_3) {
        tl::cp_async_gs_conditional<16>((&(((bfloat16_t*)KP_shared)[(((((i_3 * 2048) + ((((int)threadIdx.x) >> 3) * 64)) + (((((((int)threadIdx.x) & 63) >> 5) + ((((int)threadIdx.x) & 7) >> 2)) & 1) * 32)) + (((((((int)threadIdx.x) & 31) >> 4) + ((((int)threadIdx.x) & 3) >> 1)) & 1) * 16)) + (((((((int)threadIdx.x) & 15) >> 3) + (((int)threadIdx.x) & 1)) & 1) * 8))])), (&(KV[(((max(((int64_t)Rows[(min((((((((int64_t)((int)blockIdx.z)) * ((int64_t)per)) * (int64_t)64) + (((int64_t)sp) * (int64_t)64)) + (((int64_t)i_3) * (int64_t)32)) + (((int64_t)((int)threadIdx.x)) >> (int64_t)3)), (((int64_t)topk) - (int64_t)1)) + (((int64_t)((int)blockIdx.x)) * ((int64_t)topk)))]), (int64_t)0) * (int64_t)576) + ((((int64_t)((int)threadIdx.x)) & (int64_t)7) * (int64_t)8)) + (int64_t)512)])), ((Rows[(min((((((((int64_t)((int)blockIdx.z)) * ((int64_t)per)) * (int64_t)64) + (((int64_t)sp) * (int64_t)64)) + (((int64_t)i_3) * (int64_t)32)) + (((int64_t)((int)threadIdx.x)) >> (int64_t)3)), (((int64_t)topk) - (int64_t)1)) + (((int64_t)((int)blockIdx.x)) * ((int64_t)topk)))] < kv_rows) && (0 < kv_rows)));
      }
      tl::cp_async_commit();
    }
    __syncthreads();
    int rmod_1 = (((((((topk + 63) >> 6) + splits) - (((int)blockIdx.z) * per)) - sp) - 1) % splits);
    int rdiv_1 = (((((((topk + 63) >> 6) + splits) - (((int)blockIdx.z) * per)) - sp) - 1) / splits);
    if (0 < ((((0 <= splits) && (0 <= rmod_1)) || ((splits < 0) && (rmod_1 <= 0))) ? rdiv_1 : (rdiv_1 - 1))) {
      #pragma unroll
      for (int i_4 = 0; i_4 < 16; ++i_4) {
        tl::cp_async_gs_conditional<16>((&(((bfloat16_t*)KV_shared)[((((((((((int)threadIdx.x) & 63) >> 3) * 4096) + (i_4 * 256)) + ((((int)threadIdx.x) >> 6) * 64)) + (((((((int)threadIdx.x) & 7) >> 2) + (i_4 & 1)) & 1) * 32)) + ((((((int)threadIdx.x) >> 7) + ((((int)threadIdx.x) & 3) >> 1)) & 1) * 16)) + (((((((int)threadIdx.x) & 127) >> 6) + (((int)threadIdx.x) & 1)) & 1) * 8))])), (&(KV[((max(((int64_t)Rows[(min((((((((int64_t)((int)blockIdx.z)) * ((int64_t)per)) * (int64_t)64) + (((int64_t)sp) * (int64_t)64)) + (((int64_t)i_4) * (int64_t)4)) + (((int64_t)((int)threadIdx.x)) >> (int64_t)6)), (((int64_t)topk) - (int64_t)1)) + (((int64_t)((int)blockIdx.x)) * ((int64_t)topk)))]), (int64_t)0) * (int64_t)576) + ((((int64_t)((int)threadIdx.x)) & (int64_t)63) * (int64_t)8))])), ((Rows[(min((((((((int64_t)((int)blockIdx.z)) * ((int64_t)per)) * (int64_t)64) + (((int64_t)sp) * (int64_t)64)) + (((int64_t)i_4) * (int64_t)4)) + (((int64_t)((int)threadIdx.x)) >> (int64_t)6)), (((int64_t)topk) - (int64_t)1)) + (((int64_t)((int)blockIdx.x)) * ((int64_t)topk)))] < kv_rows) && (0 < kv_rows)));
      }
      tl::cp_async_commit();
    }
    int rmod_2 = (((((((topk + 63) >> 6) + splits) - (((int)blockIdx.z) * per)) - sp) - 1) % splits);
    int rdiv_2 = (((((((topk + 63) >> 6) + splits) - (((int)blockIdx.z) * per)) - sp) - 1) / splits);
    for (int j = 0; j < (((((0 <= splits) && (0 <= rmod_2)) || ((splits < 0) && (rmod_2 <= 0))) ? rdiv_2 : (rdiv_2 - 1)) - 1); ++j) {
      #pragma unroll
      for (int i_5 = 0; i_5 < 8; ++i_5) {
        int condval_2;
        if ((1 <= topk)) {
          condval_2 = Rows[(min(((((((((((int64_t)((int)blockIdx.z)) * ((int64_t)per)) * (int64_t)64) + (((int64_t)sp) * (int64_t)64)) + ((((int64_t)j) * ((int64_t)splits)) * (int64_t)64)) + ((((int64_t)((int)threadIdx.x)) >> (int64_t)7) * (int64_t)32)) + ((((int64_t)i_5) >> (int64_t)1) * (int64_t)8)) + ((((int64_t)((int)threadIdx.x)) & (int64_t)3) * (int64_t)2)) + (((int64_t)i_5) & (int64_t)1)), (((int64_t)topk) - (int64_t)1)) + (((int64_t)((int)blockIdx.x)) * ((int64_t)topk)))];
        } else {
          condval_2 = 0;
        }
        mask[i_5] = ((signed char)((((((((((((int)blockIdx.z) * per) * 64) + (sp * 64)) + ((j * splits) * 64)) + ((((int)threadIdx.x) >> 7) * 32)) + ((i_5 >> 1) * 8)) + ((((int)threadIdx.x) & 3) * 2)) + (i_5 & 1)) < topk) && (0 <= condval_2)));
      }
      #pragma unroll
      for (int i_6 = 0; i_6 < 16; ++i_6) {
        float condval_3;
        if (((bool)mask[(((i_6 >> 2) * 2) + (i_6 & 1))])) {
          condval_3 = 0x0p+0f/*0.000000e+00*/;
        } else {
          condval_3 = -CUDART_INF_F;
        }
        acc_s[i_6] = condval_3;
      }
      tl::cp_async_wait<0>();
      __syncthreads();
      {
        tl::GmmaDescriptor desc_a;
        tl::GmmaDescriptor desc_b;
        tl::initialize_wgmma_descriptor<1, 1, 64>(desc_a, (&(((bfloat16_t*)Q_shared)[0])));
        tl::initialize_wgmma_descriptor<1, 1, 64>(desc_b, (&(((bfloat16_t*)KV_shared)[0])));
        tl::warpgroup_fence_operand(reinterpret_cast<float*>(acc_s + 0), 16);
        tl::warpgroup_arrive();
        tl::fence_proxy_async();
        #pragma unroll
        for (int ki = 0; ki < 32; ++ki) {
          tl::wgmma_ss<tl::DataType::kBFloat16, tl::DataType::kBFloat16, tl::DataType::kFloat32, 64, 32, 16, false, false, 1, 1>(uint64_t(desc_a + ((((ki >> 2) * 8192) + ((ki & 3) * 32)) >> 4)), uint64_t(desc_b + (((((ki >> 2) * 8192) + ((((int)threadIdx.x) >> 7) * 4096)) + ((ki & 3) * 32)) >> 4)), ((uint32_t*)(acc_s + 0)), 1);
        }
        tl::warpgroup_commit_batch();
        tl::warpgroup_wait<0>();
        tl::warpgroup_fence_operand(reinterpret_cast<float*>(acc_s + 0), 16);
      }
      tl::cp_async_wait<1>();
      __syncthreads();
      {
        tl::GmmaDescriptor desc_a_1;
        tl::GmmaDescriptor desc_b_1;
        tl::initialize_wgmma_descriptor<1, 1, 64>(desc_a_1, (&(((bfloat16_t*)QP_shared)[0])));
        tl::initialize_wgmma_descriptor<1, 1, 64>(desc_b_1, (&(((bfloat16_t*)KP_shared)[0])));
        tl::warpgroup_fence_operand(reinterpret_cast<float*>(acc_s + 0), 16);
        tl::warpgroup_arrive();
        #pragma unroll
        for (int ki_1 = 0; ki_1 < 4; ++ki_1) {
          tl::wgmma_ss<tl::DataType::kBFloat16, tl::DataType::kBFloat16, tl::DataType::kFloat32, 64, 32, 16, false, false, 1, 1>(uint64_t(desc_a_1 + ((ki_1 * 32) >> 4)), uint64_t(desc_b_1 + ((((((int)threadIdx.x) >> 7) * 4096) + (ki_1 * 32)) >> 4)), ((uint32_t*)(acc_s + 0)), 1);
        }
        tl::warpgroup_commit_batch();
        tl::warpgroup_wait<0>();
        tl::warpgroup_fence_operand(reinterpret_cast<float*>(acc_s + 0), 16);
      }
      __syncthreads();
      #pragma unroll
      for (int i_7 = 0; i_7 < 2; ++i_7) {
        tl::cp_async_gs_conditional<16>((&(((bfloat16_t*)KP_shared)[(((((i_7 * 2048) + ((((int)threadIdx.x) >> 3) * 64)) + (((((((int)threadIdx.x) & 63) >> 5) + ((((int)threadIdx.x) & 7) >> 2)) & 1) * 32)) + (((((((int)threadIdx.x) & 31) >> 4) + ((((int)threadIdx.x) & 3) >> 1)) & 1) * 16)) + (((((((int)threadIdx.x) & 15) >> 3) + (((int)threadIdx.x) & 1)) & 1) * 8))])), (&(KV[(((max(((int64_t)Rows[(min(((((((((int64_t)((int)blockIdx.z)) * ((int64_t)per)) * (int64_t)64) + (((int64_t)sp) * (int64_t)64)) + (((((int64_t)j) + (int64_t)1) * ((int64_t)splits)) * (int64_t)64)) + (((int64_t)i_7) * (int64_t)32)) + (((int64_t)((int)threadIdx.x)) >> (int64_t)3)), (((int64_t)topk) - (int64_t)1)) + (((int64_t)((int)blockIdx.x)) * ((int64_t)topk)))]), (int64_t)0) * (int64_t)576) + ((((int64_t)((int)threadIdx.x)) & (int64_t)7) * (int64_t)8)) + (int64_t)512)])), ((Rows[(min(((((((((int64_t)((int)blockIdx.z)) * ((int64_t)per)) * (int64_t)64) + (((int64_t)sp) * (int64_t)64)) + (((((int64_t)j) + (int64_t)1) * ((int64_t)splits)) * (int64_t)64)) + (((int64_t)i_7) * (int64_t)32)) + (((int64_t)((int)threadIdx.x)) >> (int64_t)3)), (((int64_t)topk) - (int64_t)1)) + (((int64_t)((int)blockIdx.x)) * ((int64_t)topk)))] < kv_rows) && (0 < kv_rows)));
      }
      tl::cp_async_commit();
      *(float2*)(m_i_prev + 0) = *(float2*)(m_i + 0);
      #pragma unroll
      for (int i_8 = 0; i_8 < 2; ++i_8) {
        m_i_clear[i_8] = -CUDART_INF_F;
        #pragma unroll
        for (int rv = 0; rv < 8; ++rv) {
          m_i_clear[i_8] = max(m_i_clear[i_8], acc_s[((((rv & 3) * 4) + (i_8 * 2)) + (rv >> 2))]);
        }
        __syncthreads();
        m_i_clear[i_8] = tl::AllReduce<tl::MaxOp, 256, 128, 0, tl::NamedBarrier<256>>::run(m_i_clear[i_8], (&(((float*)workspace_3)[0])));
        m_i_clear[i_8] = tl::AllReduce<tl::MaxOp, 4, 1, 0, tl::NamedBarrier<256>>::run(m_i_clear[i_8]);
        m_i[i_8] = max(m_i[i_8], m_i_clear[i_8]);
      }
      float2 __1;
        float2 v_ = *(float2*)(m_i + 0);
        float2 v__1 = *(float2*)(m_i_prev + 0);
        __1.x = max(v_.x, v__1.x);
        __1.y = max(v_.y, v__1.y);
      *(float2*)(m_i + 0) = __1;
      float2 __2;
      float2 __3;
        float2 __4;
          float2 v__2 = *(float2*)(m_i_prev + 0);
          float2 v__3 = *(float2*)(m_i + 0);
          __4.x = (v__2.x-v__3.x);
          __4.y = (v__2.y-v__3.y);
        float2 v__4 = make_float2((scale * 0x1.71547652b82fep+0f/*1.442695e+00*/), (scale * 0x1.71547652b82fep+0f/*1.442695e+00*/));
        __3.x = (__4.x*v__4.x);
        __3.y = (__4.y*v__4.y);
      __2.x = exp2f(__3.x);
      __2.y = exp2f(__3.y);
      *(float2*)(alpha + 0) = __2;
      #pragma unroll
      for (int i_9 = 0; i_9 < 8; ++i_9) {
        float2 __5;
        float2 __6;
          float2 __7;
            float2 v__5 = *(float2*)(acc_s + (i_9 * 2));
            float2 v__6 = make_float2((scale * 0x1.71547652b82fep+0f/*1.442695e+00*/), (scale * 0x1.71547652b82fep+0f/*1.442695e+00*/));
            __7.x = (v__5.x*v__6.x);
            __7.y = (v__5.y*v__6.y);
          float2 v__7 = make_float2((m_i[(i_9 & 1)] * (scale * 0x1.71547652b82fep+0f/*1.442695e+00*/)), (m_i[(i_9 & 1)] * (scale * 0x1.71547652b82fep+0f/*1.442695e+00*/)));
          __6.x = (__7.x-v__7.x);
          __6.y = (__7.y-v__7.y);
        __5.x = exp2f(__6.x);
        __5.y = exp2f(__6.y);
        *(float2*)(acc_s + (i_9 * 2)) = __5;
      }
      #pragma unroll
      for (int i_10 = 0; i_10 < 2; ++i_10) {
        sumexp_i[i_10] = 0x0p+0f/*0.000000e+00*/;
        #pragma unroll
        for (int rv_1 = 0; rv_1 < 8; ++rv_1) {
          sumexp_i[i_10] = (sumexp_i[i_10] + acc_s[((((rv_1 & 3) * 4) + (i_10 * 2)) + (rv_1 >> 2))]);
        }
        __syncthreads();
        sumexp_i[i_10] = tl::AllReduce<tl::SumOp, 256, 128, 0, tl::NamedBarrier<256>>::run(sumexp_i[i_10], (&(((float*)workspace_1)[0])));
        sumexp_i[i_10] = tl::AllReduce<tl::SumOp, 4, 1, 0, tl::NamedBarrier<256>>::run(sumexp_i[i_10]);
      }
      float2 __8;
        float2 __9;
          float2 v__8 = *(float2*)(sumexp + 0);
          float2 v__9 = *(float2*)(alpha + 0);
          __9.x = (v__8.x*v__9.x);
          __9.y = (v__8.y*v__9.y);
        float2 v__10 = *(float2*)(sumexp_i + 0);
        __8.x = (__9.x+v__10.x);
        __8.y = (__9.y+v__10.y);
      *(float2*)(sumexp + 0) = __8;
      #pragma unroll
      for (int i_11 = 0; i_11 < 64; ++i_11) {
        float2 __10;
          float2 v__11 = *(float2*)(acc_o + (i_11 * 2));
          float2 v__12 = make_float2(alpha[(i_11 & 1)], alpha[(i_11 & 1)]);
          __10.x = (v__11.x*v__12.x);
          __10.y = (v__11.y*v__12.y);
        *(float2*)(acc_o + (i_11 * 2)) = __10;
      }
      __syncthreads();
      #pragma unroll
      for (int i_12 = 0; i_12 < 2; ++i_12) {
        tl::ptx_stmatrix_m8n8_x4((&(((bfloat16_t*)S_shared)[(((((((((int)threadIdx.x) & 127) >> 5) * 1024) + ((((int)threadIdx.x) & 15) * 64)) + ((((((int)threadIdx.x) >> 7) + ((((int)threadIdx.x) & 7) >> 2)) & 1) * 32)) + (((((((int)threadIdx.x) & 3) >> 1) + i_12) & 1) * 16)) + (((((((int)threadIdx.x) & 31) >> 4) + (((int)threadIdx.x) & 1)) & 1) * 8))])), __pack_half2(((bfloat16_t)acc_s[(i_12 * 8)]), ((bfloat16_t)acc_s[((i_12 * 8) + 1)])), __pack_half2(((bfloat16_t)acc_s[((i_12 * 8) + 2)]), ((bfloat16_t)acc_s[((i_12 * 8) + 3)])), __pack_half2(((bfloat16_t)acc_s[((i_12 * 8) + 4)]), ((bfloat16_t)acc_s[((i_12 * 8) + 5)])), __pack_half2(((bfloat16_t)acc_s[((i_12 * 8) + 6)]), ((bfloat16_t)acc_s[((i_12 * 8) + 7)])));
      }
      {
        tl::GmmaDescriptor desc_a_2;
        tl::GmmaDescriptor desc_b_2;
        __syncthreads();
        tl::initialize_wgmma_descriptor<1, 1, 64>(desc_a_2, (&(((bfloat16_t*)S_shared)[0])));
        tl::initialize_wgmma_descriptor<1, 512, 64>(desc_b_2, (&(((bfloat16_t*)KV_shared)[0])));
        tl::warpgroup_fence_operand(reinterpret_cast<float*>(acc_o + 0), 128);
        tl::warpgroup_arrive();
        tl::fence_proxy_async();
        #pragma unroll
        for (int ki_2 = 0; ki_2 < 4; ++ki_2) {
          tl::wgmma_ss<tl::DataType::kBFloat16, tl::DataType::kBFloat16, tl::DataType::kFloat32, 64, 256, 16, false, true, 1, 1>(uint64_t(desc_a_2 + ((ki_2 * 32) >> 4)), uint64_t(desc_b_2 + ((((((int)threadIdx.x) >> 7) * 32768) + (ki_2 * 2048)) >> 4)), ((uint32_t*)(acc_o + 0)), 1);
        }
        tl::warpgroup_commit_batch();
        tl::warpgroup_wait<0>();
        tl::warpgroup_fence_operand(reinterpret_cast<float*>(acc_o + 0), 128);
      }
      __syncthreads();
      #pragma unroll
      for (int i_13 = 0; i_13 < 16; ++i_13) {
        tl::cp_async_gs_conditional<16>((&(((bfloat16_t*)KV_shared)[((((((((((int)threadIdx.x) & 63) >> 3) * 4096) + (i_13 * 256)) + ((((int)threadIdx.x) >> 6) * 64)) + (((((((int)threadIdx.x) & 7) >> 2) + (i_13 & 1)) & 1) * 32)) + ((((((int)threadIdx.x) >> 7) + ((((int)threadIdx.x) & 3) >> 1)) & 1) * 16)) + (((((((int)threadIdx.x) & 127) >> 6) + (((int)threadIdx.x) & 1)) & 1) * 8))])), (&(KV[((max(((int64_t)Rows[(min(((((((((int64_t)((int)blockIdx.z)) * ((int64_t)per)) * (int64_t)64) + (((int64_t)sp) * (int64_t)64)) + (((((int64_t)j) + (int64_t)1) * ((int64_t)splits)) * (int64_t)64)) + (((int64_t)i_13) * (int64_t)4)) + (((int64_t)((int)threadIdx.x)) >> (int64_t)6)), (((int64_t)topk) - (int64_t)1)) + (((int64_t)((int)blockIdx.x)) * ((int64_t)topk)))]), (int64_t)0) * (int64_t)576) + ((((int64_t)((int)threadIdx.x)) & (int64_t)63) * (int64_t)8))])), ((Rows[(min(((((((((int64_t)((int)blockIdx.z)) * ((int64_t)per)) * (int64_t)64) + (((int64_t)sp) * (int64_t)64)) + (((((int64_t)j) + (int64_t)1) * ((int64_t)splits)) * (int64_t)64)) + (((int64_t)i_13) * (int64_t)4)) + (((int64_t)((int)threadIdx.x)) >> (int64_t)6)), (((int64_t)topk) - (int64_t)1)) + (((int64_t)((int)blockIdx.x)) * ((int64_t)topk)))] < kv_rows) && (0 < kv_rows)));
      }
      tl::cp_async_commit();
    }
    int rmod_3 = (((((((topk + 63) >> 6) + splits) - (((int)blockIdx.z) * per)) - sp) - 1) % splits);
    int rdiv_3 = (((((((topk + 63) >> 6) + splits) - (((int)blockIdx.z) * per)) - sp) - 1) / splits);
    if (1 <= ((((0 <= splits) && (0 <= rmod_3)) || ((splits < 0) && (rmod_3 <= 0))) ? rdiv_3 : (rdiv_3 - 1))) {
      #pragma unroll
      for (int i_14 = 0; i_14 < 8; ++i_14) {
        int rmod_4 = (((((((topk + 63) >> 6) + splits) - (((int)blockIdx.z) * per)) - sp) - 1) % splits);
        int rdiv_4 = (((((((topk + 63) >> 6) + splits) - (((int)blockIdx.z) * per)) - sp) - 1) / splits);
        int condval_4;
        if ((1 <= topk)) {
          int64_t rmod_5 = (((((((((int64_t)topk) + (int64_t)63) >> (int64_t)6) + ((int64_t)splits)) - (((int64_t)((int)blockIdx.z)) * ((int64_t)per))) - ((int64_t)sp)) - (int64_t)1) % ((int64_t)splits));
          int64_t rdiv_5 = (((((((((int64_t)topk) + (int64_t)63) >> (int64_t)6) + ((int64_t)splits)) - (((int64_t)((int)blockIdx.z)) * ((int64_t)per))) - ((int64_t)sp)) - (int64_t)1) / ((int64_t)splits));
          int64_t rmod_6 = (((((((((int64_t)topk) + (int64_t)63) >> (int64_t)6) + ((int64_t)splits)) - (((int64_t)((int)blockIdx.z)) * ((int64_t)per))) - ((int64_t)sp)) - (int64_t)1) % ((int64_t)splits));
          int64_t rdiv_6 = (((((((((int64_t)topk) + (int64_t)63) >> (int64_t)6) + ((int64_t)splits)) - (((int64_t)((int)blockIdx.z)) * ((int64_t)per))) - ((int64_t)sp)) - (int64_t)1) / ((int64_t)splits));
          condval_4 = Rows[(min(((((((((((int64_t)((int)blockIdx.z)) * ((int64_t)per)) * (int64_t)64) + (((int64_t)sp) * (int64_t)64)) + ((((((((int64_t)0 <= ((int64_t)splits)) && ((int64_t)0 <= rmod_6)) || ((((int64_t)splits) < (int64_t)0) && (rmod_6 <= (int64_t)0))) ? rdiv_6 : (rdiv_6 - (int64_t)1)) - (int64_t)1) * ((int64_t)splits)) * (int64_t)64)) + ((((int64_t)((int)threadIdx.x)) >> (int64_t)7) * (int64_t)32)) + ((((int64_t)i_14) >> (int64_t)1) * (int64_t)8)) + ((((int64_t)((int)threadIdx.x)) & (int64_t)3) * (int64_t)2)) + (((int64_t)i_14) & (int64_t)1)), (((int64_t)topk) - (int64_t)1)) + (((int64_t)((int)blockIdx.x)) * ((int64_t)topk)))];
        } else {
          condval_4 = 0;
        }
        mask[i_14] = ((signed char)((((((((((((int)blockIdx.z) * per) * 64) + (sp * 64)) + (((((((0 <= splits) && (0 <= rmod_4)) || ((splits < 0) && (rmod_4 <= 0))) ? rdiv_4 : (rdiv_4 - 1)) - 1) * splits) * 64)) + ((((int)threadIdx.x) >> 7) * 32)) + ((i_14 >> 1) * 8)) + ((((int)threadIdx.x) & 3) * 2)) + (i_14 & 1)) < topk) && (0 <= condval_4)));
      }
      #pragma unroll
      for (int i_15 = 0; i_15 < 16; ++i_15) {
        float condval_5;
        if (((bool)mask[(((i_15 >> 2) * 2) + (i_15 & 1))])) {
          condval_5 = 0x0p+0f/*0.000000e+00*/;
        } else {
          condval_5 = -CUDART_INF_F;
        }
        acc_s[i_15] = condval_5;
      }
    }
    tl::cp_async_wait<0>();
    __syncthreads();
    int rmod_7 = (((((((topk + 63) >> 6) + splits) - (((int)blockIdx.z) * per)) - sp) - 1) % splits);
    int rdiv_7 = (((((((topk + 63) >> 6) + splits) - (((int)blockIdx.z) * per)) - sp) - 1) / splits);
    if (1 <= ((((0 <= splits) && (0 <= rmod_7)) || ((splits < 0) && (rmod_7 <= 0))) ? rdiv_7 : (rdiv_7 - 1))) {
      {
        tl::GmmaDescriptor desc_a_3;
        tl::GmmaDescriptor desc_b_3;
        tl::initialize_wgmma_descriptor<1, 1, 64>(desc_a_3, (&(((bfloat16_t*)Q_shared)[0])));
        tl::initialize_wgmma_descriptor<1, 1, 64>(desc_b_3, (&(((bfloat16_t*)KV_shared)[0])));
        tl::warpgroup_fence_operand(reinterpret_cast<float*>(acc_s + 0), 16);
        tl::warpgroup_arrive();
        tl::fence_proxy_async();
        #pragma unroll
        for (int ki_3 = 0; ki_3 < 32; ++ki_3) {
          tl::wgmma_ss<tl::DataType::kBFloat16, tl::DataType::kBFloat16, tl::DataType::kFloat32, 64, 32, 16, false, false, 1, 1>(uint64_t(desc_a_3 + ((((ki_3 >> 2) * 8192) + ((ki_3 & 3) * 32)) >> 4)), uint64_t(desc_b_3 + (((((ki_3 >> 2) * 8192) + ((((int)threadIdx.x) >> 7) * 4096)) + ((ki_3 & 3) * 32)) >> 4)), ((uint32_t*)(acc_s + 0)), 1);
        }
        tl::warpgroup_commit_batch();
        tl::warpgroup_wait<0>();
        tl::warpgroup_fence_operand(reinterpret_cast<float*>(acc_s + 0), 16);
      }
    }
    tl::cp_async_wait<1>();
    __syncthreads();
    int rmod_8 = (((((((topk + 63) >> 6) + splits) - (((int)blockIdx.z) * per)) - sp) - 1) % splits);
    int rdiv_8 = (((((((topk + 63) >> 6) + splits) - (((int)blockIdx.z) * per)) - sp) - 1) / splits);
    if (1 <= ((((0 <= splits) && (0 <= rmod_8)) || ((splits < 0) && (rmod_8 <= 0))) ? rdiv_8 : (rdiv_8 - 1))) {
      {
        tl::GmmaDescriptor desc_a_4;
        tl::GmmaDescriptor desc_b_4;
        tl::initialize_wgmma_descriptor<1, 1, 64>(desc_a_4, (&(((bfloat16_t*)QP_shared)[0])));
        tl::initialize_wgmma_descriptor<1, 1, 64>(desc_b_4, (&(((bfloat16_t*)KP_shared)[0])));
        tl::warpgroup_fence_operand(reinterpret_cast<float*>(acc_s + 0), 16);
        tl::warpgroup_arrive();
        tl::fence_proxy_async();
        #pragma unroll
        for (int ki_4 = 0; ki_4 < 4; ++ki_4) {
          tl::wgmma_ss<tl::DataType::kBFloat16, tl::DataType::kBFloat16, tl::DataType::kFloat32, 64, 32, 16, false, false, 1, 1>(uint64_t(desc_a_4 + ((ki_4 * 32) >> 4)), uint64_t(desc_b_4 + ((((((int)threadIdx.x) >> 7) * 4096) + (ki_4 * 32)) >> 4)), ((uint32_t*)(acc_s + 0)), 1);
        }
        tl::warpgroup_commit_batch();
        tl::warpgroup_wait<0>();
        tl::warpgroup_fence_operand(reinterpret_cast<float*>(acc_s + 0), 16);
      }
      *(float2*)(m_i_prev + 0) = *(float2*)(m_i + 0);
      #pragma unroll
      for (int i_16 = 0; i_16 < 2; ++i_16) {
        m_i_clear_1[i_16] = -CUDART_INF_F;
        #pragma unroll
        for (int rv_2 = 0; rv_2 < 8; ++rv_2) {
          m_i_clear_1[i_16] = max(m_i_clear_1[i_16], acc_s[((((rv_2 & 3) * 4) + (i_16 * 2)) + (rv_2 >> 2))]);
        }
        __syncthreads();
        m_i_clear_1[i_16] = tl::AllReduce<tl::MaxOp, 256, 128, 0, tl::NamedBarrier<256>>::run(m_i_clear_1[i_16], (&(((float*)workspace_2)[0])));
        m_i_clear_1[i_16] = tl::AllReduce<tl::MaxOp, 4, 1, 0, tl::NamedBarrier<256>>::run(m_i_clear_1[i_16]);
        m_i[i_16] = max(m_i[i_16], m_i_clear_1[i_16]);
      }
      float2 __11;
        float2 v__13 = *(float2*)(m_i + 0);
        float2 v__14 = *(float2*)(m_i_prev + 0);
        __11.x = max(v__13.x, v__14.x);
        __11.y = max(v__13.y, v__14.y);
      *(float2*)(m_i + 0) = __11;
      float2 __12;
      float2 __13;
        float2 __14;
          float2 v__15 = *(float2*)(m_i_prev + 0);
          float2 v__16 = *(float2*)(m_i + 0);
          __14.x = (v__15.x-v__16.x);
          __14.y = (v__15.y-v__16.y);
        float2 v__17 = make_float2((scale * 0x1.71547652b82fep+0f/*1.442695e+00*/), (scale * 0x1.71547652b82fep+0f/*1.442695e+00*/));
        __13.x = (__14.x*v__17.x);
        __13.y = (__14.y*v__17.y);
      __12.x = exp2f(__13.x);
      __12.y = exp2f(__13.y);
      *(float2*)(alpha + 0) = __12;
      #pragma unroll
      for (int i_17 = 0; i_17 < 8; ++i_17) {
        float2 __15;
        float2 __16;
          float2 __17;
            float2 v__18 = *(float2*)(acc_s + (i_17 * 2));
            float2 v__19 = make_float2((scale * 0x1.71547652b82fep+0f/*1.442695e+00*/), (scale * 0x1.71547652b82fep+0f/*1.442695e+00*/));
            __17.x = (v__18.x*v__19.x);
            __17.y = (v__18.y*v__19.y);
          float2 v__20 = make_float2((m_i[(i_17 & 1)] * (scale * 0x1.71547652b82fep+0f/*1.442695e+00*/)), (m_i[(i_17 & 1)] * (scale * 0x1.71547652b82fep+0f/*1.442695e+00*/)));
          __16.x = (__17.x-v__20.x);
          __16.y = (__17.y-v__20.y);
        __15.x = exp2f(__16.x);
        __15.y = exp2f(__16.y);
        *(float2*)(acc_s + (i_17 * 2)) = __15;
      }
      #pragma unroll
      for (int i_18 = 0; i_18 < 2; ++i_18) {
        sumexp_i[i_18] = 0x0p+0f/*0.000000e+00*/;
        #pragma unroll
        for (int rv_3 = 0; rv_3 < 8; ++rv_3) {
          sumexp_i[i_18] = (sumexp_i[i_18] + acc_s[((((rv_3 & 3) * 4) + (i_18 * 2)) + (rv_3 >> 2))]);
        }
        __syncthreads();
        sumexp_i[i_18] = tl::AllReduce<tl::SumOp, 256, 128, 0, tl::NamedBarrier<256>>::run(sumexp_i[i_18], (&(((float*)workspace)[0])));
        sumexp_i[i_18] = tl::AllReduce<tl::SumOp, 4, 1, 0, tl::NamedBarrier<256>>::run(sumexp_i[i_18]);
      }
      float2 __18;
        float2 __19;
          float2 v__21 = *(float2*)(sumexp + 0);
          float2 v__22 = *(float2*)(alpha + 0);
          __19.x = (v__21.x*v__22.x);
          __19.y = (v__21.y*v__22.y);
        float2 v__23 = *(float2*)(sumexp_i + 0);
        __18.x = (__19.x+v__23.x);
        __18.y = (__19.y+v__23.y);
      *(float2*)(sumexp + 0) = __18;
      #pragma unroll
      for (int i_19 = 0; i_19 < 64; ++i_19) {
        float2 __20;
          float2 v__24 = *(float2*)(acc_o + (i_19 * 2));
          float2 v__25 = make_float2(alpha[(i_19 & 1)], alpha[(i_19 & 1)]);
          __20.x = (v__24.x*v__25.x);
          __20.y = (v__24.y*v__25.y);
        *(float2*)(acc_o + (i_19 * 2)) = __20;
      }
      __syncthreads();
      #pragma unroll
      for (int i_20 = 0; i_20 < 2; ++i_20) {
        tl::ptx_stmatrix_m8n8_x4((&(((bfloat16_t*)S_shared)[(((((((((int)threadIdx.x) & 127) >> 5) * 1024) + ((((int)threadIdx.x) & 15) * 64)) + ((((((int)threadIdx.x) >> 7) + ((((int)threadIdx.x) & 7) >> 2)) & 1) * 32)) + (((((((int)threadIdx.x) & 3) >> 1) + i_20) & 1) * 16)) + (((((((int)threadIdx.x) & 31) >> 4) + (((int)threadIdx.x) & 1)) & 1) * 8))])), __pack_half2(((bfloat16_t)acc_s[(i_20 * 8)]), ((bfloat16_t)acc_s[((i_20 * 8) + 1)])), __pack_half2(((bfloat16_t)acc_s[((i_20 * 8) + 2)]), ((bfloat16_t)acc_s[((i_20 * 8) + 3)])), __pack_half2(((bfloat16_t)acc_s[((i_20 * 8) + 4)]), ((bfloat16_t)acc_s[((i_20 * 8) + 5)])), __pack_half2(((bfloat16_t)acc_s[((i_20 * 8) + 6)]), ((bfloat16_t)acc_s[((i_20 * 8) + 7)])));
      }
    }
    __syncthreads();
    int rmod_9 = (((((((topk + 63) >> 6) + splits) - (((int)blockIdx.z) * per)) - sp) - 1) % splits);
    int rdiv_9 = (((((((topk + 63) >> 6) + splits) - (((int)blockIdx.z) * per)) - sp) - 1) / splits);
    if (1 <= ((((0 <= splits) && (0 <= rmod_9)) || ((splits < 0) && (rmod_9 <= 0))) ? rdiv_9 : (rdiv_9 - 1))) {
      {
        tl::GmmaDescriptor desc_a_5;
        tl::GmmaDescriptor desc_b_5;
        tl::initialize_wgmma_descriptor<1, 1, 64>(desc_a_5, (&(((bfloat16_t*)S_shared)[0])));
        tl::initialize_wgmma_descriptor<1, 512, 64>(desc_b_5, (&(((bfloat16_t*)KV_shared)[0])));
        tl::warpgroup_fence_operand(reinterpret_cast<float*>(acc_o + 0), 128);
        tl::warpgroup_arrive();
        tl::fence_proxy_async();
        #pragma unroll
        for (int ki_5 = 0; ki_5 < 4; ++ki_5) {
          tl::wgmma_ss<tl::DataType::kBFloat16, tl::DataType::kBFloat16, tl::DataType::kFloat32, 64, 256, 16, false, true, 1, 1>(uint64_t(desc_a_5 + ((ki_5 * 32) >> 4)), uint64_t(desc_b_5 + ((((((int)threadIdx.x) >> 7) * 32768) + (ki_5 * 2048)) >> 4)), ((uint32_t*)(acc_o + 0)), 1);
        }
        tl::warpgroup_commit_batch();
        tl::warpgroup_wait<0>();
        tl::warpgroup_fence_operand(reinterpret_cast<float*>(acc_o + 0), 128);
      }
    }
    if (((((int)blockIdx.z) * per) + sp) < splits) {
      #pragma unroll
      for (int i_21 = 0; i_21 < 64; ++i_21) {
        if (((((((int)blockIdx.y) * 64) + (((((int)threadIdx.x) & 127) >> 5) * 16)) + ((i_21 & 1) * 8)) + ((((int)threadIdx.x) & 31) >> 2)) < heads) {
          float broadcast_var_5 = 0x0p+0f/*0.000000e+00*/;
          float2 condval_6;
          if ((0x0p+0f/*0.000000e+00*/ < sumexp[(i_21 & 1)])) {
            float2 __21;
              float2 v__26 = *(float2*)(acc_o + (i_21 * 2));
              float2 v__27 = make_float2(sumexp[(i_21 & 1)], sumexp[(i_21 & 1)]);
              __21.x = (v__26.x/v__27.x);
              __21.y = (v__26.y/v__27.y);
            condval_6 = __21;
          } else {
            condval_6 = make_float2(broadcast_var_5, broadcast_var_5);
          }
          *(float2*)(OPart + (((((((((((int64_t)((int)blockIdx.y)) * (int64_t)32768) + (((((int64_t)((int)threadIdx.x)) & (int64_t)127) >> (int64_t)5) * (int64_t)8192)) + ((((int64_t)i_21) & (int64_t)1) * (int64_t)4096)) + (((((int64_t)((int)threadIdx.x)) & (int64_t)31) >> (int64_t)2) * (int64_t)512)) + (((((((int64_t)((int)blockIdx.z)) * ((int64_t)per)) + ((int64_t)sp)) * ((int64_t)heads)) * ((int64_t)t_n)) * (int64_t)512)) + ((((int64_t)((int)blockIdx.x)) * ((int64_t)heads)) * (int64_t)512)) + ((((int64_t)((int)threadIdx.x)) >> (int64_t)7) * (int64_t)256)) + ((((int64_t)i_21) >> (int64_t)1) * (int64_t)8)) + ((((int64_t)((int)threadIdx.x)) & (int64_t)3) * (int64_t)2))) = condval_6;
        }
      }
    }
    if ((((((int)threadIdx.x) & 3) * 2) + (((int)threadIdx.x) >> 7)) == 0) {
      if (((((int)blockIdx.z) * per) + sp) < splits) {
        #pragma unroll
        for (int i_22 = 0; i_22 < 2; ++i_22) {
          if (((((((int)blockIdx.y) * 64) + (((((int)threadIdx.x) & 127) >> 5) * 16)) + (i_22 * 8)) + ((((int)threadIdx.x) & 31) >> 2)) < heads) {
            float condval_7;
            if ((0x0p+0f/*0.000000e+00*/ < sumexp[i_22])) {
              condval_7 = (log2f(sumexp[i_22]) + (m_i[i_22] * (scale * 0x1.71547652b82fep+0f/*1.442695e+00*/)));
            } else {
              condval_7 = -CUDART_INF_F;
            }
            LsePart[((((((((int64_t)((int)blockIdx.y)) * (int64_t)64) + (((((int64_t)((int)threadIdx.x)) & (int64_t)127) >> (int64_t)5) * (int64_t)16)) + (((int64_t)i_22) * (int64_t)8)) + ((((int64_t)((int)threadIdx.x)) & (int64_t)31) >> (int64_t)2)) + ((((((int64_t)((int)blockIdx.z)) * ((int64_t)per)) + ((int64_t)sp)) * ((int64_t)heads)) * ((int64_t)t_n))) + (((int64_t)((int)blockIdx.x)) * ((int64_t)heads)))] = condval_7;
          }
        }
      }
    }
  }
}

