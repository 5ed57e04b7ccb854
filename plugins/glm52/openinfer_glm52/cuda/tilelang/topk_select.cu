#if defined(_MSC_VER) && !defined(__clang__) && _MSC_VER < 1940
#define _tl_orig_alignas alignas
#define alignas(N) _tl_orig_alignas((N) <= 64 ? (N) : 64)
#include <cuda.h>
#undef alignas
#define alignas _tl_orig_alignas
#endif
#include <tl_templates/cuda/atomic.h>
#include <tl_templates/cuda/reduce.h>
#include <tl_templates/cuda/scan.h>
#include <tl_templates/cuda/ldsm.h>
#include <tl_templates/cuda/threadblock_swizzle.h>
#include <tl_templates/cuda/debug.h>
#ifdef ENABLE_BF16
#include <tl_templates/cuda/cuda_bf16_fallbacks.cuh>
#endif

extern "C" __global__ void topk_select(int* Out, const int* Positions, const float* Scores, int t_n, int topk, int width);
extern "C" __global__ void __launch_bounds__(1024, 1) topk_select(int* Out, const int* Positions, const float* Scores, int t_n, int topk, int width) {
  extern __shared__ __align__(1024) uchar buf_dyn_shmem[];
  void* counts = ((void*)((char*)buf_dyn_shmem + 0));
  void* hist = ((void*)((char*)buf_dyn_shmem + 4096));
  void* found = ((void*)((char*)buf_dyn_shmem + 5120));
  uint prefix = (uint)0;
  uint mask = (uint)0;
  int need = 0;
  int gt_seen = 0;
  int eq_seen = 0;
  int above = 0;
  int bin_ = 0;
  int done = 0;
  cudaGridDependencySynchronize();
  cudaTriggerProgrammaticLaunchCompletion();
  int visible = (Positions[((int64_t)((int)blockIdx.x))] + 1);
  if (visible <= topk) {
    for (int i = 0; i < ((topk + 1023) >> 10); ++i) {
      if (((i * 1024) + ((int)threadIdx.x)) < topk) {
        int condval;
        if ((((i * 1024) + ((int)threadIdx.x)) < visible)) {
          condval = ((i * 1024) + ((int)threadIdx.x));
        } else {
          condval = -1;
        }
        Out[(((((int64_t)i) * (int64_t)1024) + (((int64_t)((int)blockIdx.x)) * ((int64_t)topk))) + ((int64_t)((int)threadIdx.x)))] = condval;
      }
    }
  } else {
    prefix = (uint)0;
    mask = (uint)0;
    need = topk;
    for (int p = 0; p < 4; ++p) {
      if (((int)threadIdx.x) < 256) {
        ((int*)hist)[((int)threadIdx.x)] = 0;
      }
      __syncthreads();
      for (int i_1 = 0; i_1 < ((visible + 1023) >> 10); ++i_1) {
        if (((i_1 * 1024) + ((int)threadIdx.x)) < visible) {
          float condval_3;
          if ((((i_1 * 1024) + ((int)threadIdx.x)) < width)) {
            condval_3 = Scores[(((((int64_t)i_1) * (int64_t)1024) + (((int64_t)((int)blockIdx.x)) * ((int64_t)width))) + ((int64_t)((int)threadIdx.x)))];
          } else {
            condval_3 = 0x0p+0f/*0.000000e+00*/;
          }
          float condval_2;
          if ((condval_3 == 0x0p+0f/*0.000000e+00*/)) {
            condval_2 = 0x0p+0f/*0.000000e+00*/;
          } else {
            float condval_4;
            if ((((i_1 * 1024) + ((int)threadIdx.x)) < width)) {
              condval_4 = Scores[(((((int64_t)i_1) * (int64_t)1024) + (((int64_t)((int)blockIdx.x)) * ((int64_t)width))) + ((int64_t)((int)threadIdx.x)))];
            } else {
              condval_4 = 0x0p+0f/*0.000000e+00*/;
            }
            condval_2 = condval_4;
          }
          float _reinterpret_tmp = condval_2;
          uint condval_1;
          if ((((*(uint *)(&(_reinterpret_tmp))) & (uint)2147483648) != (uint)0)) {
            float condval_6;
            if ((((i_1 * 1024) + ((int)threadIdx.x)) < width)) {
              condval_6 = Scores[(((((int64_t)i_1) * (int64_t)1024) + (((int64_t)((int)blockIdx.x)) * ((int64_t)width))) + ((int64_t)((int)threadIdx.x)))];
            } else {
              condval_6 = 0x0p+0f/*0.000000e+00*/;
            }
            float condval_5;
            if ((condval_6 == 0x0p+0f/*0.000000e+00*/)) {
              condval_5 = 0x0p+0f/*0.000000e+00*/;
            } else {
              float condval_7;
              if ((((i_1 * 1024) + ((int)threadIdx.x)) < width)) {
                condval_7 = Scores[(((((int64_t)i_1) * (int64_t)1024) + (((int64_t)((int)blockIdx.x)) * ((int64_t)width))) + ((int64_t)((int)threadIdx.x)))];
              } else {
                condval_7 = 0x0p+0f/*0.000000e+00*/;
              }
              condval_5 = condval_7;
            }
            float _reinterpret_tmp_1 = condval_5;
            condval_1 = (~(*(uint *)(&(_reinterpret_tmp_1))));
          } else {
            float condval_9;
            if ((((i_1 * 1024) + ((int)threadIdx.x)) < width)) {
              condval_9 = Scores[(((((int64_t)i_1) * (int64_t)1024) + (((int64_t)((int)blockIdx.x)) * ((int64_t)width))) + ((int64_t)((int)threadIdx.x)))];
            } else {
              condval_9 = 0x0p+0f/*0.000000e+00*/;
            }
            float condval_8;
            if ((condval_9 == 0x0p+0f/*0.000000e+00*/)) {
              condval_8 = 0x0p+0f/*0.000000e+00*/;
            } else {
              float condval_10;
              if ((((i_1 * 1024) + ((int)threadIdx.x)) < width)) {
                condval_10 = Scores[(((((int64_t)i_1) * (int64_t)1024) + (((int64_t)((int)blockIdx.x)) * ((int64_t)width))) + ((int64_t)((int)threadIdx.x)))];
              } else {
                condval_10 = 0x0p+0f/*0.000000e+00*/;
              }
              condval_8 = condval_10;
            }
            float _reinterpret_tmp_2 = condval_8;
            condval_1 = ((*(uint *)(&(_reinterpret_tmp_2))) | (uint)2147483648);
          }
          if ((condval_1 & mask) == prefix) {
            if (((i_1 * 1024) + ((int)threadIdx.x)) < width) {
              float condval_12;
              if ((Scores[(((((int64_t)i_1) * (int64_t)1024) + (((int64_t)((int)blockIdx.x)) * ((int64_t)width))) + ((int64_t)((int)threadIdx.x)))] == 0x0p+0f/*0.000000e+00*/)) {
                condval_12 = 0x0p+0f/*0.000000e+00*/;
              } else {
                condval_12 = Scores[(((((int64_t)i_1) * (int64_t)1024) + (((int64_t)((int)blockIdx.x)) * ((int64_t)width))) + ((int64_t)((int)threadIdx.x)))];
              }
              float _reinterpret_tmp_3 = condval_12;
              uint condval_11;
              if ((((*(uint *)(&(_reinterpret_tmp_3))) & (uint)2147483648) != (uint)0)) {
                float condval_13;
                if ((Scores[(((((int64_t)i_1) * (int64_t)1024) + (((int64_t)((int)blockIdx.x)) * ((int64_t)width))) + ((int64_t)((int)threadIdx.x)))] == 0x0p+0f/*0.000000e+00*/)) {
                  condval_13 = 0x0p+0f/*0.000000e+00*/;
                } else {
                  condval_13 = Scores[(((((int64_t)i_1) * (int64_t)1024) + (((int64_t)((int)blockIdx.x)) * ((int64_t)width))) + ((int64_t)((int)threadIdx.x)))];
                }
                float _reinterpret_tmp_4 = condval_13;
                condval_11 = (~(*(uint *)(&(_reinterpret_tmp_4))));
              } else {
                float condval_14;
                if ((Scores[(((((int64_t)i_1) * (int64_t)1024) + (((int64_t)((int)blockIdx.x)) * ((int64_t)width))) + ((int64_t)((int)threadIdx.x)))] == 0x0p+0f/*0.000000e+00*/)) {
                  condval_14 = 0x0p+0f/*0.000000e+00*/;
                } else {
                  condval_14 = Scores[(((((int64_t)i_1) * (int64_t)1024) + (((int64_t)((int)blockIdx.x)) * ((int64_t)width))) + ((int64_t)((int)threadIdx.x)))];
                }
                float _reinterpret_tmp_5 = condval_14;
                condval_11 = ((*(uint *)(&(_reinterpret_tmp_5))) | (uint)2147483648);
              }
              float condval_16;
              if ((Scores[(((((int64_t)i_1) * (int64_t)1024) + (((int64_t)((int)blockIdx.x)) * ((int64_t)width))) + ((int64_t)((int)threadIdx.x)))] == 0x0p+0f/*0.000000e+00*/)) {
                condval_16 = 0x0p+0f/*0.000000e+00*/;
              } else {
                condval_16 = Scores[(((((int64_t)i_1) * (int64_t)1024) + (((int64_t)((int)blockIdx.x)) * ((int64_t)width))) + ((int64_t)((int)threadIdx.x)))];
              }
              float _reinterpret_tmp_6 = condval_16;
              uint condval_15;
              if ((((*(uint *)(&(_reinterpret_tmp_6))) & (uint)2147483648) != (uint)0)) {
                float condval_17;
                if ((Scores[(((((int64_t)i_1) * (int64_t)1024) + (((int64_t)((int)blockIdx.x)) * ((int64_t)width))) + ((int64_t)((int)threadIdx.x)))] == 0x0p+0f/*0.000000e+00*/)) {
                  condval_17 = 0x0p+0f/*0.000000e+00*/;
                } else {
                  condval_17 = Scores[(((((int64_t)i_1) * (int64_t)1024) + (((int64_t)((int)blockIdx.x)) * ((int64_t)width))) + ((int64_t)((int)threadIdx.x)))];
                }
                float _reinterpret_tmp_7 = condval_17;
                condval_15 = (~(*(uint *)(&(_reinterpret_tmp_7))));
              } else {
                float condval_18;
                if ((Scores[(((((int64_t)i_1) * (int64_t)1024) + (((int64_t)((int)blockIdx.x)) * ((int64_t)width))) + ((int64_t)((int)threadIdx.x)))] == 0x0p+0f/*0.000000e+00*/)) {
                  condval_18 = 0x0p+0f/*0.000000e+00*/;
                } else {
                  condval_18 = Scores[(((((int64_t)i_1) * (int64_t)1024) + (((int64_t)((int)blockIdx.x)) * ((int64_t)width))) + ((int64_t)((int)threadIdx.x)))];
                }
                float _reinterpret_tmp_8 = condval_18;
                condval_15 = ((*(uint *)(&(_reinterpret_tmp_8))) | (uint)2147483648);
              }
              AtomicAdd((&(((int*)hist)[((int)((condval_15 >> ((uint)24 - ((uint)8 * ((uint)p)))) & (uint)255))])), 1);
            }
          }
        }
      }
      __syncthreads();
      if (((int)threadIdx.x) == 0) {
        above = 0;
        bin_ = 0;
        done = 0;
        for (int j = 0; j < 256; ++j) {
          if (done == 0) {
            if ((j == 255) || (need <= (above + ((int*)hist)[(255 - j)]))) {
              bin_ = (255 - j);
              done = 1;
            } else {
              above = (above + ((int*)hist)[(255 - j)]);
            }
          }
        }
        ((uint*)found)[0] = (prefix | (((uint)bin_) << ((uint)24 - ((uint)8 * ((uint)p)))));
        ((uint*)found)[1] = ((uint)(need - above));
      }
      __syncthreads();
      prefix = ((uint*)found)[0];
      need = ((int)((uint*)found)[1]);
      mask = (mask | ((uint)255 << ((uint)24 - ((uint)8 * ((uint)p)))));
      __syncthreads();
    }
    gt_seen = 0;
    eq_seen = 0;
    for (int i_2 = 0; i_2 < ((visible + 1023) >> 10); ++i_2) {
      uint condval_19;
      if ((((i_2 * 1024) + ((int)threadIdx.x)) < visible)) {
        float condval_22;
        if (((((i_2 * 1024) + ((int)threadIdx.x)) < width) || (visible <= width))) {
          condval_22 = Scores[(min(((((int64_t)i_2) * (int64_t)1024) + ((int64_t)((int)threadIdx.x))), (((int64_t)visible) - (int64_t)1)) + (((int64_t)((int)blockIdx.x)) * ((int64_t)width)))];
        } else {
          condval_22 = 0x0p+0f/*0.000000e+00*/;
        }
        float condval_21;
        if ((condval_22 == 0x0p+0f/*0.000000e+00*/)) {
          condval_21 = 0x0p+0f/*0.000000e+00*/;
        } else {
          float condval_23;
          if (((((i_2 * 1024) + ((int)threadIdx.x)) < width) || (visible <= width))) {
            condval_23 = Scores[(min(((((int64_t)i_2) * (int64_t)1024) + ((int64_t)((int)threadIdx.x))), (((int64_t)visible) - (int64_t)1)) + (((int64_t)((int)blockIdx.x)) * ((int64_t)width)))];
          } else {
            condval_23 = 0x0p+0f/*0.000000e+00*/;
          }
          condval_21 = condval_23;
        }
        float _reinterpret_tmp_9 = condval_21;
        uint condval_20;
        if ((((*(uint *)(&(_reinterpret_tmp_9))) & (uint)2147483648) != (uint)0)) {
          float condval_25;
          if (((((i_2 * 1024) + ((int)threadIdx.x)) < width) || (visible <= width))) {
            condval_25 = Scores[(min(((((int64_t)i_2) * (int64_t)1024) + ((int64_t)((int)threadIdx.x))), (((int64_t)visible) - (int64_t)1)) + (((int64_t)((int)blockIdx.x)) * ((int64_t)width)))];
          } else {
            condval_25 = 0x0p+0f/*0.000000e+00*/;
          }
          float condval_24;
          if ((condval_25 == 0x0p+0f/*0.000000e+00*/)) {
            condval_24 = 0x0p+0f/*0.000000e+00*/;
          } else {
            float condval_26;
            if (((((i_2 * 1024) + ((int)threadIdx.x)) < width) || (visible <= width))) {
              condval_26 = Scores[(min(((((int64_t)i_2) * (int64_t)1024) + ((int64_t)((int)threadIdx.x))), (((int64_t)visible) - (int64_t)1)) + (((int64_t)((int)blockIdx.x)) * ((int64_t)width)))];
            } else {
              condval_26 = 0x0p+0f/*0.000000e+00*/;
            }
            condval_24 = condval_26;
          }
          float _reinterpret_tmp_10 = condval_24;
          condval_20 = (~(*(uint *)(&(_reinterpret_tmp_10))));
        } else {
          float condval_28;
          if (((((i_2 * 1024) + ((int)threadIdx.x)) < width) || (visible <= width))) {
            condval_28 = Scores[(min(((((int64_t)i_2) * (int64_t)1024) + ((int64_t)((int)threadIdx.x))), (((int64_t)visible) - (int64_t)1)) + (((int64_t)((int)blockIdx.x)) * ((int64_t)width)))];
          } else {
            condval_28 = 0x0p+0f/*0.000000e+00*/;
          }
          float condval_27;
          if ((condval_28 == 0x0p+0f/*0.000000e+00*/)) {
            condval_27 = 0x0p+0f/*0.000000e+00*/;
          } else {
            float condval_29;
            if (((((i_2 * 1024) + ((int)threadIdx.x)) < width) || (visible <= width))) {
              condval_29 = Scores[(min(((((int64_t)i_2) * (int64_t)1024) + ((int64_t)((int)threadIdx.x))), (((int64_t)visible) - (int64_t)1)) + (((int64_t)((int)blockIdx.x)) * ((int64_t)width)))];
            } else {
              condval_29 = 0x0p+0f/*0.000000e+00*/;
            }
            condval_27 = condval_29;
          }
          float _reinterpret_tmp_11 = condval_27;
          condval_20 = ((*(uint *)(&(_reinterpret_tmp_11))) | (uint)2147483648);
        }
        condval_19 = condval_20;
      } else {
        condval_19 = (uint)0;
      }
      uint key = condval_19;
      int condval_30;
      if (((((i_2 * 1024) + ((int)threadIdx.x)) < visible) && (prefix < key))) {
        condval_30 = 1;
      } else {
        condval_30 = 0;
      }
      int gt = condval_30;
      int condval_31;
      if (((((i_2 * 1024) + ((int)threadIdx.x)) < visible) && (key == prefix))) {
        condval_31 = 1;
      } else {
        condval_31 = 0;
      }
      int eq = condval_31;
      ((int*)counts)[((int)threadIdx.x)] = ((eq * 65536) + gt);
      __syncthreads();
      tl::CumSum1D<1024, false>::run((&(((int*)counts)[0])), (&(((int*)counts)[0])), 1024);
      __syncthreads();
      int before = ((((int*)counts)[((int)threadIdx.x)] - gt) - (eq * 65536));
      int eq_before = (eq_seen + (before >> 16));
      int slot = ((min(eq_before, need) + gt_seen) + (before & 65535));
      if ((gt == 1) || ((eq == 1) && (eq_before < need))) {
        if ((slot < topk) && (0 <= slot)) {
          Out[((((int64_t)((int)blockIdx.x)) * ((int64_t)topk)) + ((int64_t)slot))] = ((i_2 * 1024) + ((int)threadIdx.x));
        }
      }
      gt_seen = (gt_seen + (((int*)counts)[1023] & 65535));
      eq_seen = (eq_seen + (((int*)counts)[1023] >> 16));
      __syncthreads();
    }
  }
}

