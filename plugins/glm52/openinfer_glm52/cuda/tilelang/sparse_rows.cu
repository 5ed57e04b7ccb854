#if defined(_MSC_VER) && !defined(__clang__) && _MSC_VER < 1940
#define _tl_orig_alignas alignas
#define alignas(N) _tl_orig_alignas((N) <= 64 ? (N) : 64)
#include <cuda.h>
#undef alignas
#define alignas _tl_orig_alignas
#endif
#include <tl_templates/cuda/reduce.h>
#include <tl_templates/cuda/scan.h>
#include <tl_templates/cuda/ldsm.h>
#include <tl_templates/cuda/threadblock_swizzle.h>
#include <tl_templates/cuda/debug.h>
#ifdef ENABLE_BF16
#include <tl_templates/cuda/cuda_bf16_fallbacks.cuh>
#endif

extern "C" __global__ void sparse_rows(const int* BlockTable, const int* Indices, const int* Positions, int* Rows, const int* TokenSeq, int block_rows, int block_size, int n_seq, int t_n, int topk, int width);
extern "C" __global__ void __launch_bounds__(128, 1) sparse_rows(const int* BlockTable, const int* Indices, const int* Positions, int* Rows, const int* TokenSeq, int block_rows, int block_size, int n_seq, int t_n, int topk, int width) {
  cudaGridDependencySynchronize();
  cudaTriggerProgrammaticLaunchCompletion();
  if (((((int)blockIdx.y) * 128) + ((int)threadIdx.x)) < topk) {
    int condval;
    if (((0 <= Indices[(((((int64_t)((int)blockIdx.y)) * (int64_t)128) + (((int64_t)((int)blockIdx.x)) * ((int64_t)topk))) + ((int64_t)((int)threadIdx.x)))]) && (Indices[(((((int64_t)((int)blockIdx.y)) * (int64_t)128) + (((int64_t)((int)blockIdx.x)) * ((int64_t)topk))) + ((int64_t)((int)threadIdx.x)))] <= Positions[((int64_t)((int)blockIdx.x))]))) {
      int condval_2;
      if (((0 <= Indices[(((((int64_t)((int)blockIdx.y)) * (int64_t)128) + (((int64_t)((int)blockIdx.x)) * ((int64_t)topk))) + ((int64_t)((int)threadIdx.x)))]) && (Indices[(((((int64_t)((int)blockIdx.y)) * (int64_t)128) + (((int64_t)((int)blockIdx.x)) * ((int64_t)topk))) + ((int64_t)((int)threadIdx.x)))] <= Positions[((int64_t)((int)blockIdx.x))]))) {
        condval_2 = Indices[(((((int64_t)((int)blockIdx.y)) * (int64_t)128) + (((int64_t)((int)blockIdx.x)) * ((int64_t)topk))) + ((int64_t)((int)threadIdx.x)))];
      } else {
        condval_2 = 0;
      }
      int rmod = (condval_2 % block_size);
      int condval_3;
      if (((0 <= Indices[(((((int64_t)((int)blockIdx.y)) * (int64_t)128) + (((int64_t)((int)blockIdx.x)) * ((int64_t)topk))) + ((int64_t)((int)threadIdx.x)))]) && (Indices[(((((int64_t)((int)blockIdx.y)) * (int64_t)128) + (((int64_t)((int)blockIdx.x)) * ((int64_t)topk))) + ((int64_t)((int)threadIdx.x)))] <= Positions[((int64_t)((int)blockIdx.x))]))) {
        condval_3 = Indices[(((((int64_t)((int)blockIdx.y)) * (int64_t)128) + (((int64_t)((int)blockIdx.x)) * ((int64_t)topk))) + ((int64_t)((int)threadIdx.x)))];
      } else {
        condval_3 = 0;
      }
      int rdiv = (condval_3 / block_size);
      int condval_4;
      if (((0 <= Indices[(((((int64_t)((int)blockIdx.y)) * (int64_t)128) + (((int64_t)((int)blockIdx.x)) * ((int64_t)topk))) + ((int64_t)((int)threadIdx.x)))]) && (Indices[(((((int64_t)((int)blockIdx.y)) * (int64_t)128) + (((int64_t)((int)blockIdx.x)) * ((int64_t)topk))) + ((int64_t)((int)threadIdx.x)))] <= Positions[((int64_t)((int)blockIdx.x))]))) {
        condval_4 = Indices[(((((int64_t)((int)blockIdx.y)) * (int64_t)128) + (((int64_t)((int)blockIdx.x)) * ((int64_t)topk))) + ((int64_t)((int)threadIdx.x)))];
      } else {
        condval_4 = 0;
      }
      int rmod_1 = (condval_4 % block_size);
      int condval_5;
      if (((0 <= Indices[(((((int64_t)((int)blockIdx.y)) * (int64_t)128) + (((int64_t)((int)blockIdx.x)) * ((int64_t)topk))) + ((int64_t)((int)threadIdx.x)))]) && (Indices[(((((int64_t)((int)blockIdx.y)) * (int64_t)128) + (((int64_t)((int)blockIdx.x)) * ((int64_t)topk))) + ((int64_t)((int)threadIdx.x)))] <= Positions[((int64_t)((int)blockIdx.x))]))) {
        condval_5 = Indices[(((((int64_t)((int)blockIdx.y)) * (int64_t)128) + (((int64_t)((int)blockIdx.x)) * ((int64_t)topk))) + ((int64_t)((int)threadIdx.x)))];
      } else {
        condval_5 = 0;
      }
      int rdiv_1 = (condval_5 / block_size);
      int condval_1;
      if (((((0 <= ((((0 <= block_size) && (0 <= rmod)) || ((block_size < 0) && (rmod <= 0))) ? rdiv : (rdiv - 1))) && (((((0 <= block_size) && (0 <= rmod_1)) || ((block_size < 0) && (rmod_1 <= 0))) ? rdiv_1 : (rdiv_1 - 1)) < width)) && (0 <= TokenSeq[((int64_t)((int)blockIdx.x))])) && (TokenSeq[((int64_t)((int)blockIdx.x))] < n_seq))) {
        int64_t condval_6;
        if ((((int64_t)0 <= ((int64_t)Indices[(((((int64_t)((int)blockIdx.y)) * (int64_t)128) + (((int64_t)((int)blockIdx.x)) * ((int64_t)topk))) + ((int64_t)((int)threadIdx.x)))])) && (Indices[(((((int64_t)((int)blockIdx.y)) * (int64_t)128) + (((int64_t)((int)blockIdx.x)) * ((int64_t)topk))) + ((int64_t)((int)threadIdx.x)))] <= Positions[((int64_t)((int)blockIdx.x))]))) {
          condval_6 = ((int64_t)Indices[(((((int64_t)((int)blockIdx.y)) * (int64_t)128) + (((int64_t)((int)blockIdx.x)) * ((int64_t)topk))) + ((int64_t)((int)threadIdx.x)))]);
        } else {
          condval_6 = (int64_t)0;
        }
        int64_t rmod_2 = (condval_6 % ((int64_t)block_size));
        int64_t condval_7;
        if ((((int64_t)0 <= ((int64_t)Indices[(((((int64_t)((int)blockIdx.y)) * (int64_t)128) + (((int64_t)((int)blockIdx.x)) * ((int64_t)topk))) + ((int64_t)((int)threadIdx.x)))])) && (Indices[(((((int64_t)((int)blockIdx.y)) * (int64_t)128) + (((int64_t)((int)blockIdx.x)) * ((int64_t)topk))) + ((int64_t)((int)threadIdx.x)))] <= Positions[((int64_t)((int)blockIdx.x))]))) {
          condval_7 = ((int64_t)Indices[(((((int64_t)((int)blockIdx.y)) * (int64_t)128) + (((int64_t)((int)blockIdx.x)) * ((int64_t)topk))) + ((int64_t)((int)threadIdx.x)))]);
        } else {
          condval_7 = (int64_t)0;
        }
        int64_t rdiv_2 = (condval_7 / ((int64_t)block_size));
        int64_t condval_8;
        if ((((int64_t)0 <= ((int64_t)Indices[(((((int64_t)((int)blockIdx.y)) * (int64_t)128) + (((int64_t)((int)blockIdx.x)) * ((int64_t)topk))) + ((int64_t)((int)threadIdx.x)))])) && (Indices[(((((int64_t)((int)blockIdx.y)) * (int64_t)128) + (((int64_t)((int)blockIdx.x)) * ((int64_t)topk))) + ((int64_t)((int)threadIdx.x)))] <= Positions[((int64_t)((int)blockIdx.x))]))) {
          condval_8 = ((int64_t)Indices[(((((int64_t)((int)blockIdx.y)) * (int64_t)128) + (((int64_t)((int)blockIdx.x)) * ((int64_t)topk))) + ((int64_t)((int)threadIdx.x)))]);
        } else {
          condval_8 = (int64_t)0;
        }
        int64_t rmod_3 = (condval_8 % ((int64_t)block_size));
        int64_t condval_9;
        if ((((int64_t)0 <= ((int64_t)Indices[(((((int64_t)((int)blockIdx.y)) * (int64_t)128) + (((int64_t)((int)blockIdx.x)) * ((int64_t)topk))) + ((int64_t)((int)threadIdx.x)))])) && (Indices[(((((int64_t)((int)blockIdx.y)) * (int64_t)128) + (((int64_t)((int)blockIdx.x)) * ((int64_t)topk))) + ((int64_t)((int)threadIdx.x)))] <= Positions[((int64_t)((int)blockIdx.x))]))) {
          condval_9 = ((int64_t)Indices[(((((int64_t)((int)blockIdx.y)) * (int64_t)128) + (((int64_t)((int)blockIdx.x)) * ((int64_t)topk))) + ((int64_t)((int)threadIdx.x)))]);
        } else {
          condval_9 = (int64_t)0;
        }
        int64_t rdiv_3 = (condval_9 / ((int64_t)block_size));
        condval_1 = BlockTable[((((int64_t)TokenSeq[((int64_t)((int)blockIdx.x))]) * ((int64_t)width)) + (((((int64_t)0 <= ((int64_t)block_size)) && ((int64_t)0 <= rmod_3)) || ((((int64_t)block_size) < (int64_t)0) && (rmod_3 <= (int64_t)0))) ? rdiv_3 : (rdiv_3 - (int64_t)1)))];
      } else {
        condval_1 = 0;
      }
      int condval_10;
      if (((0 <= Indices[(((((int64_t)((int)blockIdx.y)) * (int64_t)128) + (((int64_t)((int)blockIdx.x)) * ((int64_t)topk))) + ((int64_t)((int)threadIdx.x)))]) && (Indices[(((((int64_t)((int)blockIdx.y)) * (int64_t)128) + (((int64_t)((int)blockIdx.x)) * ((int64_t)topk))) + ((int64_t)((int)threadIdx.x)))] <= Positions[((int64_t)((int)blockIdx.x))]))) {
        condval_10 = Indices[(((((int64_t)((int)blockIdx.y)) * (int64_t)128) + (((int64_t)((int)blockIdx.x)) * ((int64_t)topk))) + ((int64_t)((int)threadIdx.x)))];
      } else {
        condval_10 = 0;
      }
      int rmod_4 = (condval_10 % block_size);
      condval = ((condval_1 * block_rows) + ((((0 <= block_size) && (0 <= rmod_4)) || ((block_size < 0) && (rmod_4 <= 0))) ? rmod_4 : (rmod_4 + block_size)));
    } else {
      condval = -1;
    }
    Rows[(((((int64_t)((int)blockIdx.y)) * (int64_t)128) + (((int64_t)((int)blockIdx.x)) * ((int64_t)topk))) + ((int64_t)((int)threadIdx.x)))] = condval;
  }
}

