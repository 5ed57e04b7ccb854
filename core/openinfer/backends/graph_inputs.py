"""The static inputs of the decode CUDA graphs, and how a step's values are staged into them.

A captured graph reads fixed device addresses, so every per-step input lives in one int32 device
buffer (plus the block table) that a step overwrites before replaying. The values are first
written into a host mirror of the same layout (pinned on CUDA), then uploaded in two copies.
Nothing here touches a GPU: `xp` is the array module of the device buffers (cupy, or numpy
in tests), so the staging and the batch views are checked on the CPU.

Layout of the buffer for max batch n (int32 words):
    [0, 2n)   slot_mapping, int64 (first: 8-byte aligned)
    [2n, 3n)  token_ids       [3n, 4n) positions
    [4n, 5n)  context_lens    [5n, 6n) state_slots (rows of the "slots" state groups)
Padding rows (batch rows past the step's sequences, up to the bucket size) compute a throw-away
token: token 0 at position 0, context 1, its K/V written to the reserved block 0 and its bounded
state to the reserved state row 0 (neither is ever handed out, kv/block_manager.py, kv/hybrid.py);
context 1 also means "no state before this token", so a padding row never reads a state row.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from ..engine.batch import ForwardBatch

if TYPE_CHECKING:
    from ..engine.model_runner import HostBatch

WORDS = 6   # int32 words per batch row in the buffer (slot_mapping takes two)


class GraphInputs:
    def __init__(self, xp: Any, max_b: int, width: int, host: Any = None, host_tables: Any = None) -> None:
        """`host` / `host_tables`: buffers of >= 6·max_b and max_b·width int32 for the mirrors
        (pinned memory on CUDA); fresh host arrays when None."""
        self.xp, self.n, self.width = xp, max_b, width
        n = max_b
        self.host = np.frombuffer(host, np.int32, WORDS * n) if host is not None else np.zeros(WORDS * n, np.int32)
        self.host_tables = (np.frombuffer(host_tables, np.int32, n * width) if host_tables is not None
                            else np.zeros(n * width, np.int32)).reshape(n, width)
        self.meta = xp.zeros(WORDS * n, dtype=xp.int32)
        self.tables = xp.zeros((n, width), dtype=xp.int32)
        self.arange = xp.arange(n + 1, dtype=xp.int32)   # query starts and sample rows: one token a row

    def batch(self, b: int, block_size: int, max_model_len: int, state_slots: bool) -> ForwardBatch:
        """The batch a graph of bucket size b is captured with: views of the static buffers only.
        Its host fields are placeholders (a replay runs no Python), so a decode op must read the
        device fields alone (engine/batch.py)."""
        n, m = self.n, self.meta
        return ForwardBatch(
            slot_mapping=m[: 2 * n].view(self.xp.int64)[:b], token_ids=m[2 * n: 2 * n + b],
            positions=m[3 * n: 3 * n + b], context_lens=m[4 * n: 4 * n + b], block_tables=self.tables[:b],
            query_start=self.arange[: b + 1], sample_rows=self.arange[:b],
            query_start_host=np.arange(b + 1, dtype=np.int32), context_lens_host=np.ones(b, np.int32),
            block_size=block_size, max_query_len=1, max_context_len=max_model_len,
            state_slots=m[5 * n: 5 * n + b] if state_slots else None)

    def ids(self, b: int) -> Any:
        """The device token-id inputs of the first b rows (a pipelined step fills them on the device)."""
        return self.meta[2 * self.n: 2 * self.n + b]

    def stage(self, h: HostBatch) -> int:
        """Write a decode step's inputs into the host mirrors, padding rows included; returns the
        block-table columns to upload (the step's widest table, at least 1)."""
        n, B = self.n, len(h.token_ids)
        if B > n or len(h.context_lens) != B:
            raise ValueError(f"a graph step takes 1..{n} sequences of one token each, got {B} tokens of "
                             f"{len(h.context_lens)} sequences")
        if h.block_tables.shape[1] > self.width:
            raise ValueError(f"block table of {h.block_tables.shape[1]} blocks exceeds the graphs' {self.width}")
        x = self.host
        self.clear(h.block_tables.shape[1], B)
        x[: 2 * n].view(np.int64)[:B] = h.slot_mapping
        x[2 * n: 2 * n + B] = h.token_ids
        x[3 * n: 3 * n + B] = h.positions
        x[4 * n: 4 * n + B] = h.context_lens
        if h.state_slots is not None:
            x[5 * n: 5 * n + B] = h.state_slots
        self.host_tables[:B, : h.block_tables.shape[1]] = h.block_tables
        return max(1, h.block_tables.shape[1])

    def clear(self, width: int | None = None, written: int = 0) -> int:
        """Every row a padding row (in the first `width` table columns; all when None), except that
        the table rows of the first `written` rows, which the caller overwrites whole, are left as
        they are; returns the table columns to upload."""
        n = self.n
        self.host[:] = 0
        self.host[4 * n: 5 * n] = 1
        width = self.width if width is None else max(1, width)
        self.host_tables[written:, :width] = 0
        return width
