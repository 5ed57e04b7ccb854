"""lt.py's algorithm per (M, N, K): chosen by timing cuBLASLt's heuristic candidates, kept on disk.

`tune` runs at start-up (loading/loader.py's "GEMM tuning" phase), after the activation profile has recorded
the bf16 (N, K) that blas.linear sees, and before any decode graph is captured. The cache file
(tuning.py, folder gemm_algos) holds {"key": GPU name, compute capability, SM count, cuBLASLt version;
"choices": {"M,N,K,bf16": the algorithm's 64 bytes in hex}}; a warm start checks each
saved algorithm with cublasLtMatmulAlgoCheck (a host call) and times only shapes that fail or are new.
"""
from __future__ import annotations

import ctypes
from dataclasses import dataclass
from typing import Any, Callable, Iterable

import cupy as cp

from . import blas, lt
from .lt import Lt, MatmulAlgo, Plan
from .tuning import cache_path, gpu_key, read_choices, replay_us, scratch, write_choices

HEURISTICS = 16                 # candidates asked of cublasLtMatmulAlgoGetHeuristic per shape
Timer = Callable[[MatmulAlgo], float]   # an algorithm -> us per GEMM; raises RuntimeError where it cannot run
_lts: dict[int, Lt] = {}


@dataclass(frozen=True)
class Tuned:
    cached: int   # shapes whose saved algorithm passed the check
    timed: int    # shapes timed now (new, or the saved algorithm failed the check)
    lt: int       # of all these, shapes that run through cuBLASLt (the rest: no candidate ran)


def device_key(dev: int, lib: Any) -> dict[str, Any]:
    """What a saved choice depends on: the GPU and the library version."""
    return {**gpu_key(dev), "cublaslt": int(lib.cublasLtGetVersion())}


def from_hex(text: str) -> MatmulAlgo | None:
    try:
        raw = bytes.fromhex(text)
    except ValueError:
        return None
    return MatmulAlgo.from_buffer_copy(raw) if len(raw) == ctypes.sizeof(MatmulAlgo) else None


def fastest(lt_: Lt, lay: tuple[ctypes.c_void_p, ...], timer: Timer) -> MatmulAlgo | None:
    """The fastest of the heuristic's usable candidates (a copy, not a view into the result array);
    candidates marked unusable, needing more workspace than there is, or failing to run are skipped."""
    best, best_us = None, float("inf")
    for result in lt_.heuristics(lay, HEURISTICS):
        if result.state or result.workspace_size > blas.WORKSPACE_BYTES:
            continue
        try:
            us = timer(result.algo)
        except RuntimeError:   # cublasLtMatmul refused it (blas._check)
            continue
        if us < best_us:
            best, best_us = MatmulAlgo.from_buffer_copy(result.algo), us
    return best


def graph_timer(lt_: Lt, lay: tuple[ctypes.c_void_p, ...], x: cp.ndarray, ws: list[cp.ndarray], y: cp.ndarray,
                stream: cp.cuda.Stream) -> Timer:
    """Times one pass over the weight copies `ws` (so weights come from HBM, as in a decode step) as a CUDA
    graph replay (tuning.py); µs per GEMM."""
    def time_us(algo: MatmulAlgo) -> float:
        return replay_us(lambda: [lt_.matmul(algo, lay, x, w, y) for w in ws], stream) / len(ws)
    return time_us


def tune(ms: Iterable[int], shapes: Iterable[tuple[int, int]]) -> Tuned:
    """Plans (lt.plans) for bf16 x[M, K] @ w[N, K].T at each M above GEMV_MAX_M and each weight (N, K) on the
    current device; shapes planned before are kept. Its scratch goes
    back to CuPy's pool, on a stream of its own: free_all_blocks() (backend.release_cached) returns it."""
    ms, shapes = sorted({m for m in ms if m > blas.GEMV_MAX_M}), sorted(set(shapes))
    if not ms or not shapes:   # (a float32 model has no bf16 shapes)
        return Tuned(0, 0, 0)
    dev = cp.cuda.Device().id
    lt_ = _lts.get(dev) or _lts.setdefault(dev, Lt())
    key = device_key(dev, lt_.lib)
    path = cache_path("gemm_algos", key)
    saved = read_choices(path, key)
    cached = timed = 0
    stream = cp.cuda.Stream(non_blocking=True)   # capturable, whatever stream is current
    with stream:   # the scratch too: CuPy's pool hands a freed block back only to its own stream
        for n, k in shapes:
            buffers = None
            for m in (m for m in ms if (dev, m, n, k) not in lt.plans):
                name, lay = f"{m},{n},{k},bf16", lt.layouts(lt_.lib, m, n, k)
                algo = from_hex(saved.get(name, ""))
                if algo is not None and lt_.usable(algo, lay):
                    cached += 1
                else:
                    x, ws, y = buffers = buffers or scratch(ms[-1], n, k)
                    algo = fastest(lt_, lay, graph_timer(lt_, lay, x[:m], ws, y[:m], stream))
                    timed += 1
                    if algo is None:
                        continue   # GemmEx it stays
                    saved[name] = bytes(algo).hex()
                lt.plans[(dev, m, n, k)] = Plan(lt_, algo, lay)
            del buffers
        stream.synchronize()
    if timed:
        write_choices(path, key, saved)
    return Tuned(cached, timed, sum(1 for p in lt.plans if p[0] == dev))
