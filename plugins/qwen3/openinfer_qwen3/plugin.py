"""openinfer entry point of the qwen3 plugin."""
from openinfer.plugin_api import hookimpl


@hookimpl
def register_model_lines(register) -> None:
    register("openinfer_qwen3.line:Qwen3Line")
