"""Does cuBLASLt's algorithm choice speed up the Qwen3-4B decode GEMMs at M = 16..256? (GPU only)

    python scripts/gemm_algos_bench.py                                # 5 shapes x M 16..256, top 16 algorithms
    python scripts/gemm_algos_bench.py --m 32 128 --shapes qkv down --output-json algos.json

blas.linear runs cublasGemmEx with CUBLAS_GEMM_DEFAULT (cuBLAS's first heuristic) for M > 8. Here each (shape, M)
also runs every usable one of cuBLASLt's top-N heuristic algorithms (cublasLtMatmulAlgoGetHeuristic) on the same
operands: bf16 in and out, fp32 compute, row-major y[M, N] = x[M, K] @ w[N, K].T computed column-major as
y^T = op_T(w) @ x^T, as blas.py does. Times are CUDA-graph replays cycling through distinct weight copies
(gemv_bench.graph_us, weight_copies), so weights come from HBM, not L2; GB/s counts weight bytes only. Every
algorithm's output is checked against GemmEx's; one off by more than 1e-2 of max|y| is flagged and never "best".
--wide adds cuBLASLt's best configurations of every algorithm id (search limited by algorithm id) and each id's
best split over K in 2-16 parts with each reduction scheme it supports (wide_candidates); their indices print
as w0, w1, ... after the heuristic's 0..N-1. On an H100 (stop 24) none of ~80 more a shape beat the heuristic's
top 16 at M = 32 or 128, and some split-K ones computed wrong rows (flagged), so the tuner keeps to the heuristic.
The chain line adds the per-shape times up as a decode step runs them (36 layers x qkv, o, gate_up, down +
lm_head = 145 GEMMs): arithmetic, not a measured chain.
"""
from __future__ import annotations

import argparse
import ctypes
import json

import cupy as cp

from gemv_bench import FLOOR_BW, SHAPES_4B, bf, graph_us, rand, weight_copies
from openinfer.kernels.cuda import blas
from openinfer.kernels.cuda.blas import WORKSPACE_BYTES
from openinfer.kernels.cuda.lt import HeuristicResult, Lt, MatmulAlgo, layouts, preference   # the engine's bindings

MAX_REL_ERR = 1e-2                  # max|y - y_GemmEx| / max|y_GemmEx| above this flags an algorithm
SEARCH_LIMITED_BY_ALGO_ID = 1       # cublasLtMatmulSearch_t: the heuristic configures the algorithm id it is given
CAP_SPLITK_SUPPORT, CAP_REDUCTION_SCHEME_MASK = 0, 1   # cublasLtMatmulAlgoCapAttributes_t (int32_t, uint32_t)
CONFIG_SPLITK_NUM, CONFIG_REDUCTION_SCHEME = 2, 3      # cublasLtMatmulAlgoConfigAttributes_t (int32_t, uint32_t)
REDUCTION_SCHEMES = (1, 2, 4)       # cublasLtReductionScheme_t: in place, in the compute type, in the output type
CHAIN_COUNTS = {"qkv": 36, "o": 36, "gate_up": 36, "down": 36, "lm_head": 1}   # GEMMs of one Qwen3-4B decode step


def algo_ids(lt: Lt) -> list[int]:
    """Every algorithm id the library has for bf16 operands with fp32 compute."""
    types = (blas._COMPUTE_32F, blas._CUDA_R_32F) + (blas._CUDA_R_16BF,) * 4
    ids, returned = (ctypes.c_int * 512)(), ctypes.c_int(0)
    blas._check(lt.lib.cublasLtMatmulAlgoGetIds(lt.handle, *types, 512, ids, ctypes.byref(returned)),
                "LtMatmulAlgoGetIds")
    return list(ids[:returned.value])


def wide_candidates(lt: Lt, lay: tuple, per_id: int = 4,
                    splits: tuple[int, ...] = (2, 3, 4, 6, 8, 12, 16)) -> list[MatmulAlgo]:
    """More than the heuristic's overall top N: its best `per_id` configurations of each algorithm id, and the
    best of each id split over K in `splits` parts with every reduction scheme the algorithm supports, where
    cublasLtMatmulAlgoCheck accepts it within the workspace. Distinct by their 64 bytes."""
    a, b, c = lay
    pref_by_id = preference(lt.lib, SEARCH_LIMITED_BY_ALGO_ID)
    types = (blas._COMPUTE_32F, blas._CUDA_R_32F) + (blas._CUDA_R_16BF,) * 4
    found: dict[bytes, MatmulAlgo] = {}
    firsts: list[MatmulAlgo] = []
    for algo_id in algo_ids(lt):
        results, returned = (HeuristicResult * per_id)(), ctypes.c_int(0)
        for r in results:
            if lt.lib.cublasLtMatmulAlgoInit(lt.handle, *types, algo_id, ctypes.byref(r.algo)):
                break
        else:
            if lt.lib.cublasLtMatmulAlgoGetHeuristic(lt.handle, lt.desc, a, b, c, c, pref_by_id, per_id, results,
                                                     ctypes.byref(returned)) == 0:
                ok = [r.algo for r in results[:returned.value]
                      if r.state == 0 and r.workspace_size <= blas.WORKSPACE_BYTES]
                firsts += [MatmulAlgo.from_buffer_copy(ok[0])] if ok else []
                for algo in ok:
                    found.setdefault(bytes(algo), MatmulAlgo.from_buffer_copy(algo))
    for base in firsts:
        if not _cap(lt, base, CAP_SPLITK_SUPPORT, ctypes.c_int32):
            continue
        mask = _cap(lt, base, CAP_REDUCTION_SCHEME_MASK, ctypes.c_uint32)
        for parts in splits:
            for scheme in (s for s in REDUCTION_SCHEMES if mask & s):
                algo = MatmulAlgo.from_buffer_copy(base)
                for attr, value in ((CONFIG_SPLITK_NUM, ctypes.c_int32(parts)),
                                    (CONFIG_REDUCTION_SCHEME, ctypes.c_uint32(scheme))):
                    lt.lib.cublasLtMatmulAlgoConfigSetAttribute(ctypes.byref(algo), attr, ctypes.byref(value),
                                                                ctypes.sizeof(value))
                if lt.usable(algo, lay):
                    found.setdefault(bytes(algo), algo)
    return list(found.values())


def _cap(lt: Lt, algo: MatmulAlgo, attr: int, ctype: type) -> int:
    """An algorithm capability (0 where the library does not report it)."""
    value, written = ctype(0), ctypes.c_size_t(0)
    status = lt.lib.cublasLtMatmulAlgoCapGetAttribute(ctypes.byref(algo), attr, ctypes.byref(value),
                                                      ctypes.sizeof(value), ctypes.byref(written))
    return int(value.value) if status == 0 else 0


def measure(lt: Lt, ws: list[cp.ndarray], m: int, count: int, reps: int, wide: bool = False) -> dict:
    """GemmEx and each usable heuristic algorithm (and with `wide`, wide_candidates) on x[m, K] against the
    weight copies ws, us per GEMM."""
    n, k = ws[0].shape
    x, y = rand(m, k), cp.empty((m, n), dtype=bf)
    ref = blas.linear(x, ws[0]).astype(cp.float32)
    scale = float(cp.abs(ref).max())
    row = {"m": m, "gemmex_us": graph_us(lambda: [blas.linear(x, w) for w in ws], reps=reps) / len(ws),
           "algos": [], "skipped": []}
    lay = layouts(lt.lib, m, n, k)
    candidates, seen = [], set()
    for index, result in enumerate(lt.heuristics(lay, count)):
        if result.state or result.workspace_size > WORKSPACE_BYTES:
            row["skipped"].append({"index": index, "why": f"state {result.state}, workspace {result.workspace_size}"})
            continue
        candidates.append((index, result.algo, result.workspace_size, result.waves_count))
        seen.add(bytes(result.algo))
    if wide:
        extra = [a for a in wide_candidates(lt, lay) if bytes(a) not in seen]
        candidates += [(f"w{i}", a, None, None) for i, a in enumerate(extra)]
    for index, algo, workspace, waves in candidates:
        try:
            lt.matmul(algo, lay, x, ws[0], y)   # checked eagerly first: a failing call never gets captured
        except RuntimeError as e:
            row["skipped"].append({"index": index, "why": str(e)})
            continue
        rel_err = float(cp.abs(y.astype(cp.float32) - ref).max()) / scale
        us = graph_us(lambda: [lt.matmul(algo, lay, x, w, y) for w in ws], reps=reps) / len(ws)
        row["algos"].append({"index": index, "us": us, "rel_err": rel_err, "flagged": rel_err > MAX_REL_ERR,
                             "workspace": workspace, "waves": waves, "algo": bytes(algo).hex()})
    good = [a for a in row["algos"] if not a["flagged"]]
    best = min(good, key=lambda a: a["us"]) if good else None
    row["best_index"], row["best_us"] = (best["index"], best["us"]) if best else (None, None)
    heur = [a for a in good if isinstance(a["index"], int)]
    row["best_heuristic_us"] = min(a["us"] for a in heur) if heur else None
    return row


def chain_us(times: dict[str, float]) -> float:
    """A decode step's GEMM time from per-shape times: 36 of each layer GEMM, one lm_head."""
    return sum(CHAIN_COUNTS[shape] * us for shape, us in times.items())


def chain_weight_bytes(shapes: list[str]) -> int:
    """Weight bytes one decode step reads through these shapes' GEMMs (bf16)."""
    return sum(CHAIN_COUNTS[s] * 2 * SHAPES_4B[s][0] * SHAPES_4B[s][1] for s in shapes)


def print_chain(rows: list[dict], shapes: list[str], ms: list[int]) -> list[dict]:
    """The chain line per M: GemmEx everywhere vs the best Lt algorithm per shape (GemmEx where none passed)."""
    gemms, nbytes = sum(CHAIN_COUNTS[s] for s in shapes), chain_weight_bytes(shapes)
    floor = nbytes / FLOOR_BW * 1e6
    print(f"\n{gemms}-GEMM chain ({', '.join(shapes)}; {nbytes / 1e9:.2f} GB of weights, floor {floor:.0f} us "
          f"at {FLOOR_BW / 1e12:.1f} TB/s), summed from the rows above:")
    out = []
    for m in ms:
        at_m = [r for r in rows if r["m"] == m]
        gemmex = chain_us({r["shape"]: r["gemmex_us"] for r in at_m})
        best = chain_us({r["shape"]: r["best_us"] or r["gemmex_us"] for r in at_m})
        heur = chain_us({r["shape"]: r["best_heuristic_us"] or r["gemmex_us"] for r in at_m})
        print(f"  M={m:<4} GemmEx {gemmex:7.0f} us ({floor / gemmex:4.0%} of floor)   best heuristic Lt per shape "
              f"{heur:7.0f} us ({floor / heur:4.0%})   best of all tried {best:7.0f} us ({floor / best:4.0%})   "
              f"speed-up {gemmex / best:.3f}")
        out.append({"m": m, "gemms": gemms, "weight_bytes": nbytes, "gemmex_us": gemmex, "best_heuristic_us": heur,
                    "best_lt_us": best})
    return out


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shapes", nargs="+", choices=list(SHAPES_4B), default=list(SHAPES_4B),
                   help="Qwen3-4B decode GEMMs to measure (default: all five)")
    p.add_argument("--m", nargs="+", type=int, default=[16, 32, 64, 128, 256], help="rows (batch) to measure")
    p.add_argument("--algos", type=int, default=16, help="cuBLASLt heuristic results to request per problem")
    p.add_argument("--reps", type=int, default=20, help="graph replays per timing")
    p.add_argument("--wide", action="store_true", help="also every algorithm id's configurations and split-K "
                   "variants (wide_candidates)")
    p.add_argument("--output-json", help="also write every row and every algorithm's time here")
    return p.parse_args(argv)


def print_row(row: dict) -> None:
    """One table line; nan where no Lt algorithm ran (or heuristic #0 was skipped)."""
    nan, gemmex = float("nan"), row["gemmex_us"]
    weight_gbps = 2 * row["n"] * row["k"] / 1e3   # bytes / us / 1e3 = GB/s
    first = next((a["us"] for a in row["algos"] if a["index"] == 0), nan)
    best = row["best_us"] or nan
    flagged = [str(a["index"]) for a in row["algos"] if a["flagged"]]
    ok, got = len(row["algos"]) - len(flagged), len(row["algos"]) + len(row["skipped"])
    name = f"{row['shape']} {row['k']}->{row['n']}"
    print(f"{name:<24} {row['m']:>4} {gemmex:9.1f} {weight_gbps / gemmex:5.0f} "
          f"{first:8.1f} {best:10.1f} {'-' if row['best_index'] is None else row['best_index']:>4} "
          f"{weight_gbps / best:5.0f} {gemmex / best:8.3f} {f'{ok}/{got}':>7} {len(flagged):>7}")


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    blas.GEMV_ENABLED = False   # (a) is cublasGemmEx at every M, also an M <= 8 given on the command line
    lt = Lt()
    device = cp.cuda.runtime.getDeviceProperties(cp.cuda.Device().id)["name"].decode()
    print(f"{device}, cuBLASLt {lt.lib.cublasLtGetVersion()}, top {args.algos} heuristic algorithms, "
          f"workspace {WORKSPACE_BYTES >> 20} MiB")
    print(f"\n{'GEMM (K->N)':<24} {'M':>4} {'GemmEx us':>9} {'GB/s':>5} {'Lt#0 us':>8} {'best Lt us':>10} {'#':>4} "
          f"{'GB/s':>5} {'speed-up':>8} {'ok/got':>7} {'flagged':>7}")
    rows = []
    for shape in args.shapes:
        k, n = SHAPES_4B[shape]
        ws = [rand(n, k, scale=k ** -0.5) for _ in range(weight_copies(2 * n * k))]
        for m in args.m:
            row = {"shape": shape, "k": k, "n": n, **measure(lt, ws, m, args.algos, args.reps, args.wide)}
            rows.append(row)
            print_row(row)
        del ws
    chain = print_chain(rows, args.shapes, args.m)
    if args.output_json:
        with open(args.output_json, "w") as f:
            json.dump({"device": device, "cublaslt_version": lt.lib.cublasLtGetVersion(), "algos_requested": args.algos,
                       "workspace_bytes": WORKSPACE_BYTES, "rows": rows, "chain": chain}, f, indent=1)


if __name__ == "__main__":
    main()
