"""openinfer entry point of the kimi_k2 plugin."""
from openinfer.plugin_api import hookimpl


@hookimpl
def register_model_lines(register) -> None:
    register("openinfer_kimi_k2.line:KimiK2Line")
