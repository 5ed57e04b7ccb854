"""How fast can a kernel only read each Qwen3-4B decode weight from HBM? (hbm_read.cu; GPU only)

The ceiling for any GEMV / skinny GEMM on that shape, set beside the engine's GEMV at M = 1:
  ldg            16-byte ld.global.nc loads, grid-stride, every resident thread (the GEMV's kind of load)
  bulk C/S       TMA bulk copies of C KiB into shared memory, S in flight per CTA, threads fold what landed
  gemv M=1       openinfer's GEMV (ops.linear), the same bytes
Each row cycles through enough copies of the weight to miss L2 (gemv_bench.weight_copies), as CUDA-graph replays.
    python scripts/hbm_read_bench.py [--output-json FILE]
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import cupy as cp
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gemv_bench import SHAPES_4B, graph_us, rand, weight_copies  # noqa: E402

from openinfer.kernels.cuda import module, ops  # noqa: E402

SOURCE = Path(__file__).with_name("hbm_read.cu")
BULK = ((16, 4), (16, 8), (32, 4), (32, 6), (64, 3))   # (KiB a copy, copies in flight a CTA)


def read_ldg(w: cp.ndarray, out: cp.ndarray) -> None:
    grid = module.blocks_per_sm(SOURCE, "read_ldg", 256) * module.sm_count()
    module.launch(SOURCE, "read_ldg", (grid,), 256, (w, np.int64(w.nbytes // 16), out))


def read_bulk(w: cp.ndarray, out: cp.ndarray, kib: int, stages: int) -> None:
    chunk, smem = kib * 1024, kib * 1024 * stages
    grid = module.blocks_per_sm(SOURCE, "read_bulk", 128, smem) * module.sm_count()
    module.launch(SOURCE, "read_bulk", (grid,), 128,
                  (w, np.int64(w.nbytes // chunk * chunk), np.int32(chunk), np.int32(stages), out), smem)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--output-json", default=None)
    a = ap.parse_args(argv)
    out = cp.zeros(1, cp.uint32)
    names = ["ldg"] + [f"bulk {k}/{s}" for k, s in BULK] + ["gemv M=1"]
    print(f"{'shape':<22} {'MB':>6} " + " ".join(f"{n:>14}" for n in names) + "   (us, TB/s)")
    rows = {}
    for name, (k, n) in SHAPES_4B.items():
        copies = weight_copies(2 * n * k)
        ws = [rand(n, k) for _ in range(copies)]
        x = rand(1, k)
        runs = [lambda w: read_ldg(w, out)] + [lambda w, kb=kb, s=s: read_bulk(w, out, kb, s) for kb, s in BULK]
        runs.append(lambda w: ops.linear(x, w))
        cp.cuda.Device().synchronize()
        us = [graph_us(lambda f=f: [f(w) for w in ws]) / copies for f in runs]
        nbytes = 2 * n * k
        rows[name] = dict(zip(names, us))
        print(f"{name + f' {k}->{n}':<22} {nbytes / 1e6:6.1f} "
              + " ".join(f"{u:7.1f} {nbytes / u / 1e6:5.2f}  " for u in us))
        del ws
    if a.output_json:
        Path(a.output_json).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
