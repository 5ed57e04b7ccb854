"""openinfer entry point of the deepseek_v2_lite plugin."""
from openinfer.plugin_api import hookimpl


@hookimpl
def register_model_lines(register) -> None:
    register("openinfer_deepseek_v2_lite.line:DeepseekV2Line")
