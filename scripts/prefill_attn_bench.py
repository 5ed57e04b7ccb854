"""Prefill attention microbenchmark on one H200: the mma.sync kernel (attention_mma.cu) against the
warpgroup-MMA one (attention_wgmma.cu, its 128- and 64-key-tile variants) on one Qwen3-4B layer (32
query heads, 8 KV heads, head dim 128, bf16, block size 16, blocks shuffled over the pool): one causal
prompt of each --lens length, optionally after a --prefix of cached tokens (a prefix-cache hit).

TFLOP/s counts the causal work only: 4 * heads * d * (visible keys summed over the queries). Each
variant runs eagerly, timed by CUDA events (median of --repeats); "max |diff|" is against the mma kernel.
    python scripts/prefill_attn_bench.py [--lens 4096,16384] [--prefix 0] [--repeats 10]
"""
from __future__ import annotations

import argparse

import cupy as cp
import numpy as np

from openinfer.batch import ForwardBatch
from openinfer.kernels.cuda import attention
from openinfer.kernels.cuda.module import BF16

NH, NKV, D, BS = 32, 8, 128, 16
VARIANTS = {"mma": (False, ""), "wgmma": (True, ""), "wgmma_n64": (True, "_n64"),
            "wgmma_nostagger": (True, "_nostagger"), "wgmma_ov": (True, "_ov"), "wgmma_n64ov": (True, "_n64ov")}


def make_inputs(n: int, prefix: int, rng: np.random.Generator):
    L = prefix + n
    per = -(-L // BS)
    tables = (1 + rng.permutation(per).astype(np.int32)).reshape(1, per)
    k, v = (cp.random.standard_normal((per + 1, BS, NKV, D), dtype=cp.float32).astype(BF16) for _ in range(2))
    q = cp.random.standard_normal((n, NH, D), dtype=cp.float32).astype(BF16)
    qs, lens = np.array([0, n], np.int32), np.array([L], np.int32)
    fb = ForwardBatch(
        token_ids=cp.zeros(n, cp.int32), positions=cp.arange(prefix, L, dtype=cp.int32),
        slot_mapping=cp.zeros(n, cp.int64), block_tables=cp.asarray(tables), query_start=cp.asarray(qs),
        context_lens=cp.asarray(lens), sample_rows=cp.asarray(qs[1:] - 1), query_start_host=qs,
        context_lens_host=lens, block_size=BS, max_query_len=n, max_context_len=L)
    return q, k, v, fb


def time_ms(fn, repeats: int) -> float:
    fn()  # load the kernel outside the timing
    times = []
    for _ in range(repeats):
        start, end = cp.cuda.Event(), cp.cuda.Event()
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(cp.cuda.get_elapsed_time(start, end))
    return float(np.median(times))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--lens", default="4096,16384")
    ap.add_argument("--prefix", type=int, default=0)
    ap.add_argument("--repeats", type=int, default=10)
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    print(f"{cp.cuda.runtime.getDeviceProperties(0)['name'].decode()}; {NH} q / {NKV} kv heads, d {D}, bf16, "
          f"block {BS}, prefix {args.prefix}")
    print(f"{'tokens':>7} {'variant':>16} {'ms':>8} {'TFLOP/s':>8} {'max |diff|':>10}")
    for n in (int(x) for x in args.lens.split(",")):
        q, k, v, fb = make_inputs(n, args.prefix, rng)
        visible = n * args.prefix + n * (n + 1) // 2
        flops = 4 * NH * D * visible
        ref = None
        for name, (on, tiles) in VARIANTS.items():
            attention.PREFILL_WGMMA, attention.WGMMA_VARIANT = on, tiles
            ms = time_ms(lambda: attention.paged_attention(q, k, v, fb, D ** -0.5), args.repeats)
            out = cp.asnumpy(attention.paged_attention(q, k, v, fb, D ** -0.5)).astype(np.float32)
            ref = out if ref is None else ref
            print(f"{n:>7} {name:>16} {ms:>8.3f} {flops / ms / 1e9:>8.0f} {float(np.abs(out - ref).max()):>10.2e}")
        del q, k, v, fb
        cp.get_default_memory_pool().free_all_blocks()


if __name__ == "__main__":
    main()
