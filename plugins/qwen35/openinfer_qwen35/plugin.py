"""openinfer entry point of the qwen35 plugin: the model line, its numpy ops and their CUDA kernels."""
from openinfer.plugin_api import hookimpl

from . import cuda
from .ops import OPS


@hookimpl
def register_model_lines(register) -> None:
    register("openinfer_qwen35.line:Qwen35Line")


@hookimpl
def register_kernels(register) -> None:
    for op in OPS:
        register(op, "numpy", f"openinfer_qwen35.ops:{op}", dtypes=("float32",))
    cuda.register(register)
