"""TMA tensor maps (CUtensorMap) for kernels that stream 2-D tiles into shared memory (skinny_gemm.cu, tma.cuh).

A tensor map describes a row-major bf16 matrix in global memory and the box one copy moves: here 64 columns (128
bytes, the inner extent of the 128-byte swizzle wgmma reads) by `box_rows` rows. Rows and columns outside the
matrix arrive as zeros, so a box may overhang the last rows (the batch padded to the kernel's width) or the last k.
Encoding is a host call (cuTensorMapEncodeTiled); maps are kept per (address, shape, stride, box), so a decode
graph's fixed buffers are encoded once. Enum values: cuda.h of CUDA 13 (CUtensorMapDataType, ...Swizzle, ...L2promotion).
"""
from __future__ import annotations

import ctypes

from . import pdl

BOX_COLS = 64                 # bf16 columns a box row carries: 128 bytes
_BFLOAT16 = 9                 # CU_TENSOR_MAP_DATA_TYPE_BFLOAT16
_INTERLEAVE_NONE, _SWIZZLE_128B, _L2_PROMOTION_256B, _OOB_FILL_ZERO = 0, 3, 3, 0
_MAX_CACHED = 4096
_maps: dict[tuple[int, int, int, int, int], pdl.ByValue] = {}


def check_operand(ptr: int, row_stride_bytes: int) -> bool:
    """What TMA requires of the matrix: a 16-byte aligned address and row stride."""
    return ptr % 16 == 0 and row_stride_bytes % 16 == 0 and 0 < row_stride_bytes < 1 << 40


def matrix_map(ptr: int, rows: int, cols: int, row_stride_bytes: int, box_rows: int) -> pdl.ByValue:
    """The tensor map of bf16 [rows][cols] at `ptr` (rows `row_stride_bytes` apart; check_operand holds) read in boxes
    of [box_rows][64] with the 128-byte swizzle, as a by-value kernel parameter."""
    key = (ptr, rows, cols, row_stride_bytes, box_rows)
    m = _maps.get(key)
    if m is None:
        m = pdl.ByValue(128, align=64)
        dims = (ctypes.c_uint64 * 2)(cols, rows)                 # innermost first
        strides = (ctypes.c_uint64 * 1)(row_stride_bytes)        # of every dimension but the innermost
        box = (ctypes.c_uint32 * 2)(BOX_COLS, box_rows)
        steps = (ctypes.c_uint32 * 2)(1, 1)
        status = pdl.driver().cuTensorMapEncodeTiled(m.address, _BFLOAT16, 2, ptr, dims, strides, box, steps,
                                                     _INTERLEAVE_NONE, _SWIZZLE_128B, _L2_PROMOTION_256B,
                                                     _OOB_FILL_ZERO)
        if status:
            raise RuntimeError(f"cuTensorMapEncodeTiled failed with CUresult {status} (bf16 [{rows}][{cols}], row "
                               f"stride {row_stride_bytes} bytes, box [{box_rows}][{BOX_COLS}]); "
                               f"OPENINFER_SKINNY_GEMM=0 leaves these GEMMs to cuBLASLt")
        if len(_maps) >= _MAX_CACHED:   # eager steps see fresh activation buffers: keep the cache bounded
            _maps.clear()
        _maps[key] = m
    return m
