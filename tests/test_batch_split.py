"""ForwardBatch.leading_one_token_runs and split: a mixed step cut into its decoding rows and its prompts, each a
batch of its own for per-sequence ops (Qwen3.5's recurrent mixer runs the two on different kernels)."""
from __future__ import annotations

import numpy as np

from openinfer.engine.batch import ForwardBatch


def _batch(runs: list[tuple[int, int]], checkpoints: list[int] | None = None) -> ForwardBatch:
    """runs: (tokens cached before, tokens this step) per sequence."""
    qs = np.concatenate([[0], np.cumsum([n for _, n in runs])]).astype(np.int32)
    T, lens = int(qs[-1]), np.asarray([p + n for p, n in runs], np.int32)
    b = ForwardBatch(np.arange(100, 100 + T, dtype=np.int32), np.arange(T, dtype=np.int32),
                     np.arange(T, dtype=np.int64) * 3, np.arange(len(runs) * 4, dtype=np.int32).reshape(-1, 4),
                     qs.copy(), lens.copy(), np.asarray([T - 1], np.int32), qs, lens, 16, int(np.diff(qs).max()),
                     int(lens.max()), state_slots=np.arange(7, 7 + len(runs), dtype=np.int32))
    if checkpoints is not None:
        b.checkpoint_lens = np.asarray(checkpoints, np.int32)
        b.checkpoint_rows = np.arange(20, 20 + len(runs), dtype=np.int32)
    return b


def test_leading_one_token_runs():
    assert _batch([(5, 1), (9, 1), (0, 30), (3, 1)]).leading_one_token_runs() == 2
    assert _batch([(0, 30), (3, 1)]).leading_one_token_runs() == 0
    assert _batch([(5, 1), (9, 1)]).leading_one_token_runs() == 2


def test_split_gives_two_batches_of_their_own():
    b = _batch([(5, 1), (9, 1), (0, 30), (2, 4)], checkpoints=[0, 0, 16, 0])
    head, tail = b.split(2)
    assert head.num_seqs == 2 and head.num_tokens == 2 and head.is_decode and head.checkpoint_lens is None
    assert head.token_ids.tolist() == [100, 101] and head.state_slots.tolist() == [7, 8]
    assert head.context_lens.tolist() == [6, 10] and head.block_tables.tolist() == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert tail.num_seqs == 2 and tail.num_tokens == 34 and not tail.is_decode and tail.max_query_len == 30
    assert tail.query_start.tolist() == tail.query_start_host.tolist() == [0, 30, 34]
    assert tail.token_ids[0] == 102 and tail.slot_mapping[0] == 6 and tail.positions[0] == 2
    assert tail.state_slots.tolist() == [9, 10] and tail.checkpoint_lens.tolist() == [16, 0]
    assert tail.checkpoint_rows.tolist() == [22, 23] and tail.context_lens_host.tolist() == [30, 6]
    assert len(head.sample_rows) == len(tail.sample_rows) == 0
    assert b.query_start.tolist() == [0, 1, 2, 32, 36]   # the step's own batch is left as it was
