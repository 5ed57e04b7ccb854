"""Decode attention microbenchmark on one GPU: the fp32 CUDA-core kernel (attention.cu, "old"), the
tensor-core one (attention_decode.cu, "new": as the engine runs it), the tensor-core one without clusters ("nocl")
and with its splits in thread-block clusters of up to 8 ("cl") on one Qwen3-4B layer (32 query heads, 8 KV heads,
head dim 128, bf16, block size 16, blocks shuffled over the pool), batch x context as given.

Each variant runs as the engine runs decode: its grid sized for --max-model-len (the CUDA graphs'
sizing), CALLS calls captured into one CUDA graph, the replay timed with CUDA events. GB/s counts
the K/V bytes one call must read (batch x context x 8 heads x 128 x 2 x 2 bytes) over its time;
the H200 copies at ~4.3 TB/s. "max |diff|" compares each variant's output with the first one's. --split-keys
repeats each point for each fewest-keys-a-split (OPENINFER_DECODE_SPLIT_KEYS).

--layout head-major asks what a cache laid out [block][kv head][token][d] would read at: each (sequence, KV head)
becomes a sequence of its own with one KV head and its 4 query heads, so a block reads its keys in 4 KB runs
(16 tokens x 256 bytes) where the engine's [block][token][kv head][d] gives it 256-byte runs 2 KB apart. The
bytes, the blocks a grid holds and their work are the same; the rows print as batch x 8.
    python scripts/attn_bench.py [--batches 1,32,128] [--contexts 1024,16384] [--max-model-len 20480]
                                 [--split-keys 64,256] [--variants old,new,nocl] [--layout token-major,head-major]
"""
from __future__ import annotations

import argparse
import dataclasses

import cupy as cp
import numpy as np

from openinfer.batch import ForwardBatch
from openinfer.kernels.cuda import attention, attention_decode
from openinfer.kernels.cuda.module import BF16, max_active_clusters
from openinfer.testing.cuda import graph_ms

NH, NKV, D, BS = 32, 8, 128, 16
CALLS = 20


def make_inputs(batch: int, context: int, max_model_len: int, rng: np.random.Generator, nh: int = NH,
                nkv: int = NKV):
    per = -(-context // BS)
    num_blocks = batch * per + 1
    tables = (1 + rng.permutation(batch * per).astype(np.int32)).reshape(batch, per)
    k, v = (cp.random.standard_normal((num_blocks, BS, nkv, D), dtype=cp.float32).astype(BF16) for _ in range(2))
    q = cp.random.standard_normal((batch, nh, D), dtype=cp.float32).astype(BF16)
    qs, lens = np.arange(batch + 1, dtype=np.int32), np.full(batch, context, np.int32)
    fb = ForwardBatch(
        token_ids=cp.zeros(batch, cp.int32), positions=cp.asarray(lens - 1), slot_mapping=cp.zeros(batch, cp.int64),
        block_tables=cp.asarray(tables), query_start=cp.asarray(qs), context_lens=cp.asarray(lens),
        sample_rows=cp.asarray(qs[:-1]), query_start_host=qs, context_lens_host=lens, block_size=BS,
        max_query_len=1, max_context_len=context)
    return q, k, v, dataclasses.replace(fb, max_context_len=max_model_len)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--batches", default="1,32,128")
    ap.add_argument("--contexts", default="1024,16384")
    ap.add_argument("--max-model-len", type=int, default=20480)
    ap.add_argument("--variants", default="old,new", help="old (fp32 CUDA-core kernel), new (tensor-core, as "
                    "OPENINFER_DECODE_CLUSTER says), nocl (tensor-core without clusters), cl (tensor-core in clusters "
                    "of up to 8), comma-separated")
    ap.add_argument("--split-keys", default=str(attention_decode.DECODE_SPLIT_KEYS))
    ap.add_argument("--layout", default="token-major", help="token-major (the engine's), head-major (emulated, "
                    "see above), comma-separated")
    args = ap.parse_args()
    kinds = {"old": (False, 1), "new": (True, attention_decode.DECODE_CLUSTER), "nocl": (True, 1),
             "cl": (True, 8)}   # mma, most CTAs a cluster
    variants = [(name, *kinds[name]) for name in args.variants.split(",")]
    rng = np.random.default_rng(0)
    stream = cp.cuda.Stream(non_blocking=True)
    print(f"{cp.cuda.runtime.getDeviceProperties(0)['name'].decode()}; {NH} q / {NKV} kv heads, d {D}, bf16, "
          f"block {BS}, grid sized for {args.max_model_len} tokens, {CALLS} calls a graph")
    kernel = attention_decode.decode_kernel("bf16", D, 2, True)
    print("clusters of 2..8 the device holds at once:", [max_active_clusters(kernel.source, kernel.name, kernel.threads,
                                                                              kernel.smem, c) for c in range(2, 9)])
    print(f"{'lay':5} {'batch':>5} {'context':>7} {'keys':>5} {'KV MB':>8} "
          + " ".join(f"{n + ' ms':>9} {n + ' GB/s':>10}" for n, *_ in variants) + f" {'max |diff|':>10}")
    points = [(lay, int(b), int(c), int(k)) for lay in args.layout.split(",") for b in args.batches.split(",")
              for c in args.contexts.split(",") for k in args.split_keys.split(",")]
    for layout, b, ctx, keys in points:
        attention_decode.DECODE_SPLIT_KEYS = keys
        heads = (NH // NKV, 1) if layout == "head-major" else (NH, NKV)
        q, k, v, fb = make_inputs(b * NKV // heads[1], ctx, args.max_model_len, rng, *heads)
        scale = D ** -0.5
        outs, ms = {}, {}
        for name, mma, cluster in variants:
            attention.DECODE_MMA, attention_decode.DECODE_CLUSTER = mma, cluster
            ms[name] = graph_ms(lambda: attention.paged_attention(q, k, v, fb, scale), repeats=5, calls=CALLS)
            with stream:
                outs[name] = cp.asnumpy(attention.paged_attention(q, k, v, fb, scale), stream).astype(np.float32)
        kv_bytes = b * ctx * NKV * D * 2 * 2
        first = outs[variants[0][0]]
        diff = max(float(np.abs(o - first).max()) for o in outs.values())
        print(f"{layout[:5]} {b:>5} {ctx:>7} {keys:>5} {kv_bytes / 1e6:>8.1f} "
              + " ".join(f"{t:>9.4f} {kv_bytes / t / 1e6:>10.0f}" for t in ms.values()) + f" {diff:>10.2e}")
        del q, k, v, fb, outs
        cp.get_default_memory_pool().free_all_blocks()


if __name__ == "__main__":
    main()
