"""Whether a model fits the GPUs it is given, decided before anything loads: its weights per rank (the routed
experts split over the expert-parallel ranks, every other tensor on each) plus the KV of one full-length sequence,
against the memory one GPU offers (--gpu-memory-utilization of the card). The estimate counts floating-point
tensors in the model dtype and integer / FP8 tensors as stored, as the loaders stage them."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Mapping

from ..kv.pool import bytes_per_block, group_itemsize, with_kv_cache_dtype
from ..contract.model_line import ModelLine
from ..quant.dummy import quantized_kind
from .weights import Checkpoint

_FLOATS = ("F64", "F32", "F16", "BF16")
_STORED = {"I64": 8, "I32": 4, "I16": 2, "I8": 1, "U8": 1, "BOOL": 1, "F8_E4M3": 1}


@dataclass(frozen=True)
class MemoryNeed:
    weights_per_rank: int    # bytes
    min_kv: int              # bytes: the KV (and bounded state) of one sequence of max_len tokens
    max_len: int

    @property
    def total(self) -> int:
        return self.weights_per_rank + self.min_kv


def memory_need(line: ModelLine, cfg: Any, shapes: Mapping[str, tuple[int, ...]], weights: Any, itemsize: int,
                ep: int, max_len: int, block_size: int, kv_cache_dtype: str = "auto") -> MemoryNeed:
    """`itemsize`: bytes of the model dtype. Tensor dtypes come from the checkpoint's headers (dummy weights: the
    model dtype)."""
    per_rank = 0
    for name, shape in shapes.items():
        n = math.prod(shape)
        kind = weights.raw(name)[0] if isinstance(weights, Checkpoint) else quantized_kind(name, shapes) or "BF16"
        size = n * (itemsize if kind in _FLOATS else _STORED.get(kind, itemsize))
        per_rank += size / ep if line.expert_sharded(cfg, name) else size
    groups = with_kv_cache_dtype(line.state_spec(cfg), kv_cache_dtype)
    sizes = {g.name: group_itemsize(g, itemsize) for g in groups}
    kv = bytes_per_block(groups, block_size, sizes) * -(-max_len // block_size)
    return MemoryNeed(int(per_rank), kv, max_len)


def check_fits(name: str, need: MemoryNeed, gpu_bytes: int, utilization: float, ep: int) -> None:
    """Raise MemoryError naming the sizes when `need` exceeds what one GPU of `gpu_bytes` offers."""
    offered = gpu_bytes * utilization
    if need.total <= offered:
        return
    gib = 2**30
    raise MemoryError(
        f"{name} does not fit: each of its {ep} GPU(s) would hold {need.weights_per_rank / gib:.1f} GiB of weights + "
        f"{need.min_kv / gib:.2f} GiB of KV for one {need.max_len}-token sequence = {need.total / gib:.1f} GiB, but "
        f"a GPU offers {offered / gib:.1f} GiB ({utilization:.2f} of {gpu_bytes / gib:.1f} GiB); spread the experts "
        "over more GPUs (--ep), lower --max-model-len, or raise --gpu-memory-utilization")
