"""The device arrays of every state group, allocated once at load."""
from __future__ import annotations

from dataclasses import replace
from typing import Any, Iterable

from ..contract.model_line import StateGroup
from ..quant.fp8 import E4M3

FP8 = "fp8_e4m3"                       # a group's dtype under --kv-cache-dtype fp8: e4m3 values, held as E4M3
KV_CACHE_DTYPES = ("auto", "fp8")


def with_kv_cache_dtype(groups: list[StateGroup], kv_cache_dtype: str) -> list[StateGroup]:
    """The groups as the engine allocates them: under "fp8" every group its line reads in fp8 (StateGroup.fp8)
    holds e4m3 bytes, half a bf16 cache; "auto" keeps the line's dtypes."""
    if kv_cache_dtype == "auto":
        return groups
    return [replace(g, dtype=FP8) if g.fp8 else g for g in groups]


def group_itemsize(group: StateGroup, model_itemsize: int) -> int:
    """Bytes of one element of the group's arrays."""
    return 4 if group.dtype == "float32" else 1 if group.dtype == FP8 else model_itemsize


def bytes_per_block(groups: list[StateGroup], block_size: int, itemsize: dict[str, int]) -> int:
    return sum(g.elements_per_unit() * block_size * itemsize[g.name] for g in groups if g.kind == "paged")


def bytes_per_state_row(groups: list[StateGroup], itemsize: dict[str, int]) -> int:
    """Bytes of one row of every "slots" group (one request's bounded state, or one checkpoint)."""
    return sum(g.elements_per_unit() * itemsize[g.name] for g in groups if g.kind == "slots")


class StatePools:
    """Paged groups: part -> array [num_blocks, layers, block_size, *shape]; one block holds
    every layer's slice, so a block moves (offload, restore) as a unit per part.
    Slots groups: part -> array [num_state_rows, layers, *shape]; a row is one request's live
    bounded state or one prefix checkpoint of it (kv/hybrid.py assigns the rows), so saving or
    restoring a checkpoint is a row copy.
    `layer(group, part, i)` is the view kernels index: [num_blocks, block_size, *shape] (paged)
    or [num_state_rows, *shape] (slots)."""

    def __init__(self, backend: Any, groups: list[StateGroup], num_blocks: int, block_size: int,
                 num_state_rows: int = 0) -> None:
        self.groups = {g.name: g for g in groups}
        self.num_blocks, self.block_size = num_blocks, block_size
        self.num_state_rows = num_state_rows
        self.paged: dict[str, dict[str, Any]] = {}
        self.slots: dict[str, dict[str, Any]] = {}
        for g in groups:
            dtype = None if g.dtype == "model" else E4M3.name if g.dtype == FP8 else g.dtype
            if g.kind == "paged":
                lead: tuple[int, ...] = (num_blocks, g.layers, block_size)
                target = self.paged
            elif g.kind == "slots":
                if num_state_rows < 1:
                    raise ValueError(f"state group {g.name!r} needs state rows; none were allotted")
                lead, target = (num_state_rows, g.layers), self.slots
            else:
                raise ValueError(f"state group {g.name}: unknown kind {g.kind!r}")
            target[g.name] = {part: backend.zeros((*lead, *shape), dtype) for part, shape in g.parts.items()}

    def layer(self, group: str, part: str, index: int) -> Any:
        arrays = self.paged.get(group) or self.slots[group]
        return arrays[part][:, index]

    def copy_state_rows(self, copies: Iterable[tuple[int, int]]) -> None:
        """Copy (src, dst) rows of every slots group, in order: a later copy may read a row an
        earlier one wrote (a checkpoint saved, then restored into a new request)."""
        _copy_rows(self.slots, copies)

    def copy_blocks(self, copies: Iterable[tuple[int, int]]) -> None:
        """Copy (src, dst) blocks of every paged group (copy-on-write of a shared prefix block);
        on a GPU these are device copies queued on the current stream, ahead of the forward."""
        _copy_rows(self.paged, copies)


def _copy_rows(groups: dict[str, dict[str, Any]], copies: Iterable[tuple[int, int]]) -> None:
    for src, dst in copies:
        for parts in groups.values():
            for arr in parts.values():
                arr[dst] = arr[src]
