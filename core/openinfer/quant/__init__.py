"""Quantized weights read straight from the checkpoint: compressed-tensors INT4 `pack-quantized` (group 32,
symmetric) and FP8 e4m3 with 128x128 block scales (`weight_scale_inv`).

A quantized Linear stays in its packed form on the device; the ops that read it (ops on Int4Weight / Fp8Weight,
kernels/numpy_quant.py and the CUDA kernels of kernels/cuda/quant.py) dequantize as they go. The numpy
dequantization here is the reference every kernel is tested against.
"""
from __future__ import annotations

from .fp8 import FP8_BLOCK, Fp8Weight, e4m3_to_f32, quantize_fp8, row_scales
from .int4 import INT4_GROUP, Int4Weight, pack_int4, quantize_int4, unpack_int4
from .scheme import QuantScheme, QuantizedTensorError, quant_scheme

__all__ = ["FP8_BLOCK", "Fp8Weight", "INT4_GROUP", "Int4Weight", "QuantScheme", "QuantizedTensorError",
           "e4m3_to_f32", "pack_int4", "quant_scheme", "quantize_fp8", "quantize_int4", "row_scales", "unpack_int4"]
