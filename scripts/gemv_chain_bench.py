"""Can one persistent kernel run the batch-1 decode's GEMV chain faster than a kernel per GEMV? (gemv_chain.cu)

The 145 GEMVs of a Qwen3-4B decode step (36 x qkv, o, gate_up, down, then lm_head; 8.04 GB of bf16 weights, a
1.87 ms floor at 4.3 TB/s), M = 1, each op with its own x, timed as CUDA-graph replays (CUDA events, median):
  units        gemv_units, one launch per op (the same unit code as the chain: the baseline)
  chain        gemv_chain, one persistent launch: CTAs flow from one op into the next, waiting on counters
  chain+pf     the same, each CTA prefetching its next unit's weights into L2 before it waits
  stream S/B   gemv_stream, one persistent launch, a CTA a SM: the weights copied (cp.async.bulk) into a ring of S
               slots of B KiB by a producer warp that runs ahead across op boundaries, the math by 4 or 8 warps
               (stream_mma: on the tensor cores, as the engine's GEMV)
  engine       openinfer's GEMV (blas.gemv, tensor cores, split-K), one launch per op, for reference
Checks first: units and both chains give bit-identical outputs on the real chain (stream, which sums in another
order, within bf16 rounding of units), and on a chain of square GEMVs where op i + 1 reads op i's output (x = the
previous y), all of them match a numpy reference.
    python scripts/gemv_chain_bench.py [--layers 36] [--repeats 10] [--output-json FILE]
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Callable

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gemm_algos_bench import SHAPES_4B  # noqa: E402  (K, N) of each projection
from openinfer.testing.cuda import graph_ms  # noqa: E402

SOURCE = Path(__file__).with_name("gemv_chain.cu")
ROWS = 16                                           # rows of w a unit takes (gemv_chain.cu)
# gemv_stream's builds (4 or 8 consumer warps; _r1: a chunk a row at a time) and rings (slots, KiB a slot); the
# slots a multiple of the warps
STREAM_RINGS = (("gemv_stream_w4_r1", 4, 48), ("gemv_stream_w4", 4, 48), ("gemv_stream_w8_r1", 8, 24),
                ("gemv_stream", 8, 24), ("gemv_stream_mma", 8, 24), ("gemv_stream_mma", 16, 12))
OP_DTYPE = np.dtype([("w", "<u8"), ("x", "<u8"), ("y", "<u8"), ("n", "<i4"), ("k", "<i4")])   # struct Op
LAYER = ("qkv", "o", "gate_up", "down")
HBM_BYTES_PER_S = 4.3e12


def chain_shapes(layers: int) -> list[tuple[int, int]]:
    """(N, K) of each op of a decode step, in order."""
    nk = {name: (n, k) for name, (k, n) in SHAPES_4B.items()}
    return [nk[name] for _ in range(layers) for name in LAYER] + [nk["lm_head"]]


def unit_bases(shapes: list[tuple[int, int]]) -> np.ndarray:
    """The global number of each op's first unit (gemv_chain's unit_base)."""
    return np.concatenate(([0], np.cumsum([n // ROWS for n, _ in shapes])[:-1])).astype(np.int32)


def units_of(cta: int, grid: int, shapes: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """(op, unit) pairs CTA `cta` of `grid` takes, in its order: the kernel's assignment, for the CPU test."""
    out = []
    for i, (base, (n, _)) in enumerate(zip(unit_bases(shapes), shapes)):
        out += [(i, t) for t in range((cta - int(base) % grid + grid) % grid, n // ROWS, grid)]
    return out


def op_table(ws: list, xs: list, ys: list) -> np.ndarray:
    """The struct Op array of device pointers and sizes."""
    ops = np.zeros(len(ws), OP_DTYPE)
    for i, (w, x, y) in enumerate(zip(ws, xs, ys)):
        ops[i] = (w.data.ptr, x.data.ptr, y.data.ptr, w.shape[0], w.shape[1])
    return ops


class Chain:
    """Device weights, inputs and outputs of a list of ops, and the ways to run them."""

    def __init__(self, shapes: list[tuple[int, int]], chained: bool, seed: int = 0) -> None:
        import cupy as cp
        from openinfer.kernels.cuda import module
        self.cp, self.module, self.shapes = cp, module, shapes
        rng = cp.random.default_rng(seed)
        self.ws = [(rng.standard_normal((n, k), dtype=cp.float32) / np.sqrt(k)).astype(module.BF16) for n, k in shapes]
        self.ys = [cp.zeros(n, module.BF16) for n, _ in shapes]
        self.xs = [rng.standard_normal(k, dtype=cp.float32).astype(module.BF16) for _, k in shapes]
        if chained:   # op i + 1 reads op i's output
            self.xs = self.xs[:1] + self.ys[:-1]
        self.ops = cp.asarray(op_table(self.ws, self.xs, self.ys).view(np.uint8))
        self.bases = cp.asarray(unit_bases(shapes))
        self.done = cp.zeros(len(shapes), cp.int32)
        self.grid = module.blocks_per_sm(SOURCE, "gemv_chain", 128) * module.sm_count()

    def units(self) -> None:
        for i, (n, _) in enumerate(self.shapes):
            self.module.launch(SOURCE, "gemv_units", (n // ROWS,), 128, (self.ops, np.int32(i)))

    def chain(self, prefetch: bool) -> None:
        stream = self.cp.cuda.get_current_stream()
        self.cp.cuda.runtime.memsetAsync(self.done.data.ptr, 0, self.done.nbytes, stream.ptr)
        self.module.launch(SOURCE, "gemv_chain", (self.grid,), 128,
                           (self.ops, self.bases, np.int32(len(self.shapes)), self.done, np.int32(prefetch)))

    def stream(self, stages: int, kib: int, kernel: str = "gemv_stream") -> None:
        stream = self.cp.cuda.get_current_stream()
        self.cp.cuda.runtime.memsetAsync(self.done.data.ptr, 0, self.done.nbytes, stream.ptr)
        smem = stages * kib * 1024 + 2 * max(k for _, k in self.shapes) + 64
        block = 160 if "_w4" in kernel else 288   # the consumer warps and the producer's
        self.module.launch(SOURCE, kernel, (self.module.sm_count(),), block,
                           (self.ops, np.int32(len(self.shapes)), self.done, np.int32(stages),
                            np.int32(kib * 1024)), smem)

    def engine(self) -> None:
        from openinfer.kernels.cuda import blas
        for w, x, y in zip(self.ws, self.xs, self.ys):
            blas.gemv(x.reshape(1, -1), w, y.reshape(1, -1))

    def variants(self) -> list[tuple[str, Callable[[], None]]]:
        """The ways to run the ops that compute the same bits."""
        return [("units", self.units), ("chain", lambda: self.chain(False)), ("chain+pf", lambda: self.chain(True))]

    def streams(self) -> list[tuple[str, Callable[[], None]]]:
        """gemv_stream at each ring depth: the same sums in another order."""
        row = 2 * max(k for _, k in self.shapes)   # a slot holds at least one row (the mma build's padded by 64 bytes)
        return [(f"{k[5:]} {s}/{kib}", lambda k=k, s=s, kib=kib: self.stream(s, kib, k))
                for k, s, kib in STREAM_RINGS if kib * 1024 >= row + (64 if k.endswith("_mma") else 0)]

    def outputs(self, fn: Callable[[], None]) -> list[np.ndarray]:
        """Every op's y (bf16) after fn() ran on zeroed outputs."""
        for y in self.ys:
            y.fill(0)
        fn()
        return [self.cp.asnumpy(y) for y in self.ys]


def reference_chain(c: Chain) -> np.ndarray:
    """numpy: each op in float64 from the bf16 weights, its output rounded to bf16 as the next input."""
    import ml_dtypes
    x = c.cp.asnumpy(c.xs[0]).astype(np.float64)
    for w in c.ws:
        x = (c.cp.asnumpy(w).astype(np.float64) @ x).astype(ml_dtypes.bfloat16).astype(np.float64)
    return x


def check(layers: int) -> list[str]:
    """Failures (empty: all passed): bit-identical units / chain / chain+prefetch on the real shapes (2 layers),
    and all three against numpy on 8 chained square ops."""
    failures = []
    c = Chain(chain_shapes(min(layers, 2)), chained=False)
    runs = {name: c.outputs(fn) for name, fn in c.variants()}
    for name in ("chain", "chain+pf"):
        if any(not np.array_equal(a.view(np.uint16), b.view(np.uint16)) for a, b in zip(runs["units"], runs[name])):
            failures.append(f"{name} differs from units on the real shapes")
    for name, fn in c.streams():
        for i, (a, b) in enumerate(zip(runs["units"], c.outputs(fn))):
            a, b = a.astype(np.float64), b.astype(np.float64)
            if not np.allclose(b, a, rtol=1e-2, atol=1e-2 * np.abs(a).max()):
                failures.append(f"{name} op {i}: max |diff| from units {np.abs(b - a).max():.3g}")
                break
    sq = Chain([(1024, 1024)] * 8, chained=True, seed=1)
    want = reference_chain(sq)
    for name, fn in sq.variants() + sq.streams():
        got = sq.outputs(fn)[-1].astype(np.float64)
        if not np.allclose(got, want, rtol=3e-2, atol=3e-2 * np.abs(want).max()):
            failures.append(f"{name} on the chained square ops: max |diff| {np.abs(got - want).max():.3g}")
    return failures


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--layers", type=int, default=36)
    ap.add_argument("--repeats", type=int, default=10)
    ap.add_argument("--output-json", default=None)
    a = ap.parse_args(argv)
    import cupy as cp
    failures = check(a.layers)
    print("checks:", "passed" if not failures else "; ".join(failures))
    shapes = chain_shapes(a.layers)
    c = Chain(shapes, chained=False)
    nbytes = sum(2 * n * k for n, k in shapes)
    print(f"{cp.cuda.runtime.getDeviceProperties(0)['name'].decode()}: {len(shapes)} GEMVs, {nbytes / 1e9:.2f} GB, "
          f"floor {nbytes / HBM_BYTES_PER_S * 1e3:.2f} ms; persistent grid {c.grid} CTAs")
    rows = {}
    for name, fn in c.variants() + c.streams() + [("engine", c.engine), ("units again", c.units)]:
        ms = graph_ms(fn, a.repeats)
        rows[name] = ms
        floor = nbytes / HBM_BYTES_PER_S * 1e3
        print(f"{name:20s} {ms:8.3f} ms  {nbytes / ms / 1e9:6.2f} TB/s  {floor / ms:5.1%} of floor")
    if a.output_json:
        Path(a.output_json).write_text(json.dumps({"gemvs": len(shapes), "bytes": nbytes, "grid": c.grid,
                                                   "checks": failures, "ms": rows}, indent=1))


if __name__ == "__main__":
    main()
