"""The skinny GEMM (skinny_gemm.cu, decode steps of up to 128 rows) against what runs otherwise (GPU only): cuBLASLt's
tuned algorithms above 8 rows, the GEMV up to 8 (with PDL, as in the decode graphs of that size):
each Qwen3-4B / Qwen3.5-4B decode weight at each batch width under every split-K factor (skinny_tune's timing), then
gate_up with its SiLU epilogue against the two ops, then the 145-GEMM Qwen3-4B decode chain with the rule's splits and
with each shape's fastest.

    python scripts/skinny_bench.py [--ms 1,8,16,32,64,128] [--json PATH]
    python scripts/skinny_bench.py --smoke     # one small GEMM of each width, split and not, and the SiLU epilogue

Each shape is first checked against an fp32 product. Times are CUDA-graph replays over weight copies larger than the
L2 (tuning.replay_us), so weights come from HBM; cuBLASLt runs the algorithm lt_tune picks at start-up.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import cupy as cp

from openinfer.kernels.cuda import gemv_tune, lt_tune, ops, pdl, skinny_gemm, skinny_tune, tuning
from gemv_bench import FLOOR_BW, SHAPES_35, SHAPES_4B, decode_chain, rand

SPLITS = range(1, 9)   # columns of the table


def max_rel_error(m: int, n: int, k: int) -> float:
    x, w = rand(m, k), rand(n, k, scale=k ** -0.5)
    y = cp.empty((m, n), x.dtype)
    skinny_gemm.gemm(x, w, y)
    want = x.astype(cp.float32) @ w.astype(cp.float32).T
    return float(cp.abs(y.astype(cp.float32) - want).max() / cp.abs(want).max())


def smoke() -> bool:
    """Each kernel once on small shapes against fp32 (a first check on a new machine, before anything long)."""
    ok = True
    for m, n, k, splits, silu in ((1, 256, 128, 1, False), (5, 2560, 4096, 4, True), (9, 256, 128, 1, False),
                                  (32, 300, 640, 3, False), (64, 128, 256, 2, True),
                                  (128, 2560, 4096, 6, False), (100, 400, 1000, 4, True)):
        x, w = rand(m, k), rand(n, k, scale=k ** -0.5)
        y = cp.empty((m, n // 2 if silu else n), x.dtype)
        skinny_gemm.gemm(x, w, y, splits=splits, silu=silu)
        want = x.astype(cp.float32) @ w.astype(cp.float32).T
        if silu:
            gate, up = (h.astype(x.dtype).astype(cp.float32) for h in (want[:, : n // 2], want[:, n // 2:]))
            want = gate / (1 + cp.exp(-gate)) * up
        err = float(cp.abs(y.astype(cp.float32) - want).max() / cp.abs(want).max())
        ok &= err < 2e-2
        print(f"smoke M={m} N={n} K={k} splits={splits} silu={silu}: max error {err:.1e} of the largest |y|")
    return ok


def shape_rows(ms, stream) -> list[dict]:
    """Each weight at each M: the other path, the rule's split, the fastest (split, CTAs a SM), then every split of
    the one-CTA-a-SM kernel ("1/SM") and of the two-CTA one ("2/SM", up to width 64)."""
    rows = []
    print(f"\n{'shape (K->N)':<24} {'M':>3} {'err':>7} {'other':>7} {'rule':>7} {'best':>7} {'as':>4} {'GB/s':>5} "
          f"{'kernel':>6} " + " ".join(f"{f'x{s}':>6}" for s in SPLITS))
    for name, (k, n) in {**SHAPES_4B, **SHAPES_35}.items():
        for m in ms:
            other_us, times = skinny_tune.time_choices(m, n, k, stream)   # other: cuBLASLt above 8 rows, else GEMV
            rule = (skinny_gemm.rule_splits(n, k, skinny_gemm.width(m)), 1)
            best = min(times, key=times.get)
            row = {"shape": name, "k": k, "n": n, "m": m, "max_rel_error": max_rel_error(m, n, k), "other_us": other_us,
                   "rule": list(rule), "best": list(best), "us": {f"{s},{p}": t for (s, p), t in times.items()}}
            rows.append(row)
            head = (f"{name + f' {k}->{n}':<24} {m:>3} {row['max_rel_error']:7.1e} {other_us:7.1f} {times[rule]:7.1f} "
                    f"{times[best]:7.1f} {best[0]:>2}{'x2' if best[1] == 2 else '  '} {2 * n * k / times[best] / 1e3:5.0f}")
            for p in sorted({p for _, p in times}):
                print(f"{head if p == 1 else '':<{len(head)}} {f'{p}/SM':>6} "
                      + " ".join(f"{times.get((s, p), 0):6.1f}" for s in SPLITS))
    return rows


def fused_rows(ms, stream) -> list[dict]:
    """Qwen3-4B's gate_up with silu_mul after it: what runs otherwise (the fused GEMV up to 8 rows, cuBLASLt +
    silu_mul above), the skinny GEMM + silu_mul, and the skinny GEMM with the SiLU in its epilogue; µs per pair over
    weight copies larger than the L2, with PDL as the decode graphs of that size have it."""
    k, n = SHAPES_4B["gate_up"]
    out = []
    for m in ms:
        x, ws, y = tuning.scratch(m, n, k)
        half = y[:, : n // 2]
        res = {"m": m}
        for label, fn in (("other", lambda w: ops.linear_silu_mul(x, w)),
                          ("skinny + silu_mul", lambda w: (skinny_gemm.gemm(x, w, y), ops.silu_mul(y))),
                          ("skinny, SiLU epilogue", lambda w: skinny_gemm.gemm(x, w, half, silu=True))):
            with skinny_gemm.mode("0"), pdl.suspended(m > pdl.MAX_DECODE_ROWS):
                res[label] = tuning.replay_us(lambda: [fn(w) for w in ws], stream) / len(ws)
        print(f"gate_up + silu_mul M={m:<3} " + "  ".join(f"{label} {us:6.1f} us" for label, us in list(res.items())[1:]))
        out.append(res)
    return out


def chain_rows(ms, rows, stream) -> list[dict]:
    out = []
    dev = cp.cuda.Device().id
    rule = {(dev, skinny_gemm.width(r["m"]), r["n"], r["k"]): tuple(r["rule"]) for r in rows}
    best = {(dev, skinny_gemm.width(r["m"]), r["n"], r["k"]): tuple(r["best"]) for r in rows}
    for m in ms:
        run, nbytes = decode_chain(m)
        floor = nbytes / FLOOR_BW * 1e6
        res = {"m": m, "weights_gb": nbytes / 1e9, "floor_us": floor}
        for label, mode, choice in (("cuBLASLt / GEMV", "0", {}), ("skinny, rule splits", "tune", rule),
                                    ("skinny, best splits", "tune", best)):
            skinny_gemm.split_choice = choice
            with skinny_gemm.mode(mode), pdl.suspended(m > pdl.MAX_DECODE_ROWS):   # PDL as the decode graphs have it
                us = tuning.replay_us(run, stream, runs=7)
            res[label] = us
            print(f"decode chain M={m:<3} {label:<22} {us:8.0f} us  {nbytes / us / 1e3:6.0f} GB/s  "
                  f"{floor / us * 100:5.1f} % of floor")
        out.append(res)
        del run
    skinny_gemm.split_choice = {}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ms", default="1,8,16,32,64,128")
    ap.add_argument("--json", type=Path)
    ap.add_argument("--smoke", action="store_true", help="only a quick correctness check of every kernel")
    args = ap.parse_args()
    ms = [int(m) for m in args.ms.split(",")]
    if not skinny_gemm.hopper():
        sys.exit("the skinny GEMM needs an H100 / H200 (sm_90)")
    if args.smoke:
        sys.exit(0 if smoke() else 1)
    shapes = [(n, k) for k, n in {**SHAPES_4B, **SHAPES_35}.values()]
    print(f"{cp.cuda.runtime.getDeviceProperties(cp.cuda.Device().id)['name'].decode()}; cuBLASLt plans: "
          f"{lt_tune.tune(ms, shapes)}; GEMV splits: {gemv_tune.tune(shapes)}")   # what the engine compares with
    stream = cp.cuda.Stream(non_blocking=True)
    with stream:
        rows = shape_rows(ms, stream)
        fused = fused_rows(ms, stream)
        chains = chain_rows(ms, rows, stream)
    if args.json:
        args.json.write_text(json.dumps({"shapes": rows, "fused": fused, "chains": chains}, indent=1))


if __name__ == "__main__":
    main()
