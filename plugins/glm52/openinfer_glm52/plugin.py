"""openinfer entry point of the glm52 plugin: the model line and its DSA ops."""
from openinfer.plugin_api import hookimpl

from .ops import OPS


@hookimpl
def register_model_lines(register) -> None:
    register("openinfer_glm52.line:Glm52Line")


@hookimpl
def register_kernels(register) -> None:
    for op in OPS:
        register(op, "numpy", f"openinfer_glm52.ops:{op}", dtypes=("float32",))
