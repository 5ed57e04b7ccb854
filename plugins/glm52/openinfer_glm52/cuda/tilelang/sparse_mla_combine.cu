#if defined(_MSC_VER) && !defined(__clang__) && _MSC_VER < 1940
#define _tl_orig_alignas alignas
#define alignas(N) _tl_orig_alignas((N) <= 64 ? (N) : 64)
#include <cuda.h>
#undef alignas
#define alignas _tl_orig_alignas
#endif
#include <math_constants.h>
#include <tl_templates/cuda/reduce.h>
#include <tl_templates/cuda/scan.h>
#include <tl_templates/cuda/ldsm.h>
#include <tl_templates/cuda/threadblock_swizzle.h>
#include <tl_templates/cuda/debug.h>
#ifdef ENABLE_BF16
#include <tl_templates/cuda/cuda_bf16_fallbacks.cuh>
#endif

extern "C" __global__ void sparse_mla_combine(const float* LsePart, const float* OPart, bfloat16_t* Out, int heads, int splits, int t_n);
extern "C" __global__ void __launch_bounds__(128, 1) sparse_mla_combine(const float* LsePart, const float* OPart, bfloat16_t* Out, int heads, int splits, int t_n) {
  float top = 0x0p+0f/*0.000000e+00*/;
  float total = 0x0p+0f/*0.000000e+00*/;
  float acc[4];
  cudaGridDependencySynchronize();
  cudaTriggerProgrammaticLaunchCompletion();
  top = -CUDART_INF_F;
  total = 0x0p+0f/*0.000000e+00*/;
  for (int s = 0; s < splits; ++s) {
    top = max(top, LsePart[((((((int64_t)s) * ((int64_t)heads)) * ((int64_t)t_n)) + (((int64_t)((int)blockIdx.x)) * ((int64_t)heads))) + ((int64_t)((int)blockIdx.y)))]);
  }
  float broadcast_var = 0x0p+0f/*0.000000e+00*/;
  *(float4*)(acc + 0) = make_float4(broadcast_var, broadcast_var, broadcast_var, broadcast_var);
  for (int s_1 = 0; s_1 < splits; ++s_1) {
    float condval;
    if ((LsePart[((((((int64_t)s_1) * ((int64_t)heads)) * ((int64_t)t_n)) + (((int64_t)((int)blockIdx.x)) * ((int64_t)heads))) + ((int64_t)((int)blockIdx.y)))] == -CUDART_INF_F)) {
      condval = 0x0p+0f/*0.000000e+00*/;
    } else {
      condval = exp2f((LsePart[((((((int64_t)s_1) * ((int64_t)heads)) * ((int64_t)t_n)) + (((int64_t)((int)blockIdx.x)) * ((int64_t)heads))) + ((int64_t)((int)blockIdx.y)))] - top));
    }
    float w = condval;
    total = (total + w);
    float4 __1;
      float4 v_ = *(float4*)(acc + 0);
      float4 __2;
        float4 v__1 = make_float4(w, w, w, w);
        float4 v__2 = *(float4*)(OPart + ((((((((int64_t)s_1) * ((int64_t)heads)) * ((int64_t)t_n)) * (int64_t)512) + ((((int64_t)((int)blockIdx.x)) * ((int64_t)heads)) * (int64_t)512)) + (((int64_t)((int)blockIdx.y)) * (int64_t)512)) + (((int64_t)((int)threadIdx.x)) * (int64_t)4)));
        __2.x = (v__1.x*v__2.x);
        __2.y = (v__1.y*v__2.y);
        __2.z = (v__1.z*v__2.z);
        __2.w = (v__1.w*v__2.w);
      __1.x = (v_.x+__2.x);
      __1.y = (v_.y+__2.y);
      __1.z = (v_.z+__2.z);
      __1.w = (v_.w+__2.w);
    *(float4*)(acc + 0) = __1;
  }
  {
    bfloat16_t Out_local_cast[4];
    float broadcast_var_1 = 0x0p+0f/*0.000000e+00*/;
    uint2 __3;
    float4 condval_1;
    if ((0x0p+0f/*0.000000e+00*/ < total)) {
      float4 __4;
        float4 v__3 = *(float4*)(acc + 0);
        float4 v__4 = make_float4(total, total, total, total);
        __4.x = (v__3.x/v__4.x);
        __4.y = (v__3.y/v__4.y);
        __4.z = (v__3.z/v__4.z);
        __4.w = (v__3.w/v__4.w);
      condval_1 = __4;
    } else {
      condval_1 = make_float4(broadcast_var_1, broadcast_var_1, broadcast_var_1, broadcast_var_1);
    }
    (reinterpret_cast<__nv_bfloat162*>(&__3))[0] = __float22bfloat162_rn(((float2*)(&condval_1))[0]);
    (reinterpret_cast<__nv_bfloat162*>(&__3))[1] = __float22bfloat162_rn(((float2*)(&condval_1))[1]);
    *(uint2*)(Out_local_cast + 0) = __3;
    *(uint2*)(Out + (((((int64_t)((int)blockIdx.y)) * (int64_t)512) + ((((int64_t)((int)blockIdx.x)) * ((int64_t)heads)) * (int64_t)512)) + (((int64_t)((int)threadIdx.x)) * (int64_t)4))) = *(uint2*)(Out_local_cast + 0);
  }
}

