"""openinfer entry point of the glm52 plugin: the model line, its DSA ops and their CUDA kernels."""
from openinfer.plugin_api import hookimpl

from . import cuda
from .ops import OPS


@hookimpl
def register_model_lines(register) -> None:
    register("openinfer_glm52.line:Glm52Line")


@hookimpl
def register_kernels(register) -> None:
    for op in OPS:
        register(op, "numpy", f"openinfer_glm52.ops:{op}", dtypes=("float32",))
    cuda.register(register)
