"""On a GPU: does a step's small copy wait behind a host-tier save (or restore) in flight on another stream?

The hypothesis behind the bounded save-ahead batches (kv/host_tier.py): the step's token readback
(a small device->host copy on the step stream) runs on the copy engine after the save batches
queued before it, so a 1024-block save issued as the engine went idle (Qwen3-4B: 2.4 GB, ~45 ms)
holds the next request's first token. Times, with the production copier (CudaBlockCopier) on
Qwen3-4B-sized blocks (2 arrays of 1.125 MiB per block):
  readback   a tiny kernel + copy-on-write of one block + backend.to_host of 64 ints (a hit step's copies)
  upload     backend.asarray of 64 ints + to_host (a step's input upload, then its readback)
each idle, right after a save of N blocks was issued, and right after a restore of N blocks was issued.
    python scripts/gpu_copy_queue.py [--blocks 1024] [--small 28] [--repeats 5]
"""
from __future__ import annotations

import argparse
import time
from typing import Callable

import numpy as np

from openinfer.backends import get_backend

BLOCK_SHAPE = (36, 16, 8, 128)   # layers, block size, kv heads, head dim: one part of one Qwen3-4B block


def ms(fn: Callable[[], object]) -> float:
    t0 = time.perf_counter()
    fn()
    return (time.perf_counter() - t0) * 1e3


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--blocks", type=int, default=1024, help="the large batch: a 16k-token prompt")
    ap.add_argument("--small", type=int, default=28, help="the bounded batch (64 MiB of these blocks)")
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    backend = get_backend("cuda")
    backend.activate()
    n = args.blocks + 2
    k, v = backend.zeros((n, *BLOCK_SHAPE)), backend.zeros((n, *BLOCK_SHAPE))
    copier = backend.block_copier([k, v], args.blocks)
    tokens = backend.zeros((64,), "int32")
    ids = np.arange(64, dtype=np.int32)

    def readback() -> None:
        with backend.stream:
            tokens[...] += 1
            k[n - 1] = k[0]             # copy-on-write of the hit's last block
            v[n - 1] = v[0]
        backend.to_host(tokens)

    def upload() -> None:
        backend.to_host(backend.asarray(ids, "int32"))

    def pairs(count: int) -> list[tuple[int, int]]:
        return [(1 + i, i) for i in range(count)]

    for f in (readback, upload):   # warm-up: kernels compiled, staging buffers touched
        f()
    backend.synchronize()
    rows = []
    for name, op in (("readback", readback), ("upload", upload)):
        rows.append((name, "idle", float(np.median([ms(op) for _ in range(args.repeats * 4)])), None))
        for kind in ("save", "restore"):
            for count in (args.blocks, args.small):
                got, copy = [], []
                for _ in range(args.repeats):
                    backend.synchronize()
                    t0 = time.perf_counter()
                    transfer = copier.save(pairs(count)) if kind == "save" else copier.restore(pairs(count))
                    got.append(ms(op))
                    transfer.wait()
                    copy.append((time.perf_counter() - t0) * 1e3)
                rows.append((name, f"{kind} {count} blocks in flight", float(np.median(got)), float(np.median(copy))))
    print(f"{'op':<9} {'while':<30} {'op ms':>8} {'copy issued -> landed ms':>25}")
    for name, when, op_ms, copy_ms in rows:
        print(f"{name:<9} {when:<30} {op_ms:>8.2f} {'-' if copy_ms is None else f'{copy_ms:.1f}':>25}")


if __name__ == "__main__":
    main()
