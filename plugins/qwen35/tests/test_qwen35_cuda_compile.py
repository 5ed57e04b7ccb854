"""CPU-only checks of the qwen35 CUDA kernels: every .cu compiles to an sm_90a cubin with NVRTC
(no GPU needed), every kernel a launcher names exists, the sources ship as package data, and the
ops register lazily for backend "cuda" (importing the plugin touches no GPU library)."""
from __future__ import annotations

import fnmatch
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from openinfer.plugin_api import KernelRegistry
from openinfer.testing.cuda import compile_cubin, require_nvrtc
from openinfer_qwen35 import cuda, plugin
from openinfer_qwen35.ops import OPS

KERNEL_DIR = Path(cuda.__file__).parent
PLUGIN_ROOT = KERNEL_DIR.parents[1]
# launcher constants -> .cu stem
SOURCES = {"SOURCE": "delta_rule", "CHUNK_SOURCE": "delta_rule_chunk", "CONV": "conv", "GATES": "gates"}


@pytest.fixture
def cubins(tmp_path, monkeypatch) -> dict[str, bytes]:
    require_nvrtc()
    monkeypatch.setenv("OPENINFER_CACHE_DIR", str(tmp_path))
    return {p.stem: compile_cubin(p) for p in sorted(KERNEL_DIR.glob("*.cu"))}


def test_every_source_compiles_to_sm90a_cubin(cubins):
    assert set(cubins) == {"conv", "delta_rule", "delta_rule_chunk", "gates"}
    assert all(data[:4] == b"\x7fELF" for data in cubins.values())


def test_every_launched_kernel_exists(cubins):
    launched = set()
    for py in KERNEL_DIR.glob("*.py"):
        for const, name in re.findall(r'launch\((\w+), f"(\w+)_\{(?:suffix\([\w.]+\)|sfx)\}"', py.read_text()):
            launched |= {(SOURCES[const], f"{name}_{dt}") for dt in ("bf16", "f32")}
    assert len(launched) == 22   # 11 kernels, two dtypes
    for source, name in launched:
        assert name.encode() + b"\0" in cubins[source], f"{source}.cu has no kernel {name}"


def test_sources_ship_as_package_data():
    data = tomllib.loads((PLUGIN_ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]
    patterns = data["openinfer_qwen35"]
    for path in [*KERNEL_DIR.glob("*.cu"), *KERNEL_DIR.glob("*.cuh")]:
        rel = path.relative_to(PLUGIN_ROOT / "openinfer_qwen35").as_posix()
        assert any(fnmatch.fnmatch(rel, p) for p in patterns), f"{rel} is not package data"


def test_registered_lazily_for_cuda():
    reg = KernelRegistry()
    plugin.register_kernels(reg.register)
    for op in OPS:
        for dtype in cuda.DTYPES:
            assert reg.candidates(op, "cuda", dtype)[0].impl == f"openinfer_qwen35.cuda.ops:{op}"
        assert reg.candidates(op, "numpy", "float32")[0].impl == f"openinfer_qwen35.ops:{op}"
    code = ("import sys, openinfer_qwen35.plugin; "
            "bad = [m for m in ('cupy', 'cuda') if m in sys.modules]; assert not bad, bad")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_chunk_kernels_fit_hopper_shared_memory():
    pytest.importorskip("cupy")
    pytest.importorskip("ml_dtypes")
    from openinfer_qwen35.cuda.delta_rule import STATE_SMEM, prep_smem
    assert STATE_SMEM <= 227 * 1024   # the opt-in limit per block on sm_90
    # two prep blocks per SM (its __launch_bounds__), 1 KB reserved each, at Qwen3.5's head width in bf16
    assert 2 * (prep_smem(128, 2) + 1024) <= 228 * 1024
    assert prep_smem(256, 4) <= 227 * 1024   # the widest heads in float32 still fit one
