"""The device arrays of every state group, allocated once at load."""
from __future__ import annotations

from typing import Any

from ..model_line import StateGroup


def bytes_per_block(groups: list[StateGroup], block_size: int, itemsize: dict[str, int]) -> int:
    return sum(g.elements_per_unit() * block_size * itemsize[g.name] for g in groups if g.kind == "paged")


class StatePools:
    """Paged groups: part -> array [num_blocks, layers, block_size, *shape]; one block holds
    every layer's slice, so a block moves (offload, restore) as a unit per part.
    `layer(group, part, i)` is the [num_blocks, block_size, *shape] view kernels index."""

    def __init__(self, backend: Any, groups: list[StateGroup], num_blocks: int, block_size: int) -> None:
        self.groups = {g.name: g for g in groups}
        self.num_blocks, self.block_size = num_blocks, block_size
        self.paged: dict[str, dict[str, Any]] = {}
        for g in groups:
            if g.kind != "paged":
                raise NotImplementedError(f"state group {g.name}: kind {g.kind!r} is not supported by this engine yet")
            dtype = None if g.dtype == "model" else g.dtype
            self.paged[g.name] = {part: backend.zeros((num_blocks, g.layers, block_size, *shape), dtype)
                                  for part, shape in g.parts.items()}

    def layer(self, group: str, part: str, index: int) -> Any:
        return self.paged[group][part][:, index]
