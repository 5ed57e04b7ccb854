"""CPU checks of scripts/gemv_chain_bench.py and its kernel (no GPU): the decode chain's shapes, the
persistent kernel's unit assignment (every unit once, each CTA in op order), the struct Op layout, and
gemv_chain.cu compiling for sm_90a with its three kernels in it."""
from __future__ import annotations

import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))
import gemv_chain_bench as bench  # noqa: E402
from openinfer.kernels.cuda import compile as kc  # noqa: E402


def test_the_chain_is_a_qwen3_4b_decode_step():
    shapes = bench.chain_shapes(36)
    assert len(shapes) == 145 and shapes[:4] == [(6144, 2560), (2560, 4096), (19456, 2560), (2560, 9728)]
    assert shapes[-1] == (151936, 2560)
    assert sum(2 * n * k for n, k in shapes) == 8_044_544_000   # the 1.87 ms floor at 4.3 TB/s
    assert all(n % bench.ROWS == 0 and k % 8 == 0 for n, k in shapes)


@pytest.mark.parametrize("grid", [792, 528, 100, 7])
def test_every_unit_goes_to_one_cta_in_op_order(grid):
    shapes = bench.chain_shapes(2)
    taken = [bench.units_of(c, grid, shapes) for c in range(grid)]
    flat = [u for units in taken for u in units]
    assert sorted(flat) == [(i, t) for i, (n, _) in enumerate(shapes) for t in range(n // bench.ROWS)]
    assert all(units == sorted(units) for units in taken)   # op by op, so every wait ends
    # global unit u belongs to CTA u % grid
    bases = bench.unit_bases(shapes)
    assert all((bases[i] + t) % grid == c for c, units in enumerate(taken) for i, t in units)


def test_op_table_matches_struct_op():
    assert bench.OP_DTYPE.itemsize == 32 and [bench.OP_DTYPE.fields[f][1] for f in ("w", "x", "y", "n", "k")] == \
        [0, 8, 16, 24, 28]
    arr = lambda ptr, *shape: SimpleNamespace(data=SimpleNamespace(ptr=ptr), shape=shape)  # noqa: E731
    ops = bench.op_table([arr(0x1000, 32, 16)], [arr(0x2000, 16)], [arr(0x3000, 32)])
    raw = np.frombuffer(ops.tobytes(), np.uint64)
    assert list(raw[:3]) == [0x1000, 0x2000, 0x3000] and list(np.frombuffer(ops.tobytes()[24:], np.int32)) == [32, 16]


def test_the_kernels_compile_for_sm90a(tmp_path, monkeypatch):
    monkeypatch.setenv("OPENINFER_CACHE_DIR", str(tmp_path))
    try:
        kc._nvrtc()
    except kc.KernelCompileError as e:
        pytest.skip(f"no NVRTC library to compile with: {e}")
    cubin = kc.compile_source(bench.SOURCE, "sm_90a").read_bytes()
    assert cubin[:4] == b"\x7fELF" and all(f"{k}\0".encode() in cubin for k in ("gemv_chain", "gemv_units", "gemv_stream"))
