"""Plugin isolation and checkpoint detection."""
from __future__ import annotations

import types

import pytest

from openinfer.contract.detect import DetectionError, detect_line
from openinfer.contract.hookspecs import hookimpl
from openinfer.kernels.registry import KernelPlanError
from openinfer.contract.plugins import Plugins


def _plugins() -> Plugins:
    return Plugins().load()


def test_qwen3_is_discovered_and_claims_its_config():
    p = _plugins()
    assert "qwen3" in p.lines
    assert detect_line({"model_type": "qwen3"}, p).name == "qwen3"


def test_broken_plugin_is_reported_and_others_survive():
    p = _plugins()

    from openinfer_qwen3.line import Qwen3Line

    class Copy(Qwen3Line):
        name = "qwen3-copy"

    class Broken:
        @hookimpl
        def register_model_lines(self, register):
            register(Copy)          # registers a line, then fails half-way
            raise RuntimeError("boom")

    p.register("broken", Broken())
    assert [e.plugin for e in p.errors] == ["broken"]
    assert "RuntimeError: boom" in p.errors[0].error
    assert "qwen3-copy" not in p.lines and p.line_owner["qwen3"] == "qwen3"
    assert detect_line({"model_type": "qwen3"}, p).name == "qwen3"


def test_failed_kernel_registration_is_rolled_back():
    p = _plugins()
    mod = types.SimpleNamespace()

    @hookimpl
    def register_kernels(register):
        register("rms_norm", "numpy", lambda *a: None, priority=100)
        raise ValueError("half-registered")

    mod.register_kernels = register_kernels
    p.register("halfway", mod)
    assert all(k.provider != "halfway" for k in p.kernels.candidates("rms_norm", "numpy", "float32"))


@pytest.mark.parametrize("model_type,package", [("qwen3_5", "openinfer-qwen35"),
                                                ("deepseek_v2", "openinfer-deepseek-v2-lite"),
                                                ("kimi_k2", "openinfer-kimi-k2"),
                                                ("deepseek_v3", "openinfer-kimi-k2"),
                                                ("glm_moe_dsa", "openinfer-glm52")])
def test_known_family_without_plugin_names_the_package(model_type, package):
    plugins = _plugins()
    for name in [n for n, line in plugins.lines.items() if line.probe({"model_type": model_type}).ok]:
        del plugins.lines[name]   # as if its package were not installed
    with pytest.raises(DetectionError) as e:
        detect_line({"model_type": model_type}, plugins)
    msg = str(e.value)
    folder = package.removeprefix("openinfer-").replace("-", "_")
    assert f"`pip install ./plugins/{folder}` in an openinfer checkout" in msg and f"{package} is not on PyPI" in msg
    assert "qwen3: model_type" in msg   # every installed line's reason is listed


def test_unknown_family_lists_reasons():
    with pytest.raises(DetectionError, match="no installed model line claims"):
        detect_line({"model_type": "mystery"}, _plugins())


def test_missing_op_fails_at_resolve_naming_it():
    with pytest.raises(KernelPlanError, match="no_such_op"):
        _plugins().kernels.resolve(["rms_norm", "no_such_op"], "numpy", "float32")


def test_every_line_that_forces_calls_holds_parallel_tool_calls_false_to_one():
    """The ChatFormat contract for forced calls: a line that gives a grammar for them takes `parallel` (the server
    passes parallel_tool_calls), and for "required" without it the start rule repeats no call (it ends after the
    first); a line may hold one call either way (Kimi's section tokens)."""
    tools = [{"type": "function", "function": {"name": "f", "parameters": {
        "type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}}}]
    forcing = 0
    for name, line in _plugins().lines.items():
        fmt = line.chat_format()
        if fmt.tool_call_opener(None) is None or fmt.tool_call_grammar(tools, None) is None:
            continue
        forcing += 1
        start = fmt.tool_call_grammar(tools, None, False).splitlines()[0]
        assert start.startswith("start:") and "*" not in start, (name, start)
        assert fmt.tool_call_grammar(tools, "f", False) is not None, name
    assert forcing >= 2   # Qwen3 and Qwen3.5 at least
