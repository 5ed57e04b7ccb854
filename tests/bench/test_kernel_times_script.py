"""scripts/gpu_kernel_times.py (the step that scripts/gpu_ncu.sh profiles) brings each scenario to the step it names,
checked on the CPU: a prefill of several prompts in one step over an fp8 KV cache, and a decode step."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "gpu_kernel_times.py"


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), "qwen3-tiny", *args, "--device", "cpu"], capture_output=True,
                          text=True, timeout=300)


@pytest.mark.parametrize("args,rows,tokens", [(("prefill", "48", "--prompts", "3", "--kv-cache-dtype", "fp8"), 3, 144),
                                              (("decode", "4", "--context", "40"), 4, 4)])
def test_the_profiled_step_is_the_scenario(args, rows, tokens) -> None:
    done = _run(*args)
    assert done.returncode == 0, done.stderr[-2000:]
    assert f"profiled step: {rows} rows, {tokens} tokens" in done.stdout


def test_an_unknown_cache_dtype_is_a_usage_error() -> None:
    done = _run("prefill", "16", "--kv-cache-dtype", "int4")
    assert done.returncode == 2 and "--kv-cache-dtype" in done.stderr
