"""Bounded per-request state (kind "slots") in the KV manager, with no model: slot accounting,
state checkpoints gating prefix hits, their LRU, the in-prefill save at a prompt's last full
block, and row copies."""
from __future__ import annotations

import numpy as np

from openinfer.backends.numpy_backend import NumpyBackend
from openinfer.kv.hybrid import HybridBlockManager, num_state_rows
from openinfer.kv.pool import StatePools, bytes_per_state_row
from openinfer.contract.model_line import StateGroup
from openinfer.engine.request import Request, RequestStream, Status
from openinfer.sampling.sampler import SamplingParams
from openinfer.engine.scheduler import Scheduler


def req(rid: str, prompt: list[int], max_tokens: int = 4) -> Request:
    return Request(rid, prompt, SamplingParams(max_tokens=max_tokens), RequestStream(rid), 0.0)


def step(bm: HybridBlockManager, r: Request, n: int) -> None:
    """Compute n more tokens of r (the engine's allocate -> forward -> commit)."""
    bm.allocate(r, r.num_computed + n)
    r.num_computed += n
    bm.commit(r)


def manager(slots: int = 2, checkpoints: int = 4, blocks: int = 64) -> HybridBlockManager:
    return HybridBlockManager(blocks, 4, True, num_slots=slots, num_checkpoints=checkpoints)


def test_a_request_needs_a_slot_and_gives_it_back():
    bm = manager(slots=2)
    a, b, c = req("a", [1, 2, 3]), req("b", [4, 5, 6]), req("c", [7, 8, 9])
    assert bm.try_admit(a) and bm.try_admit(b)
    assert {a.state_slot, b.state_slot} == {1, 2}      # row 0 is never handed out
    reserved = bm.reserved
    assert not bm.try_admit(c) and c.state_slot is None and bm.reserved == reserved
    bm.release(a)
    assert a.state_slot is None and bm.try_admit(c) and c.state_slot == 1


def test_scheduler_defers_requests_without_a_free_slot():
    bm = manager(slots=1)
    s = Scheduler(bm, max_num_batched_tokens=64, max_num_seqs=8)
    a, b = req("a", [1, 2, 3]), req("b", [4, 5, 6])
    s.add(a)
    s.add(b)
    plan = s.schedule()
    assert [r.req.request_id for r in plan.runs] == ["a"] and b.status == Status.WAITING
    s.finish(a)                                          # finish or abort frees the slot at once
    assert [r.req.request_id for r in s.schedule().runs] == ["b"]


def test_prefill_is_not_cut_and_saves_the_prompts_last_full_block_in_the_step():
    bm = manager()
    a = req("a", list(range(10)))                        # last reusable boundary: 8
    assert bm.try_admit(a)
    assert bm.prefill_chunk(a, 10) == 10                  # one step ...
    assert a.state_checkpoint == (8, 3)                   # ... that writes row 3 (1 + 2 slots) at token 8
    assert bm.checkpoints.rows == {} and 3 not in bm.checkpoints.free   # reserved, not hit-able yet
    early = req("early", list(range(10)))
    assert bm.try_admit(early) and early.cached_tokens == 0
    bm.release(early)
    step(bm, a, 10)
    assert a.state_checkpoint is None and bm.take_state_copies() == []   # no copy: the forward wrote it
    assert bm.checkpoints.rows == {a.block_hashes[1]: 3}
    bm.release(a)
    again = req("again", list(range(10)))
    assert bm.try_admit(again) and again.cached_tokens == 8
    assert bm.take_state_copies() == [(3, again.state_slot)]   # the checkpoint restored into its row
    assert bm.prefill_chunk(again, 2) == 2 and again.state_checkpoint is None   # starts at the boundary


def test_in_prefill_saves_of_chunks_duplicates_and_failed_steps():
    bm = manager(slots=3)
    a = req("a", list(range(11)))
    assert bm.try_admit(a)
    assert bm.prefill_chunk(a, 6) == 6 and a.state_checkpoint is None    # the boundary 8 is past the chunk
    step(bm, a, 6)
    assert bm.prefill_chunk(a, 5) == 5 and a.state_checkpoint == (8, 4)  # crossed inside the second chunk
    b = req("b", list(range(11)))                                         # the same prompt, same step
    assert bm.try_admit(b) and bm.prefill_chunk(b, 11) == 11 and b.state_checkpoint == (8, 5)
    step(bm, a, 5)
    step(bm, b, 11)
    assert bm.checkpoints.rows == {a.block_hashes[1]: 4} and 5 in bm.checkpoints.free   # one kept
    c = req("c", list(range(50, 61)))
    assert bm.try_admit(c) and bm.prefill_chunk(c, 11) == 11 and c.state_checkpoint is not None
    row = c.state_checkpoint[1]
    bm.release(c)                                          # its step failed: the row was never written
    assert c.state_checkpoint is None and row in bm.checkpoints.free and len(bm.checkpoints.rows) == 1


def test_kv_hits_without_a_state_checkpoint_are_not_reused():
    bm = manager()
    a = req("a", list(range(13)))
    assert bm.try_admit(a)
    step(bm, a, 12)                                       # checkpoint at 12 only; blocks at 4, 8, 12
    bm.release(a)
    assert len(bm.by_hash) == 3
    b = req("b", list(range(9)) + [99, 98])               # KV of blocks 0, 1 cached, no state at 8
    assert bm.try_admit(b) and b.cached_tokens == 0 and b.block_ids == []
    none = HybridBlockManager(64, 4, True, num_slots=2, num_checkpoints=0)
    c = req("c", list(range(13)))
    assert none.try_admit(c) and none.prefill_chunk(c, 13) == 13
    step(none, c, 13)
    none.release(c)
    d = req("d", list(range(13)))
    assert none.try_admit(d) and d.cached_tokens == 0


def test_decode_keeps_one_rolling_checkpoint_per_request():
    bm = manager(checkpoints=4)
    a = req("a", [1, 2, 3, 4, 5], max_tokens=12)
    assert bm.try_admit(a)
    step(bm, a, 4)                                        # prompt checkpoint at 4
    step(bm, a, 1)
    assert len(bm.take_state_copies()) == 1
    rows = []
    for t in range(10):                                   # decode: boundaries 8 and 12
        a.output_ids.append(100 + t)
        step(bm, a, 1)
        rows += bm.take_state_copies()
    assert a.num_computed == 15 and len(rows) == 2        # saved at 8, then at 12 ...
    assert list(bm.checkpoints.rows) == [a.block_hashes[0], a.block_hashes[2]]   # ... which replaced 8
    bm.release(a)
    turn2 = req("t2", a.all_ids[:13] + [7, 7, 7])
    assert bm.try_admit(turn2) and turn2.cached_tokens == 12


def test_checkpoints_are_evicted_least_recently_used_first():
    bm = manager(slots=1, checkpoints=2)
    prompts = [[i * 100 + j for j in range(5)] for i in range(3)]
    for i, p in enumerate(prompts):
        r = req(str(i), p)
        assert bm.try_admit(r)
        step(bm, r, 4)
        bm.release(r)
        if i == 1:                                         # touch prompt 0: prompt 1 becomes the LRU one
            probe = req("probe", prompts[0])
            assert bm.try_admit(probe) and probe.cached_tokens == 4
            bm.release(probe)
    hits = []
    for p in prompts:
        r = req("again", p)
        assert bm.try_admit(r)
        hits.append(r.cached_tokens)
        bm.release(r)
    assert hits == [4, 0, 4]


def test_state_rows_copy_in_order():
    groups = [StateGroup("kv", "paged", 1, {"k": (1, 2), "v": (1, 2)}),
              StateGroup("gdn", "slots", 2, {"conv": (3, 4), "ssm": (2, 2, 2)}, dtype="float32")]
    rows = num_state_rows(2, 2)
    pools = StatePools(NumpyBackend(), groups, num_blocks=4, block_size=4, num_state_rows=rows)
    conv = pools.layer("gdn", "conv", 1)
    assert conv.shape == (rows, 3, 4) and pools.layer("gdn", "ssm", 0).shape == (rows, 2, 2, 2)
    conv[1] = 1.0
    pools.copy_state_rows([(1, 3), (3, 2), (4, 3)])        # save 1 -> 3, restore 3 -> 2, overwrite 3
    assert conv[2].min() == 1.0 and conv[3].max() == 0.0
    assert bytes_per_state_row(groups, {"kv": 4, "gdn": 4}) == 4 * 2 * (12 + 8)
    assert np.shares_memory(conv, pools.slots["gdn"]["conv"])
