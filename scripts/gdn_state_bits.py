"""Do gdn_chunk_state's builds (OPENINFER_GDN_STATE_WARPS) give the same bits? (GPU only; an A/B's check.)

A 1k-token run beside a continuing one and a short one, Qwen3.5-4B's head shape, bf16 and float32: the delta rule's
outputs and final states under each build, compared bit for bit.
    python scripts/gdn_state_bits.py [--warps 16 32]
"""
from __future__ import annotations

import argparse
import os

import cupy as cp
import ml_dtypes
import numpy as np

from openinfer.batch import ForwardBatch
from openinfer_qwen35.cuda import ops

NK, NV, DK, DV = 16, 32, 128, 128


def batch(runs: list[tuple[int, int]], slots: list[int]) -> ForwardBatch:
    qs = np.concatenate([[0], np.cumsum([n for _, n in runs])]).astype(np.int32)
    lens = np.array([p + n for p, n in runs], np.int32)
    z = cp.zeros(1, cp.int32)   # the fields the delta rule does not read
    return ForwardBatch(z, z, z, z, cp.asarray(qs), cp.asarray(lens), z, qs, lens, block_size=16,
                        max_query_len=int(np.diff(qs).max()), max_context_len=int(lens.max()),
                        state_slots=cp.asarray(np.asarray(slots, np.int32)))


def run(warps: str, dtype, seed: int = 0) -> list[np.ndarray]:
    os.environ["OPENINFER_GDN_STATE_WARPS"] = warps
    rng = np.random.default_rng(seed)
    b = batch([(0, 1024), (200, 300), (5, 17)], [3, 0, 5])
    T = int(b.query_start_host[-1])
    q, k = (cp.asarray(rng.standard_normal((T, NK, DK), dtype=np.float32).astype(dtype)) for _ in range(2))
    v = cp.asarray(rng.standard_normal((T, NV, DV), dtype=np.float32).astype(dtype))
    g = cp.asarray(-rng.uniform(0.01, 0.2, (T, NV)).astype(np.float32))
    beta = cp.asarray(rng.uniform(0, 1, (T, NV)).astype(np.float32))
    state = cp.asarray(rng.standard_normal((6, NV, DK, DV), dtype=np.float32))
    out = ops.qwen35_gated_delta_rule(q, k, v, g, beta, state, b)
    return [cp.asnumpy(out).view(np.uint8), cp.asnumpy(state).view(np.uint8)]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--warps", nargs=2, default=["16", "32"])
    a = ap.parse_args()
    for dtype in (np.dtype(ml_dtypes.bfloat16), np.dtype(np.float32)):
        first, second = (run(w, dtype) for w in a.warps)
        same = all(np.array_equal(x, y) for x, y in zip(first, second))
        print(f"{dtype}: builds {a.warps[0]} and {a.warps[1]} warps give {'the same bits' if same else 'DIFFERENT bits'}")


if __name__ == "__main__":
    main()
