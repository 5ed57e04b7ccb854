"""Plugins reach the core only through the declared plugin API.

Every package under plugins/*/ (and the example plugin) may import `openinfer.plugin_api` and
`openinfer.plugin_api.cuda`; nothing else of the core, neither by import statement nor by a lazy "module:attr"
registration string. Its tests (plugins/<name>/tests/) may use `openinfer.testing` and its modules too. Its CUDA
sources may include their own headers and the core headers that `openinfer.plugin_api.cuda.HEADERS` declares. New
plugins are found by walking plugins/, so they are held to it too.
"""
from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
ALLOWED = ("openinfer.plugin_api", "openinfer.plugin_api.cuda")
CORE_REF = re.compile(r"^openinfer(\.[A-Za-z_]\w*)*:[\w.]+$")   # a lazy "module:attr" reference
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)


def plugin_packages() -> list[Path]:
    """Every plugin's import packages: folders with an __init__.py under plugins/<name>/ (tests and build output
    left out), and the example plugin's."""
    found = []
    for root in sorted((ROOT / "plugins").iterdir()) + [ROOT / "tests" / "example_plugin"]:
        if not root.is_dir():
            continue
        for init in sorted(root.glob("*/__init__.py")):
            if init.parent.name != "tests" and not init.parent.name.endswith(".egg-info"):
                found.append(init.parent)
    return found


def declared_headers() -> tuple[str, ...]:
    """HEADERS of openinfer.plugin_api.cuda, read without importing it (it imports CuPy)."""
    tree = ast.parse((ROOT / "core" / "openinfer" / "plugin_api" / "cuda.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", "") == "HEADERS" for t in node.targets):
            return tuple(ast.literal_eval(node.value))
    raise AssertionError("openinfer.plugin_api.cuda declares no HEADERS")


def core_references(source: str, allowed: tuple[str, ...] = ALLOWED) -> list[str]:
    """The core modules `source` reaches past `allowed`: imports (top level or inside functions) and "module:attr"
    strings naming an openinfer module."""
    found = []
    for node in ast.walk(ast.parse(source)):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and CORE_REF.match(node.value):
            names = [node.value.partition(":")[0]]
        found += [f"line {node.lineno}: {n}" for n in names
                  if (n == "openinfer" or n.startswith("openinfer.")) and n not in allowed]
    return found


def test_the_checks_find_a_plugin_reaching_past_the_api():
    src = ("from openinfer.plugin_api import ModelLine\nimport openinfer.engine.engine\n"
           "def f():\n    from openinfer.kernels.cuda.module import launch\n"
           "REF = 'openinfer.kernels.cuda.ops:linear'\n")
    assert [r.split(": ")[1] for r in core_references(src)] == [
        "openinfer.engine.engine", "openinfer.kernels.cuda.module", "openinfer.kernels.cuda.ops"]
    assert core_references("from openinfer_qwen3.chat import X\nfrom openinfer.plugin_api.cuda import launch\n") == []


def test_plugins_are_found():
    names = {p.name for p in plugin_packages()}
    assert {"openinfer_qwen3", "openinfer_qwen35", "openinfer_example"} <= names


@pytest.mark.parametrize("package", plugin_packages(), ids=lambda p: p.name)
def test_plugin_imports_only_the_plugin_api(package: Path):
    bad = {str(f.relative_to(ROOT)): refs for f in sorted(package.rglob("*.py"))
           if (refs := core_references(f.read_text()))}
    assert not bad, f"{package.name} reaches past openinfer.plugin_api: {bad}; re-export what it needs there"


@pytest.mark.parametrize("package", plugin_packages(), ids=lambda p: p.name)
def test_plugin_tests_import_only_the_api_and_the_testing_kit(package: Path):
    tests = package.parent / "tests"
    bad = {}
    for f in sorted(tests.rglob("*.py")) if tests.is_dir() else []:
        refs = [r for r in core_references(f.read_text(), ALLOWED + ("openinfer.testing",))
                if not r.split(": ")[1].startswith("openinfer.testing.")]
        if refs:
            bad[str(f.relative_to(ROOT))] = refs
    assert not bad, f"{package.name}'s tests reach past openinfer.plugin_api and openinfer.testing: {bad}"


@pytest.mark.parametrize("package", plugin_packages(), ids=lambda p: p.name)
def test_plugin_cuda_sources_include_only_declared_core_headers(package: Path):
    headers = set(declared_headers())
    core = ROOT / "core" / "openinfer" / "kernels" / "cuda"
    bad = {}
    for f in sorted([*package.rglob("*.cu"), *package.rglob("*.cuh")]):
        for name in INCLUDE.findall(f.read_text()):
            if not (f.parent / name).exists() and name not in headers:
                bad.setdefault(str(f.relative_to(ROOT)), []).append(name)
    assert not bad, f"{package.name} includes undeclared core headers: {bad}"
    assert all((core / h).exists() for h in headers)
