"""Every distribution (the core and each plugins/*/pyproject.toml) builds a wheel and an sdist offline
(scripts/build_dists.sh --no-isolation, each wheel from its sdist), the wheels carry every file git tracks in their
packages, and they install into a fresh venv that serves each model line's tiny preset with the stock CLI."""
from __future__ import annotations

import os
import re
import subprocess
import sys
import sysconfig
import time
import zipfile
from pathlib import Path

import httpx
import pytest

from openinfer.bench.startup import wait_ready
from test_third_party_plugin import free_port

ROOT = Path(__file__).parents[1]
DISTS = [ROOT, *sorted(p.parent for p in ROOT.glob("plugins/*/pyproject.toml"))]


def project_name(dist: Path) -> str:
    return re.search(r'^name = "([^"]+)"', (dist / "pyproject.toml").read_text(), re.M).group(1)


def wheel_name(dist: Path) -> str:
    return project_name(dist).replace("-", "_")


@pytest.fixture(scope="module")
def wheelhouse(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("dist")
    env = {**os.environ, "OUT": str(out), "PYTHON": sys.executable}
    subprocess.run(["bash", str(ROOT / "scripts/build_dists.sh"), "--no-isolation"], env=env, check=True,
                   capture_output=True)
    return out


def test_every_distribution_builds_a_wheel_and_an_sdist(wheelhouse: Path) -> None:
    for dist in DISTS:
        name = wheel_name(dist)
        assert len(list(wheelhouse.glob(f"{name}-*-py3-none-any.whl"))) == 1, name
        assert len(list(wheelhouse.glob(f"{name}-*.tar.gz"))) == 1, name


def test_wheels_carry_every_tracked_package_file(wheelhouse: Path) -> None:
    """Kernel sources, tokenizers, chat templates: what the package data globs must not miss."""
    for dist in DISTS:
        [wheel] = wheelhouse.glob(f"{wheel_name(dist)}-*.whl")
        shipped = set(zipfile.ZipFile(wheel).namelist())
        base = dist / "core" if dist == ROOT else dist
        package = wheel_name(dist)
        tracked = subprocess.run(["git", "ls-files", package], cwd=base, capture_output=True, text=True,
                                 check=True).stdout.split()
        assert tracked, package
        assert sorted(set(tracked) - shipped) == [], package


def test_wheels_install_into_a_fresh_venv_and_serve(wheelhouse: Path, tmp_path: Path) -> None:
    """The third-party dependencies come from the environment running the tests (no registry); openinfer and the
    plugins only from the wheels."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", "--without-pip", str(venv)], check=True)
    py = venv / "bin" / "python"
    if sys.prefix != sys.base_prefix:   # this venv's dependencies, after the fresh one's own site-packages
        purelib = subprocess.run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                                 capture_output=True, text=True, check=True).stdout.strip()
        Path(purelib, "test-dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    wheels = sorted(map(str, wheelhouse.glob("*.whl")))
    subprocess.run([sys.executable, "-m", "pip", "--python", str(py), "install", "-q", "--no-deps", "--no-index",
                    *wheels], check=True, capture_output=True)
    where = subprocess.run([str(py), "-c", "import openinfer, openinfer_qwen3; print(openinfer.__file__)"],
                           capture_output=True, text=True, check=True).stdout
    assert where.startswith(str(venv))

    cli = str(venv / "bin" / "openinfer")
    listing = subprocess.run([cli, "plugins"], capture_output=True, text=True, check=True).stdout
    assert "failed to load" not in listing
    tiny = []
    for dist in DISTS[1:]:
        m = re.search(rf"\({project_name(dist)} [^)]+\) model lines: (.+)", listing)
        assert m, (project_name(dist), listing)
        for line in m.group(1).split(", "):
            listed = re.search(rf"^    {line} presets: (.+)$", listing, re.M).group(1)
            if "ships no tokenizer" in listed:   # its presets serve only with --tokenizer (a checkpoint brings one)
                continue
            presets = listed.split(", ")
            tiny += [p for p in presets if p.endswith("-tiny")][:1]   # a line's smallest shape, where it has one
    assert tiny
    port = free_port()
    args = [cli, "serve", "--port", str(port), "--load-format", "dummy", "--max-model-len", "256"]
    proc = subprocess.Popen(args + [a for p in tiny for a in ("--model", p)], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    base = f"http://127.0.0.1:{port}"
    try:
        try:
            wait_ready(base, proc, time.perf_counter(), timeout=120)
        except RuntimeError:
            proc.kill()
            pytest.fail(proc.stdout.read())
        assert sorted(m["id"] for m in httpx.get(f"{base}/v1/models").json()["data"]) == sorted(tiny)
        for model in tiny:
            r = httpx.post(f"{base}/v1/chat/completions", timeout=60, json={
                "model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3, "ignore_eos": True})
            assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 3, r.text
    finally:
        proc.terminate()
        proc.wait(timeout=10)
