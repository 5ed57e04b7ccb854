"""`linear` for bf16 decode steps of up to 128 rows on Hopper: skinny_gemm.cu (TMA-streamed weights, wgmma with the
batch as the n dimension, split-K reduced in a thread-block cluster).

OPENINFER_SKINNY_GEMM: "0" (the default until the H200 has shown it beating cuBLASLt's tuned algorithms on Qwen3-4B's
batch-32 / 128 steps, scripts/skinny_bench.py) never; "tune" for each weight and batch width where start-up timing
(skinny_tune.py) found it faster than what runs otherwise (cuBLASLt above 8 rows, the GEMV up to 8), with the split-K
factor timed fastest; "1" for every GEMM of 9..128 rows it can take (and up to 8 rows where timing chose it).
Needs sm_90 exactly (wgmma and TMA are built for sm_90a). Operands: 16-byte aligned x / w, row strides a multiple of
16 bytes (TMA).
"""
from __future__ import annotations

import os
from contextlib import contextmanager
from typing import Callable, Iterator

import cupy as cp
import numpy as np

from . import tma
from .module import BF16, hopper, launch, max_active_clusters, sm_count

MODES = ("0", "tune", "1")
MODE = os.environ.get("OPENINFER_SKINNY_GEMM", "0")
if MODE not in MODES:
    raise ValueError(f"OPENINFER_SKINNY_GEMM={MODE!r}: choose one of {', '.join(MODES)}")
MAX_M = 128
GEMV_ROWS = 8                    # up to this many rows the GEMV (gemv.cu) runs unless timing chose this kernel
WIDTHS = (8, 16, 32, 64, 128)    # batch rows a kernel variant pads to (wgmma n)
# mirrors of skinny_gemm.cu
SG_BN, SG_BK, SG_THREADS, SG_ROW = 128, 64, 384, 128
SG_STAGE_BUDGET, SG_MAX_STAGES = 200 * 1024, 8
X2_MAX_WIDTH = 64                # the _x2 kernels (two CTAs a SM, half the stages) exist up to this width
MAX_SPLITS = 8                   # a tile's splits form one cluster: at most the portable size
MIN_KTILES_PER_SPLIT = 4         # 256 k: a split shorter than this spends its time filling the pipeline
Choice = tuple[int, int]         # (split-K factor, CTAs a SM the kernel variant is built for); (0, 1): the other path
split_choice: dict[tuple[int, int, int, int], Choice] = {}   # (device, width, N, K) -> timed fastest (skinny_tune.py)


def width(m: int) -> int:
    """The kernel variant (padded batch rows) for m rows."""
    return next(w for w in WIDTHS if m <= w)


def stages(mp: int, per_sm: int = 1) -> int:
    return min(SG_STAGE_BUDGET // per_sm // (SG_BN * SG_ROW + mp * SG_ROW), SG_MAX_STAGES)


def smem_bytes(mp: int, per_sm: int = 1) -> int:
    """Dynamic shared memory of skinny_gemm_bf16_n<mp>[_x2]: alignment slack, the stages, two mbarriers a stage."""
    return 1024 + stages(mp, per_sm) * (SG_BN * SG_ROW + mp * SG_ROW) + 2 * 8 * stages(mp, per_sm)


def variants(mp: int) -> tuple[int, ...]:
    """The CTAs-a-SM variants built for width mp."""
    return (1, 2) if mp <= X2_MAX_WIDTH else (1,)


def default_splits(n: int, k: int, sms: int, clusters_at_once: Callable[[int], int] | None = None) -> int:
    """Split-K so that the tiles fill one wave of the SMs (one CTA each), each split at least MIN_KTILES_PER_SPLIT
    stages deep, and (given `clusters_at_once`: a split factor -> how many such clusters the device holds at once;
    a cluster's CTAs share one GPC, so fewer fit than SMs over the size) every tile's cluster resident at once.
    Weights of more tiles than SMs are not split."""
    tiles, ktiles = -(-n // SG_BN), -(-k // SG_BK)
    for s in range(max(1, min(sms // tiles, ktiles // MIN_KTILES_PER_SPLIT, MAX_SPLITS)), 1, -1):
        if clusters_at_once is None or tiles <= clusters_at_once(s):
            return s
    return 1


def rule_splits(n: int, k: int, mp: int) -> int:
    """default_splits on this device, asking it how many clusters of the plain kernel fit at once (the SiLU one splits
    a weight as the plain one does: the same sums before its epilogue)."""
    return default_splits(n, k, sm_count(), lambda s: max_active_clusters(
        "skinny_gemm", f"skinny_gemm_bf16_n{mp}", SG_THREADS, smem_bytes(mp), s))


def usable(x2: cp.ndarray, w: cp.ndarray, m: int) -> bool:
    """Whether linear(x2, w) runs here: bf16, 1..128 rows, TMA-compatible operands, an H100 / H200, and start-up
    timing chose it for this weight and width (MODE "tune", or "1" up to GEMV_ROWS rows), or MODE "1" above them."""
    if MODE == "0" or not (x2.dtype == BF16 and 1 <= m <= MAX_M and x2.shape[1] > 0
                           and tma.check_operand(x2.data.ptr, x2.strides[0])
                           and tma.check_operand(w.data.ptr, w.strides[0]) and hopper()):
        return False
    return (MODE == "1" and m > GEMV_ROWS) or timed(width(m), *w.shape)[0] > 0


def timed(mp: int, n: int, k: int) -> Choice:
    """The tuner's choice for this width and weight: (0, 1) where there is none or the other path won."""
    return split_choice.get((cp.cuda.Device().id, mp, n, k), (0, 1)) if split_choice else (0, 1)


@contextmanager
def mode(value: str) -> Iterator[None]:
    """MODE is `value` inside the block (the start-up tuner's and the benchmark's comparisons with cuBLASLt)."""
    global MODE
    saved, MODE = MODE, value
    try:
        yield
    finally:
        MODE = saved


def gemm(x2: cp.ndarray, w: cp.ndarray, out2: cp.ndarray, splits: int | None = None, silu: bool = False,
         per_sm: int = 1) -> None:
    """out2[M, N] = x2[M, K] @ w[N, K].T through skinny_gemm.cu (caller checked `usable`; out2 rows packed or 16-byte
    strided). `splits` and `per_sm` override the timed choice (the tuner's and the benchmark's sweeps). `silu`: w =
    [gate; up] and out2[M, N / 2] = silu_mul(x2 @ w.T), bit for bit the two ops on this kernel (its SILU epilogue)."""
    m, k = x2.shape
    n = w.shape[0]
    mp, ktiles = width(m), -(-k // SG_BK)
    if splits is None:
        tuned = timed(mp, n, k)
        splits, per_sm = tuned if tuned[0] else (rule_splits(n, k, mp), 1)
    if per_sm not in variants(mp):
        raise ValueError(f"skinny GEMM width {mp}: no kernel for {per_sm} CTAs a SM (built: {variants(mp)})")
    splits = max(1, min(splits, ktiles, MAX_SPLITS))   # every split at least one stage
    cols = n // 2 if silu else n                       # output columns
    wmap = tma.matrix_map(w.data.ptr, n, k, w.strides[0], SG_BN // 2 if silu else SG_BN)
    xmap = tma.matrix_map(x2.data.ptr, m, k, x2.strides[0], mp)
    tiles = -(-cols // (SG_BN // 2)) if silu else -(-n // SG_BN)
    name = f"skinny_gemm_{'silu_bf16' if silu else 'bf16'}_n{mp}{'_x2' if per_sm == 2 else ''}"
    launch("skinny_gemm", name, (tiles, splits), SG_THREADS,
           (wmap, xmap, out2, np.int64(out2.strides[0] // 2), np.int32(m), np.int32(cols), np.int32(ktiles)),
           smem_bytes(mp, per_sm), cluster=(1, splits, 1) if splits > 1 else None)
