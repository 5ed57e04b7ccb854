"""Kernel choice through the registry: each op gets its highest-priority applicable implementation (backend, dtype,
GPU generation), `--kernel OP=IMPL` picks another by name on serve / generate / bench latency / plugins --plan, and
a choice that does not apply fails at load naming what would."""
from __future__ import annotations

import json

import pytest

from openinfer.cli import build_parser, main
from openinfer.engine.engine import EngineArgs, build_engine
from openinfer.kernels import cuda as cuda_kernels
from openinfer.kernels.registry import KernelPlanError, KernelRegistry, parse_kernel_overrides
from openinfer.contract.plugins import get_plugins


def fast(*a):
    return "fast"


def slow(*a):
    return "slow"


def hopper_only(*a):
    return "hopper"


@pytest.fixture
def registry() -> KernelRegistry:
    reg = KernelRegistry()
    reg.register("attend", "cuda", slow, dtypes=("bfloat16", "float32"), name="portable")
    reg.register("attend", "cuda", fast, dtypes=("bfloat16",), priority=10, name="tensor")
    reg.register("attend", "cuda", hopper_only, dtypes=("bfloat16",), priority=20, name="sm90", capabilities=(90,))
    reg.register("norm", "cuda", slow)
    return reg


def test_the_highest_priority_implementation_that_applies_wins(registry):
    assert registry.resolve(["attend"], "cuda", "bfloat16", 90).attend() == "hopper"
    assert registry.resolve(["attend"], "cuda", "bfloat16", 80).attend() == "fast"   # sm90 needs capability 90
    assert registry.resolve(["attend"], "cuda", "float32", 90).attend() == "slow"    # the only float32 one
    assert registry.resolve(["norm"], "cuda", "bfloat16").norm() == "slow"           # unnamed: the provider's name


def test_an_override_picks_an_applicable_implementation_by_name(registry):
    ops = registry.resolve(["attend", "norm"], "cuda", "bfloat16", 90, {"attend": "portable"})
    assert ops.attend() == "slow"
    plan = ops.describe()
    assert plan["attend"].startswith("portable: ") and "also: sm90, tensor" in plan["attend"]
    assert plan["norm"].startswith("openinfer: ") and "also" not in plan["norm"]


def test_an_override_that_does_not_apply_names_the_choices(registry):
    with pytest.raises(KernelPlanError, match=r"attend=sm90: .* choose one of tensor, portable"):
        registry.resolve(["attend"], "cuda", "bfloat16", 80, {"attend": "sm90"})
    with pytest.raises(KernelPlanError, match="op\\(s\\) rope that this model does not call"):
        registry.resolve(["attend"], "cuda", "bfloat16", 90, {"rope": "x"})


@pytest.mark.parametrize("specs,error", [(["attend"], "write OP=NAME"), (["=x"], "write OP=NAME"),
                                         (["a=x", "a=y"], "names op 'a' twice")])
def test_kernel_flag_values_are_checked(specs, error):
    with pytest.raises(ValueError, match=error):
        parse_kernel_overrides(specs)
    assert parse_kernel_overrides(["a = x", "b=y"]) == {"a": "x", "b": "y"}


def test_paged_attention_has_three_cuda_implementations():
    """wgmma on sm_90 only, mma for bf16 elsewhere, the CUDA-core kernels for float32 (and on request)."""
    reg = KernelRegistry()
    cuda_kernels.register(reg.register)

    def names(dtype, cc):
        return [k.name for k in reg.candidates("paged_attention", "cuda", dtype, cc)]
    assert names("bfloat16", 90) == ["wgmma", "mma", "cuda_cores"]
    assert names("bfloat16", 100) == names("bfloat16", 80) == ["mma", "cuda_cores"]
    assert names("float32", 90) == ["cuda_cores"]


def test_moe_experts_has_three_cuda_implementations():
    """"cublas" (cuBLAS per expert for prefill-sized eager steps, the grouped GEMMs otherwise: moe_blas.py) ahead of
    "wgmma" (the grouped GEMMs' wide tiles on warpgroup MMA, sm_90 only) and "grouped" (always the grouped GEMMs on
    mma.sync), all bf16 only; `--kernel moe_experts=grouped` picks the last."""
    reg = KernelRegistry()
    cuda_kernels.register(reg.register)
    found = reg.candidates("moe_experts", "cuda", "bfloat16", 90)
    assert [(k.name, k.impl) for k in found] == [("cublas", "openinfer.kernels.cuda.moe_blas:moe_experts"),
                                                ("wgmma", "openinfer.kernels.cuda.moe:moe_experts_wgmma"),
                                                ("grouped", "openinfer.kernels.cuda.moe:moe_experts")]
    assert [k.name for k in reg.candidates("moe_experts", "cuda", "bfloat16", 100)] == ["cublas", "grouped"]
    assert not reg.candidates("moe_experts", "cuda", "float32", 90)
    plan = reg.resolve(["moe_experts"], "cuda", "bfloat16", 90, {"moe_experts": "grouped"}).describe()
    assert plan["moe_experts"].startswith("grouped: ") and "also: cublas" in plan["moe_experts"]


@pytest.mark.parametrize("command", [["serve"], ["generate", "hi"], ["bench", "latency"], ["plugins"]])
def test_every_engine_command_takes_kernel_flags(command):
    a = build_parser().parse_args([*command, "--kernel", "paged_attention=mma", "--kernel", "linear=x"])
    assert parse_kernel_overrides(a.kernel) == {"paged_attention": "mma", "linear": "x"}


@pytest.fixture
def tiny_dir(tmp_path):
    line = get_plugins().lines["qwen3"]
    (tmp_path / "config.json").write_text(json.dumps(line.presets["qwen3-tiny"]))
    return tmp_path


def test_plan_shows_the_choice_and_takes_overrides(tiny_dir, capsys):
    assert main(["plugins", "--plan", str(tiny_dir), "--kernel", "rms_norm=openinfer"]) == 0
    out = capsys.readouterr().out
    assert "kernel plan of" in out and "rms_norm" in out and "openinfer: openinfer.kernels.numpy_ops" in out
    assert main(["plugins", "--plan", str(tiny_dir), "--kernel", "rms_norm=nope"]) == 1
    assert "rms_norm=nope" in capsys.readouterr().err


def test_an_engine_with_an_unknown_implementation_fails_at_load():
    with pytest.raises(KernelPlanError, match="paged_attention=wgmma: no implementation of that name applies"):
        build_engine(None, EngineArgs(kernels={"paged_attention": "wgmma"}, kv_cache_memory_gib=0.01))
