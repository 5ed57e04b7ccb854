"""The per-step input every model's forward receives (attention metadata included).

One flat batch of T tokens from B sequences; each sequence contributes a contiguous run of query
tokens (a prefill chunk or a single decode token) whose K/V land in paged blocks. The same
shape serves prefill, decode, mixed steps and prefix hits, on every backend.

A decode batch (every run one token) may be a CUDA graph's (backends/graph_inputs.py): its device
fields are views of static buffers refilled before each replay, while its host fields and
max_context_len are fixed at capture. So ops on a decode batch read the device fields only:
a sequence has state before its run exactly when context_lens[i] > query_start[i+1] - query_start[i]
(for decode: context_lens[i] > 1). Padding rows of a graph have context 1, state row 0, block 0.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import Any

import numpy as np

Array = Any  # a backend array: numpy.ndarray on the CPU, cupy.ndarray on CUDA


@dataclass
class ForwardBatch:
    token_ids: Array        # [T] int32
    positions: Array        # [T] int32, absolute position of each token in its sequence
    slot_mapping: Array     # [T] int64, where each token's K/V goes: block * block_size + offset
    block_tables: Array     # [B, max_blocks] int32, padded with 0
    query_start: Array      # [B + 1] int32, offsets of each sequence's tokens in the flat batch
    context_lens: Array     # [B] int32, KV length of each sequence after this step
    sample_rows: Array      # [S] int32, rows of the flat batch whose logits are needed
    # host copies of the per-sequence metadata (the numpy kernels loop over sequences)
    query_start_host: np.ndarray
    context_lens_host: np.ndarray
    block_size: int
    max_query_len: int
    max_context_len: int
    state_slots: Array | None = None  # [B] int32, each sequence's row in the "slots" state groups
    # a prefill step may save a sequence's state part-way through its run (kv/hybrid.py); None when none does
    checkpoint_lens: Array | None = None   # [B] int32, save after this many tokens of the run (0: none; else < run length)
    checkpoint_rows: Array | None = None   # [B] int32, the "slots" state row the save goes to

    @property
    def num_tokens(self) -> int:
        return int(self.query_start_host[-1])

    @property
    def num_seqs(self) -> int:
        return len(self.context_lens_host)

    @property
    def is_decode(self) -> bool:
        return self.max_query_len == 1

    def leading_one_token_runs(self) -> int:
        """How many runs at the front of the batch are one token long: a mixed step's decoding rows, which the
        scheduler puts before its prompts."""
        return leading_one_token_runs(self.query_start_host)

    @cached_property
    def one_token_split(self) -> tuple[ForwardBatch, ForwardBatch] | None:
        """`split` after a mixed step's leading one-token runs, None where there is nothing to cut (a decode step, or
        one that starts with a longer run); made once a step, however many layers ask."""
        n = 0 if self.is_decode else self.leading_one_token_runs()
        return self.split(n) if n else None

    def split(self, n: int) -> tuple[ForwardBatch, ForwardBatch]:
        """The first n sequences and the rest, each as a batch of its own (the rest's query_start and token rows
        from its first token), for ops that run per sequence (a recurrent mixer's one-token and chunked kernels).
        Neither part samples (sample_rows empty); a part of one-token runs carries no checkpoints (a save lies
        strictly inside a run)."""
        t = int(self.query_start_host[n])
        ck = self.checkpoint_lens is not None

        def part(seqs: slice, toks: slice, qs: Array, qs_host: np.ndarray, max_query_len: int,
                 checkpoints: bool) -> ForwardBatch:
            return ForwardBatch(
                self.token_ids[toks], self.positions[toks], self.slot_mapping[toks], self.block_tables[seqs], qs,
                self.context_lens[seqs], self.sample_rows[:0], qs_host, self.context_lens_host[seqs],
                self.block_size, max_query_len, self.max_context_len,
                None if self.state_slots is None else self.state_slots[seqs],
                self.checkpoint_lens[seqs] if checkpoints else None,
                self.checkpoint_rows[seqs] if checkpoints else None)
        head_len = int(np.diff(self.query_start_host[: n + 1]).max(initial=0))
        head = part(slice(0, n), slice(0, t), self.query_start[: n + 1], self.query_start_host[: n + 1], head_len,
                    ck and head_len > 1)
        tail = part(slice(n, None), slice(t, None), self.query_start[n:] - t, self.query_start_host[n:] - t,
                    self.max_query_len, ck)
        return head, tail


def leading_one_token_runs(query_start: np.ndarray) -> int:
    """How many runs at the front of a batch with these query starts ([B + 1]) are one token long."""
    longer = np.flatnonzero(np.diff(query_start) != 1)
    return int(longer[0]) if len(longer) else len(query_start) - 1
