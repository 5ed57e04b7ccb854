"""The GQA decode kernel's split rule (kernels/cuda/attention_decode.py: DECODE_SPLIT_KEYS, DECODE_NEAR, DECODE_CAP)
swept on one GPU at Qwen3-4B's attention shape (32 query heads, 8 KV heads, head dim 128, block size 16): the
registry's paged_attention for batch x context, random inputs, cold L2 (openinfer.testing.cuda.cold_us), µs per
setting; every setting's output is checked against the first's. The first setting is the shipped one.

    python scripts/decode_split_sweep.py [--batches 1,8,32,64,128,256] [--contexts 1024,4096,16384]
"""
from __future__ import annotations

import argparse

import cupy as cp
import numpy as np

from openinfer.engine.batch import ForwardBatch
from openinfer.kernels.cuda import attention, attention_decode as ad
from openinfer.kernels.cuda.module import BF16
from openinfer.testing.cuda import cold_us

NH, NKV, D, BS = 32, 8, 128, 16
SETTINGS = [(ad.DECODE_SPLIT_KEYS, ad.DECODE_NEAR, ad.DECODE_CAP), (64, 16, 32), (64, 8, 32), (128, 8, 32),
            (256, 4, 16), (64, 32, 64)]


def inputs(B: int, L: int, rng: np.random.Generator) -> tuple:
    per = -(-L // BS)
    tables = (1 + rng.permutation(B * per).astype(np.int32)).reshape(B, per)
    nb = B * per + 1
    k = cp.random.standard_normal((nb, BS, NKV, D), dtype=cp.float32).astype(BF16)
    v = cp.random.standard_normal((nb, BS, NKV, D), dtype=cp.float32).astype(BF16)
    q = cp.random.standard_normal((B, NH, D), dtype=cp.float32).astype(BF16)
    qs, ln = np.arange(B + 1, dtype=np.int32), np.full(B, L, np.int32)
    fb = ForwardBatch(token_ids=cp.zeros(B, cp.int32), positions=cp.asarray(ln - 1), slot_mapping=cp.zeros(B, cp.int64),
                      block_tables=cp.asarray(tables), query_start=cp.asarray(qs), context_lens=cp.asarray(ln),
                      sample_rows=cp.arange(B, dtype=cp.int32), query_start_host=qs, context_lens_host=ln,
                      block_size=BS, max_query_len=1, max_context_len=L)
    return q, k, v, fb


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--batches", default="1,8,32,64,128,256")
    ap.add_argument("--contexts", default="1024,4096,16384")
    args = ap.parse_args()
    print(cp.cuda.runtime.getDeviceProperties(0)["name"].decode(), "; µs, cold L2; columns: keys/near/cap")
    print("  B       L " + "".join(f"{f'{a}/{b}/{c}':>12}" for a, b, c in SETTINGS))
    rng = np.random.default_rng(0)
    for B in map(int, args.batches.split(",")):
        for L in map(int, args.contexts.split(",")):
            if B * L > 256 * 4096:   # the KV of larger points outgrows a sweep's memory
                continue
            q, k, v, fb = inputs(B, L, rng)
            row, ref = [], None
            for ad.DECODE_SPLIT_KEYS, ad.DECODE_NEAR, ad.DECODE_CAP in SETTINGS:
                out = cp.asnumpy(attention.paged_attention(q, k, v, fb, D ** -0.5)).astype(np.float32)
                ref = out if ref is None else ref
                np.testing.assert_allclose(out, ref, atol=2e-2, rtol=2e-2)
                row.append(f"{cold_us(lambda: attention.paged_attention(q, k, v, fb, D ** -0.5)):12.1f}")
            print(f"{B:3d} {L:7d} " + "".join(row), flush=True)


if __name__ == "__main__":
    main()
