"""The decode graphs' static inputs (backends/graph_inputs.py) on the CPU: layout, padding rows,
state rows, and what a captured batch exposes."""
from __future__ import annotations

import numpy as np
import pytest

from openinfer.backends.cuda_graphs import buckets
from openinfer.backends.graph_inputs import WORDS, GraphInputs
from openinfer.engine.model_runner import HostBatch


def step(tokens, positions, slots, ctx, tables, state_slots=None) -> HostBatch:
    B = len(tokens)
    return HostBatch(np.asarray(tokens, np.int32), np.asarray(positions, np.int32), np.asarray(slots, np.int64),
                     np.asarray(tables, np.int32).reshape(B, -1), np.arange(B + 1, dtype=np.int32),
                     np.asarray(ctx, np.int32), np.arange(B, dtype=np.int32),
                     None if state_slots is None else np.asarray(state_slots, np.int32))


def upload(x: GraphInputs, width: int) -> None:
    x.meta[:] = x.host
    x.tables[:, :width] = x.host_tables[:, :width]


def test_stage_fills_the_rows_and_pads_the_rest():
    x = GraphInputs(np, 4, 6)
    h = step([11, 12, 13], [40, 7, 99], [3 * 16 + 8, 5 * 16 + 7, 2**33 + 3], [41, 8, 100],
             [[3, 4, 9], [5, 0, 0], [1, 2, 6]], state_slots=[2, 5, 1])
    width = x.stage(h)
    assert width == 3
    upload(x, width)
    b = x.batch(4, 16, 96, state_slots=True)
    np.testing.assert_array_equal(b.token_ids, [11, 12, 13, 0])
    np.testing.assert_array_equal(b.positions, [40, 7, 99, 0])
    np.testing.assert_array_equal(b.slot_mapping, [56, 87, 2**33 + 3, 0])   # int64 survives the int32 buffer
    assert b.slot_mapping.dtype == np.int64
    np.testing.assert_array_equal(b.context_lens, [41, 8, 100, 1])          # padding: one token, no state before
    np.testing.assert_array_equal(b.state_slots, [2, 5, 1, 0])              # padding: the reserved row 0
    np.testing.assert_array_equal(b.block_tables[:, :3], [[3, 4, 9], [5, 0, 0], [1, 2, 6], [0, 0, 0]])
    np.testing.assert_array_equal(b.query_start, np.arange(5))
    np.testing.assert_array_equal(b.sample_rows, np.arange(4))
    assert b.is_decode and b.max_context_len == 96 and b.num_seqs == 4


def test_a_smaller_step_leaves_no_stale_rows():
    x = GraphInputs(np, 4, 6)
    upload(x, x.stage(step([1, 2, 3, 4], [5] * 4, [9] * 4, [6] * 4, [[7, 7]] * 4, state_slots=[1, 2, 3, 4])))
    upload(x, x.stage(step([8], [2], [17], [3], [[1]], state_slots=[4])))
    b = x.batch(4, 16, 96, state_slots=True)
    np.testing.assert_array_equal(b.token_ids, [8, 0, 0, 0])
    np.testing.assert_array_equal(b.slot_mapping, [17, 0, 0, 0])
    np.testing.assert_array_equal(b.context_lens, [3, 1, 1, 1])
    np.testing.assert_array_equal(b.state_slots, [4, 0, 0, 0])
    np.testing.assert_array_equal(b.block_tables[:, 0], [1, 0, 0, 0])
    # columns past the step's width keep older entries: a row reads only ceil(context / block) of them
    assert (b.block_tables[1:, 1] == 7).all()


def test_a_smaller_bucket_views_the_front_of_the_same_buffers():
    x = GraphInputs(np, 8, 2)
    upload(x, x.stage(step([5, 6], [1, 2], [3, 4], [2, 3], [[1], [2]], state_slots=[3, 4])))
    small, big = x.batch(2, 16, 32, state_slots=True), x.batch(8, 16, 32, state_slots=True)
    for name in ("token_ids", "positions", "slot_mapping", "context_lens", "state_slots", "block_tables"):
        assert np.shares_memory(getattr(small, name), x.meta if name != "block_tables" else x.tables)
        np.testing.assert_array_equal(getattr(small, name), getattr(big, name)[:2])
    assert x.meta.size == WORDS * 8


def test_models_without_bounded_state_get_no_state_slots():
    x = GraphInputs(np, 2, 2)
    x.stage(step([1], [0], [16], [1], [[1]]))
    assert x.batch(2, 16, 32, state_slots=False).state_slots is None
    assert x.host[5 * 2:].tolist() == [0, 0]


def test_stage_rejects_what_no_graph_can_take():
    x = GraphInputs(np, 2, 2)
    with pytest.raises(ValueError, match="1..2 sequences"):
        x.stage(step([1, 2, 3], [0] * 3, [0] * 3, [1] * 3, [[1]] * 3))
    with pytest.raises(ValueError, match="exceeds"):
        x.stage(step([1], [0], [0], [1], [[1, 2, 3]]))
    prefill = step([1, 2], [0, 1], [0, 1], [2, 2], [[1], [1]])
    prefill.context_lens = np.array([2], np.int32)   # two tokens of one sequence: not a decode step
    with pytest.raises(ValueError, match="one token each"):
        x.stage(prefill)


def test_buckets_cover_every_batch_size():
    for n in (1, 3, 8, 64, 100):
        sizes = buckets(n)
        assert sizes[-1] == n and sizes == sorted(set(sizes))
        assert all(any(b >= k for b in sizes) for k in range(1, n + 1))
