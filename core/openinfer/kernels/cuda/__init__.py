"""CUDA kernels for the shared ops: .cu sources compiled by NVRTC (compile.py), CuPy wrappers (ops.py).

Importing this package touches neither cupy nor the GPU: ops are registered as lazy
"module:attr" strings, loaded only when a model resolves its plan on the cuda backend.
"""
from __future__ import annotations

OPS = ("embedding", "linear", "rms_norm", "add_rms_norm", "rope", "qk_norm_rope", "silu_mul", "linear_silu_mul",
       "write_kv", "rope_write_kv", "paged_attention", "gather_rows", "argmax", "top_logprobs")
DTYPES = ("bfloat16", "float32")


# ops on quantized weights (quant.py): op name -> its wrapper
QUANT_OPS = {"linear_int4": "linear_quant", "linear_fp8": "linear_quant", "moe_experts_int4": "moe_experts_quant",
             "moe_experts_fp8": "moe_experts_quant"}


def register(register_kernel) -> None:
    """Registers every op above for backend "cuda" (called through the core's own hookimpl)."""
    for name in OPS:
        register_kernel(name, "cuda", f"{__name__}.ops:{name}", dtypes=DTYPES)
    for name, impl in QUANT_OPS.items():
        register_kernel(name, "cuda", f"{__name__}.quant:{impl}", dtypes=DTYPES)
