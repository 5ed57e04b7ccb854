"""GEMV vs cuBLAS on Qwen3 decode shapes, and the 145-GEMM Qwen3-4B decode chain (GPU only).

    python scripts/gemv_bench.py            # the table gpu_kernels.sh prints
    python scripts/gemv_bench.py --sweep    # also tries the GEMV knobs (kernel variant, split-K fill) on the chain
    python scripts/gemv_bench.py --splits   # only each Qwen3-4B/Qwen3.5-4B shape at M = 1 under every split-K factor
    python scripts/gemv_bench.py --fused    # only the SiLU-epilogue GEMV (linear_silu_mul) vs the two ops

Times are CUDA-graph replays (kernel time plus the graph's launch gaps), GB/s counts weight + x + y bytes.
"""
from __future__ import annotations

import functools
import sys

import cupy as cp
import ml_dtypes
import numpy as np

from openinfer.kernels.cuda import blas, ops, pdl

bf = np.dtype(ml_dtypes.bfloat16)
FLOOR_BW = 4.3e12  # device-to-device copy ceiling, bytes/s (reference/gpu-notes.md)


def rand(*shape, scale=1.0):
    return (cp.random.standard_normal(shape, dtype=cp.float32) * scale).astype(bf)


@functools.cache
def timing_stream():
    """The one stream every timing runs on, made at first use so that the module imports without a GPU."""
    return cp.cuda.Stream(non_blocking=True)


def weight_copies(nbytes):
    """How many distinct copies of an `nbytes` weight to cycle through: together well over the 50 MB L2, so
    no call reads another's leftovers (at most 8)."""
    return min(8, -(-150_000_000 // nbytes))


def graph_us(fn, reps=20, inner=1):
    """Mean us per fn() call: fn captured `inner` times in one graph, the graph replayed `reps` times."""
    stream = timing_stream()
    with stream:
        fn(); stream.synchronize()
        stream.begin_capture()
        for _ in range(inner):
            fn()
        graph = stream.end_capture()
        graph.launch(stream); stream.synchronize()
        s, e = cp.cuda.Event(), cp.cuda.Event()
        s.record(stream)
        for _ in range(reps):
            graph.launch(stream)
        e.record(stream); e.synchronize()
    return cp.cuda.get_elapsed_time(s, e) * 1e3 / (reps * inner)


def with_gemv(enabled, fn, pdl_on=True, **knobs):
    """fn() with the GEMV path on or off, programmatic dependent launch on or off, and blas knobs set."""
    saved, saved_pdl = {k: getattr(blas, k) for k in ("GEMV_ENABLED", *knobs)}, pdl.ENABLED
    try:
        blas.GEMV_ENABLED, pdl.ENABLED = enabled, pdl_on
        for k, v in knobs.items():
            setattr(blas, k, v)
        return fn()
    finally:
        pdl.ENABLED = saved_pdl
        for k, v in saved.items():
            setattr(blas, k, v)


H, I, NQKV, NO, V = 2560, 9728, 6144, 4096, 151936
SHAPES_4B = {"qkv": (H, NQKV), "o": (NO, H), "gate_up": (H, 2 * I), "down": (I, H), "lm_head": (H, V)}
SHAPES_8B = {"8B qkv": (4096, 6144), "8B o": (4096, 4096), "8B gate_up": (4096, 24576), "8B down": (12288, 4096)}


def shape_rows(shapes, ms=(1, 8)):
    print(f"\nresident GEMV CTAs: {blas.gemv_resident(f'gemv_bf16_{blas.GEMV_VARIANT}')} ({blas.GEMV_VARIANT})")
    print(f"\n{'GEMM (K->N)':<28} {'M':>2} {'split':>5} {'gemv us':>8} {'GB/s':>6} {'+PDL us':>8} {'GB/s':>6} "
          f"{'cublas us':>9} {'GB/s':>6} {'speedup':>7}")
    for name, (k, n) in shapes.items():
        copies = weight_copies(2 * n * k)
        ws = [rand(n, k, scale=k ** -0.5) for _ in range(copies)]
        for m in ms:
            x = rand(m, k)
            nbytes = 2 * (n * k + m * (k + n))

            def fn():
                for w in ws:
                    ops.linear(x, w)
            g = with_gemv(True, lambda: graph_us(fn), pdl_on=False) / copies
            p = with_gemv(True, lambda: graph_us(fn)) / copies
            c = with_gemv(False, lambda: graph_us(fn)) / copies
            splits = blas.gemv_splits(n, k, blas.gemv_resident(f"gemv_bf16_{blas.GEMV_VARIANT}"))
            print(f"{name + f' {k}->{n}':<28} {m:>2} {splits:>5} {g:8.1f} {nbytes / g / 1e3:6.0f} {p:8.1f} "
                  f"{nbytes / p / 1e3:6.0f} {c:9.1f} {nbytes / c / 1e3:6.0f} {c / min(g, p):7.2f}")
        del ws


def decode_chain(m=1):
    """36 layers x (qkv, o, gate_up, down) + lm_head, each with its own weights (8.05 GB), one graph."""
    layers = [[rand(n, k, scale=k ** -0.5) for k, n in (SHAPES_4B[s] for s in ("qkv", "o", "gate_up", "down"))]
              for _ in range(36)]
    lm = rand(V, H, scale=H ** -0.5)
    xs = {k: rand(m, k) for k in (H, NO, I)}
    nbytes = sum(w.nbytes for ws in layers for w in ws) + lm.nbytes

    def run():
        for ws in layers:
            for w in ws:
                ops.linear(xs[w.shape[1]], w)
        ops.linear(xs[H], lm)
    return run, nbytes


def chain_rows(sweep=False):
    run, nbytes = decode_chain(1)
    floor = nbytes / FLOOR_BW * 1e6
    print(f"\ndecode GEMM chain, Qwen3-4B, M=1: 145 GEMMs, {nbytes / 1e9:.2f} GB of weights, "
          f"floor {floor:.0f} us at {FLOOR_BW / 1e12:.1f} TB/s (graph-replayed)")
    configs = [("cuBLAS", False, {"pdl_on": False}), ("GEMV", True, {"pdl_on": False}), ("GEMV + PDL", True, {})]
    if sweep:
        for variant in blas.GEMV_VARIANTS:
            for fill, min_k in ((0.5, 1024), (1.0, 1024), (1.0, 512), (2.0, 512), (2.0, 256), (4.0, 256)):
                configs.append((f"{variant} fill={fill} min_split_k={min_k}", True,
                                {"pdl_on": False, "GEMV_VARIANT": variant, "GEMV_FILL": fill,
                                 "GEMV_MIN_SPLIT_K": min_k}))
    for label, on, knobs in configs:
        try:
            us = with_gemv(on, lambda: graph_us(run, reps=10), **knobs)
        except Exception as e:  # a PDL launch the driver refuses, say
            print(f"{label:<36} failed: {type(e).__name__}: {e}")
            continue
        print(f"{'decode GEMM chain ' + label:<36} {us:8.0f} us  {nbytes / us / 1e3:6.0f} GB/s  "
              f"{floor / us * 100:5.1f} % of floor")


def fused_rows(ms=(1, 2, 4, 8)):
    """Qwen3-4B's gate_up projection with silu_mul after it: the two ops vs the SiLU-epilogue GEMV, then 36
    layers of (qkv, o, gate_up + silu_mul, down) in one graph."""
    k, n = SHAPES_4B["gate_up"]
    print(f"\n{'fused epilogue (K->N)':<34} {'M':>2} {'two ops us':>10} {'fused us':>9} {'+PDL two':>9} {'+PDL fused':>10}")
    copies = weight_copies(2 * n * k)
    ws = [rand(n, k, scale=k ** -0.5) for _ in range(copies)]
    for m in ms:
        x = rand(m, k)
        two, fused = (lambda w: ops.silu_mul(ops.linear(x, w))), (lambda w: ops.linear_silu_mul(x, w))
        row = [with_gemv(True, lambda: graph_us(lambda: [f(w) for w in ws]), pdl_on=on) / copies
               for on in (False, True) for f in (two, fused)]
        print(f"{f'gate_up + silu_mul {k}->{n}':<34} {m:>2} {row[0]:10.1f} {row[1]:9.1f} {row[2]:9.1f} {row[3]:10.1f}")
    del ws
    layers = [[rand(n, k, scale=k ** -0.5) for k, n in (SHAPES_4B[s] for s in ("qkv", "o", "gate_up", "down"))]
              for _ in range(36)]
    for m in (ms[0], ms[-1]):
        x = rand(m, H)

        def chain(mlp_in):
            for qkv, o, gate_up, down in layers:
                h = ops.linear(ops.linear(x, qkv)[:, :NO], o)
                ops.linear(mlp_in(h, gate_up), down)
        two_ops, fused = (lambda: chain(lambda h, w: ops.silu_mul(ops.linear(h, w)))), (lambda: chain(ops.linear_silu_mul))
        for on in (False, True):
            t2, tf = (with_gemv(True, lambda: graph_us(f, reps=10), pdl_on=on) for f in (two_ops, fused))
            print(f"36-layer projection chain M={m}{' +PDL' if on else ''}: two ops {t2:8.0f} us, fused {tf:8.0f} us "
                  f"({(t2 - tf) / 36:.1f} us a layer)")


def split_rows(shapes, splits=(1, 2, 3, 4, 5, 6, 8)):
    """us per call of each shape at M = 1, without PDL, with split-K forced to each factor (the rule's own first)."""
    rule = functools.partial(blas.gemv_splits, resident=blas.gemv_resident(f"gemv_bf16_{blas.GEMV_VARIANT}"))
    print(f"\n{'M = 1, split-K (K->N)':<28} {'rule':>4} " + " ".join(f"{f'x{s} us':>7}" for s in splits))
    real = blas.gemv_splits
    for name, (k, n) in shapes.items():
        copies = weight_copies(2 * n * k)
        ws = [rand(n, k, scale=k ** -0.5) for _ in range(copies)]
        x = rand(1, k)
        times = []
        for s in splits:
            blas.gemv_splits = lambda *a, s=s: s
            try:
                times.append(with_gemv(True, lambda: graph_us(lambda: [ops.linear(x, w) for w in ws]),
                                       pdl_on=False) / copies)
            finally:
                blas.gemv_splits = real
        print(f"{name + f' {k}->{n}':<28} {rule(n, k):>4} " + " ".join(f"{t:7.1f}" for t in times))
        del ws


# Qwen3.5-4B's decode projections (hidden 2560): the GDN layers' fused in_proj (qkv, z, b, a) and out_proj, the
# gated attention's q (with its gate) + k + v, the MLP (9216)
SHAPES_35 = {"3.5 gdn in": (2560, 12352), "3.5 gdn out": (4096, 2560), "3.5 attn qkv": (2560, 10240),
             "3.5 gate_up": (2560, 18432), "3.5 down": (9216, 2560)}

if __name__ == "__main__":
    if "--splits" in sys.argv:
        split_rows({**SHAPES_4B, **SHAPES_35})
        sys.exit()
    if "--fused" in sys.argv:
        fused_rows()
        sys.exit()
    sweep = "--sweep" in sys.argv
    shape_rows(SHAPES_4B)
    if sweep:
        shape_rows(SHAPES_8B, ms=(1, 4))
    chain_rows(sweep)
    fused_rows()
