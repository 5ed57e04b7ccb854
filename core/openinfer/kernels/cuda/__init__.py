"""CUDA kernels for the shared ops: .cu sources compiled by NVRTC (compile.py), CuPy wrappers (ops.py).

Importing this package touches neither cupy nor the GPU: ops are registered as lazy
"module:attr" strings, loaded only when a model resolves its plan on the cuda backend.
"""
from __future__ import annotations

OPS = ("embedding", "linear", "rms_norm", "add_rms_norm", "rope", "qk_norm_rope", "silu_mul", "linear_silu_mul",
       "write_kv", "rope_write_kv", "gather_rows", "argmax", "top_logprobs")
DTYPES = ("bfloat16", "float32")
# the MLA and MoE ops (bf16 models): op -> its module
BF16_OPS = {"mla_rope": "mla", "mla_write_latent": "mla", "mla_rope_write": "mla", "mla_attention": "mla",
            "mla_gather_latent": "mla", "mla_pack_heads": "mla", "per_head_linear": "blas",
            "router_logits": "moe", "moe_route": "moe", "moe_router": "moe"}
# paged_attention's implementations (attention.py): name, function, dtypes, priority, GPU generations
ATTENTION = (("wgmma", "paged_attention", ("bfloat16",), 20, (90,)),
             ("mma", "paged_attention_mma", ("bfloat16",), 10, ()),
             ("cuda_cores", "paged_attention_cuda_cores", DTYPES, 0, ()))
# moe_experts' implementations: name, "module:function", priority, GPU generations. "cublas" takes prefill-sized eager
# steps through cuBLAS and hands every other call to the grouped GEMMs (moe_blas.py states the rule); "wgmma" runs
# the grouped GEMMs with their 128-row tiles on warpgroup MMA, "grouped" on mma.sync.
MOE_EXPERTS = (("cublas", "moe_blas:moe_experts", 10, ()), ("wgmma", "moe:moe_experts_wgmma", 5, (90,)),
               ("grouped", "moe:moe_experts", 0, ()))


# ops on quantized weights (quant.py): op name -> its wrapper
QUANT_OPS = {"linear_int4": "linear_quant", "linear_fp8": "linear_quant", "moe_experts_int4": "moe_experts_quant",
             "moe_experts_fp8": "moe_experts_quant"}


def register(register_kernel) -> None:
    """Registers every op above, paged_attention's and moe_experts' implementations and `beside` / `joined` (a side
    stream), for backend "cuda" (called through the core's own hookimpl)."""
    for name in OPS:
        register_kernel(name, "cuda", f"{__name__}.ops:{name}", dtypes=DTYPES)
    for name, module in BF16_OPS.items():
        register_kernel(name, "cuda", f"{__name__}.{module}:{name}", dtypes=("bfloat16",))
    for name, ref, priority, capabilities in MOE_EXPERTS:
        register_kernel("moe_experts", "cuda", f"{__name__}.{ref}", dtypes=("bfloat16",), priority=priority, name=name,
                        capabilities=capabilities)
    for name, fn, dtypes, priority, capabilities in ATTENTION:
        register_kernel("paged_attention", "cuda", f"{__name__}.attention:{fn}", dtypes=dtypes, priority=priority,
                        name=name, capabilities=capabilities)
    register_kernel("beside", "cuda", f"{__name__}.beside:beside", dtypes=DTYPES)
    register_kernel("joined", "cuda", f"{__name__}.beside:ready", dtypes=DTYPES)
    for name, impl in QUANT_OPS.items():
        register_kernel(name, "cuda", f"{__name__}.quant:{impl}", dtypes=DTYPES)
