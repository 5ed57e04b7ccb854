"""The host offload tier (--kv-offload): save on eviction, restore at admission, LRU and capacity,
blocks in flight, abort while restoring; identical greedy output for cold / device hit / host restore."""
from __future__ import annotations

import time
from typing import Sequence

import numpy as np
import pytest

from openinfer.backends import NumpyBackend
from openinfer.backends.block_copy import BlockCopier, HostPoolCopier, Pairs, Transfer, runs
from openinfer.engine.engine import EngineArgs, build_engine
from openinfer.kv.block_manager import BlockManager
from openinfer.kv import host_tier
from openinfer.kv.host_tier import HostTier, offloadable_arrays
from openinfer.kv.pool import StatePools
from openinfer.contract.model_line import StateGroup
from openinfer.engine.request import Status
from openinfer.engine.scheduler import Scheduler
from openinfer.server.metrics import ModelMetrics, render
from openinfer.testing.engine import collect, demo_kv_gib, generate, greedy
from openinfer.testing.graphs import emulate_graphs
from test_kv_and_scheduler import compute_all, req


class HeldTransfer(Transfer):
    """Lands only when the test says so."""

    def __init__(self) -> None:
        self.landed = False

    def done(self) -> bool:
        return self.landed

    def wait(self) -> None:
        self.landed = True


class RecordingCopier(BlockCopier):
    host = [np.zeros((1, 1), np.uint8)]   # 1-byte blocks: a save-ahead batch is never bounded in practice

    def __init__(self) -> None:
        self.saves: list[list[tuple[int, int]]] = []
        self.save_transfers: list[HeldTransfer] = []
        self.reused: list[list[int]] = []
        self.restores: list[tuple[list[tuple[int, int]], HeldTransfer]] = []
        self.hold_saves = False

    def save(self, pairs: Pairs) -> Transfer:
        self.saves.append(list(pairs))
        t = HeldTransfer()
        t.landed = not self.hold_saves
        self.save_transfers.append(t)
        return t

    def reuse(self, blocks: Sequence[int]) -> None:
        self.reused.append(list(blocks))

    def restore(self, pairs: Pairs) -> Transfer:
        t = HeldTransfer()
        self.restores.append((list(pairs), t))
        return t


def tiered(num_blocks: int = 5, capacity: int = 8, watermark: int = 0
           ) -> tuple[BlockManager, HostTier, RecordingCopier]:
    bm = BlockManager(num_blocks=num_blocks, block_size=4)
    copier = RecordingCopier()
    return bm, HostTier(bm, copier, capacity, watermark), copier


def cache_and_release(bm: BlockManager, rid: str, prompt: list[int], max_tokens: int = 1) -> None:
    r = req(rid, prompt, max_tokens)
    assert bm.try_admit(r)
    compute_all(bm, r)
    bm.release(r)


def fill(bm: BlockManager, rid: str, start: int) -> None:
    """A request that takes every available block (evicting whatever is cached), then ends uncached."""
    r = req(rid, list(range(start, start + bm.num_available() * 4 - 4)), max_tokens=4)
    assert bm.try_admit(r)
    bm.allocate(r, r.max_total_tokens)
    bm.release(r)


def test_evicted_blocks_are_saved_and_restored_at_admission():
    bm, tier, copier = tiered()
    cache_and_release(bm, "a", list(range(9)))          # 2 full blocks cached
    fill(bm, "fill", 100)
    assert [len(p) for p in copier.saves] == [2] and tier.stats.saved_blocks == 2 and not bm.by_hash
    again = req("again", list(range(9)))
    assert bm.try_admit(again)
    [(pairs, transfer)] = copier.restores
    assert again.cached_tokens == again.num_computed == 8 and len(again.block_ids) == 2
    # the evictions came tail first (release order), the restore follows the chain
    assert [d for d, _ in pairs] == again.block_ids and [s for _, s in pairs] == [s for _, s in copier.saves[0]][::-1]
    assert bm.stats.hits == 0 and tier.stats.hits == 8       # device hits and host hits are counted apart
    assert not tier.landed(again)
    transfer.landed = True
    assert tier.landed(again) and len(bm.by_hash) == 2       # the restored blocks are device cache hits again
    bm.release(again)
    dev = req("dev", list(range(9)))
    assert bm.try_admit(dev) and dev.cached_tokens == 8 and len(copier.restores) == 1


def test_host_lru_capacity_and_no_second_copy():
    bm, tier, copier = tiered(num_blocks=5, capacity=2)
    cache_and_release(bm, "a", list(range(9)))              # blocks A0 A1
    fill(bm, "f1", 100)
    cache_and_release(bm, "b", list(range(200, 205)))       # block B0
    fill(bm, "f2", 300)
    assert tier.stats.used_blocks == 2 and tier.stats.saved_blocks == 3
    a, b = req("a2", list(range(9))), req("b2", list(range(200, 205)))
    # A's chain was evicted tail first, so its tail A1 was the LRU host entry that B0 replaced
    assert bm.try_admit(a) and a.cached_tokens == 4
    copier.restores[-1][1].landed = True
    assert tier.landed(a)
    bm.release(a)
    assert bm.try_admit(b) and b.cached_tokens == 4
    copier.restores[-1][1].landed = True
    assert tier.landed(b)
    bm.release(b)
    saves = tier.stats.saved_blocks
    fill(bm, "f3", 400)                                     # evicts B0 again: the host already holds it
    assert tier.stats.saved_blocks == saves


@pytest.mark.parametrize("n", [9, 8])                       # the last token in a block of its own, or not
def test_blocks_in_flight_are_held_and_abort_waits_for_the_copy(n):
    bm, tier, copier = tiered(num_blocks=5, capacity=8)
    cache_and_release(bm, "a", list(range(n)))
    fill(bm, "fill", 100)
    s = Scheduler(bm, max_num_batched_tokens=64, max_num_seqs=4, host_tier=tier)
    r = req("r", list(range(n)), max_tokens=12 - n)         # 12 tokens: 3 blocks, 2 restored
    s.add(r)
    plan = s.schedule()
    assert plan.runs == [] and r.status == Status.RESTORING and s.restoring == [r] and s.has_work()
    assert bm.num_available() == 1                          # 2 blocks being written + 1 reserved
    other = req("other", list(range(500, 508)), max_tokens=4)   # needs 3 blocks: must wait
    assert not bm.try_admit(other)
    s.finish(r)                                             # aborted while its copies are in flight
    assert r.status == Status.FINISHED and s.restoring == [] and s.has_work()
    s.schedule()
    assert bm.num_available() == 1                          # its blocks stay held until the copies landed
    copier.restores[0][1].landed = True
    s.schedule()
    assert bm.num_available() == 4 and not s.has_work() and bm.try_admit(other)


def test_a_whole_prompt_restore_takes_the_last_block_too_and_leaves_one_token():
    bm, tier, copier = tiered()
    cache_and_release(bm, "a", list(range(8)))          # 2 full blocks: the whole prompt
    fill(bm, "fill", 100)
    s = Scheduler(bm, max_num_batched_tokens=64, max_num_seqs=4, host_tier=tier)
    r = req("r", list(range(8)), max_tokens=2)
    s.add(r)
    queries = tier.stats.queries
    s.schedule()
    [(pairs, transfer)] = copier.restores
    assert [d for d, _ in pairs] == r.block_ids and len(r.block_ids) == 2   # its own blocks: no copy-on-write
    assert r.cached_tokens == r.num_computed == 7 and bm.block_copies == []
    assert tier.stats.queries - queries == 8 and tier.stats.hits == 7 and tier.stats.restored_blocks == 2
    transfer.landed = True
    plan = s.schedule()
    assert [(x.req.request_id, x.start, x.length, x.samples) for x in plan.runs] == [("r", 7, 1, True)]
    assert plan.block_copies == [] and len(r.block_ids) == 2
    assert list(bm.hash_of) == r.block_ids[:1]          # the block being recomputed is not shared yet
    r.num_computed = 8
    bm.commit(r)
    assert list(bm.hash_of) == r.block_ids


def test_device_hits_then_the_last_block_from_the_host():
    bm, tier, copier = tiered(num_blocks=5, capacity=8)
    cache_and_release(bm, "a", list(range(8)))          # a1 then a0 evictable, 2 free
    grow = req("grow", list(range(100, 109)), max_tokens=3)
    assert bm.try_admit(grow)
    bm.allocate(grow, 12)                               # the 2 free blocks, then evicts a1 (saved)
    bm.release(grow)
    again = req("again", list(range(8)), max_tokens=1)
    assert bm.try_admit(again) and bm.stats.hits == 4 and bm.block_copies == []
    [(pairs, _)] = copier.restores
    assert [len(p) for p in copier.saves] == [1] and pairs == [(again.block_ids[1], copier.saves[0][0][1])]
    assert again.cached_tokens == again.num_computed == 7 and tier.stats.hits == 3


def test_restoring_request_starts_after_the_copies_landed():
    bm, tier, copier = tiered(num_blocks=9, capacity=8)
    cache_and_release(bm, "a", list(range(9)))
    fill(bm, "fill", 100)
    s = Scheduler(bm, max_num_batched_tokens=64, max_num_seqs=4, host_tier=tier)
    r, fresh = req("r", list(range(9)), max_tokens=2), req("fresh", list(range(700, 705)), max_tokens=2)
    s.add(r)
    s.add(fresh)
    plan = s.schedule()                                     # the restore waits; the next request runs
    assert [(x.req.request_id, x.start) for x in plan.runs] == [("fresh", 0)] and plan.newly_scheduled == [fresh]
    copier.restores[0][1].landed = True
    plan = s.schedule()
    assert plan.newly_scheduled == [r] and ("r", 8, 1, True) in [
        (x.req.request_id, x.start, x.length, x.samples) for x in plan.runs]


def test_pinned_host_slots_are_not_reused_while_restoring():
    bm, tier, copier = tiered(num_blocks=9, capacity=2)
    cache_and_release(bm, "a", list(range(9)))
    fill(bm, "fill", 100)
    r = req("r", list(range(9)), max_tokens=4)
    assert bm.try_admit(r) and tier.busy()
    cache_and_release(bm, "b", list(range(300, 313)))       # 3 cached blocks
    fill(bm, "fill2", 400)                                  # evicts one of them; both host slots are pinned
    assert tier.stats.dropped_blocks == 1 and tier.stats.saved_blocks == 2 and tier.stats.used_blocks == 2


def test_top_up_saves_the_lru_front_ahead_of_eviction_and_eviction_then_copies_nothing():
    bm, tier, copier = tiered(num_blocks=7, capacity=16, watermark=3)
    cache_and_release(bm, "a", list(range(9)))              # 2 cached blocks, released tail first
    cache_and_release(bm, "b", list(range(100, 109)))       # 2 more
    a1, a0, b1, b0 = bm.evictable
    assert len(bm.free) == 2
    tier.top_up()                                           # the watermark needs 1 clean block beyond the 2 free
    assert copier.saves == [[(a1, 0)]] and tier.stats.saved_ahead_blocks == tier.stats.saved_blocks == 1
    tier.top_up()                                           # nothing new to save
    assert len(copier.saves) == 1 and not copier.reused and len(bm.evictable) == 4   # still device hits
    r = req("r", list(range(500, 508)), max_tokens=4)       # reserves 3 blocks: 3 + 3 - 2 free = 4 clean wanted
    assert bm.try_admit(r)
    tier.top_up()
    assert copier.saves[1:] == [[(a0, 1), (b1, 2), (b0, 3)]] and tier.stats.saved_ahead_blocks == 4
    bm.allocate(r, 12)                                      # 2 free blocks, then evicts a1: its copy is on the host
    assert tier.stats.saved_blocks == 4 and copier.reused == [[a1]]   # no copy; ordered after its save
    again = req("again", list(range(9)), max_tokens=1)
    assert bm.try_admit(again) and again.cached_tokens == 8   # a0 is still a device hit; a1 comes from the host
    assert bm.stats.hits == 4 and copier.restores[0][0] == [(again.block_ids[1], 0)]


def test_top_up_runs_one_batch_at_a_time_within_half_the_host_capacity():
    bm, tier, copier = tiered(num_blocks=11, capacity=6, watermark=10)
    assert tier.watermark == 3
    copier.hold_saves = True
    cache_and_release(bm, "a", list(range(13)))             # 3 cached blocks (a2 a1 a0 in LRU order), 7 free
    r = req("r", list(range(500, 528)), max_tokens=4)       # reserves 8 blocks: 1 more than are free
    assert bm.try_admit(r)
    tier.top_up()
    assert [len(p) for p in copier.saves] == [3]            # capped at 3 (half the host)
    cache_and_release(bm, "b", list(range(200, 205)))       # b0 cached behind them
    tier.top_up()
    assert len(copier.saves) == 1                           # the last batch has not landed
    copier.save_transfers[0].landed = True
    tier.top_up()
    assert len(copier.saves) == 1                           # the front 3 are clean: b0 is beyond the cap
    bm.allocate(r, 32)                                      # the 6 free blocks, then evicts a2 a1: no copy
    assert tier.stats.saved_blocks == 3 and copier.reused == [[b for b, _ in copier.saves[0][:2]]]
    tier.top_up()
    a0, b0 = bm.evictable
    assert copier.saves[1:] == [[(b0, 3)]]                  # the window of 3 now reaches b0


class BlockBytesCopier(RecordingCopier):
    """Recording, with a host pool of 1 KiB blocks, so save-ahead batches are bounded in blocks."""

    def __init__(self, num_host_blocks: int) -> None:
        super().__init__()
        self.host = [np.zeros((num_host_blocks, 1024), np.uint8)]


def test_save_ahead_batches_are_bounded_by_what_the_next_step_hides(monkeypatch):
    monkeypatch.setattr(host_tier, "AHEAD_MIN_BYTES", 2 * 1024)        # 2 blocks when nothing hides it
    monkeypatch.setattr(host_tier, "AHEAD_BYTES_PER_S", 1024 / 0.010)  # 1 block per 10 ms of step
    bm = BlockManager(num_blocks=13, block_size=4)
    copier = BlockBytesCopier(16)
    tier = HostTier(bm, copier, 16, watermark_blocks=8)
    copier.hold_saves = True
    cache_and_release(bm, "a", list(range(29)))             # 7 cached blocks, 5 free
    cache_and_release(bm, "b", list(range(100, 117)))       # 4 more, 1 free: the watermark wants 7 saved
    front = list(bm.evictable)
    tier.top_up()
    assert copier.saves == [[(front[0], 0), (front[1], 1)]] and tier.saving_ahead()
    tier.top_up(hide_s=1.0)
    assert len(copier.saves) == 1                           # one batch in flight at a time
    copier.save_transfers[-1].landed = True
    tier.top_up(hide_s=0.040)                               # a 40 ms step follows: 4 blocks
    assert [b for b, _ in copier.saves[1]] == front[2:6] and tier.saving_ahead()
    copier.save_transfers[-1].landed = True
    tier.top_up()
    assert [b for b, _ in copier.saves[2]] == front[6:7] and tier.stats.saved_ahead_blocks == 7
    copier.save_transfers[-1].landed = True
    tier.top_up()                                           # the watermark is met: nothing left to poll for
    assert len(copier.saves) == 3 and not tier.saving_ahead()


def test_restore_evictions_are_saved_first_not_reused_and_reported(caplog):
    bm, tier, copier = tiered(num_blocks=5, capacity=8)
    cache_and_release(bm, "a", list(range(9)))
    fill(bm, "fill", 100)                                   # evicts a's blocks: saved, then reused by the filler
    assert [len(p) for p in copier.reused] == [2]
    cache_and_release(bm, "b", list(range(200, 213)))       # 3 cached blocks, 1 free
    s = Scheduler(bm, max_num_batched_tokens=64, max_num_seqs=4, host_tier=tier)
    again = req("again", list(range(9)), max_tokens=1)
    s.add(again)
    s.schedule()                                            # the restore takes the free block and evicts b's tail
    assert len(copier.reused) == 1 and tier.stats.saved_blocks == 3
    assert tier.restoring["again"].saved_first == 1 and again.status == Status.RESTORING
    tier.top_up()
    assert tier.stats.saved_ahead_blocks == 0               # no background save while a restore is in flight
    copier.restores[0][1].landed = True
    plan = s.schedule()
    assert plan.newly_scheduled == [again]
    assert tier.stats.saved_blocks == 4 and len(copier.reused) == 2   # its last block evicted b1: saved, reused
    again.first_token_time = tier.reporting[0].landed + 0.004
    with caplog.at_level("INFO", logger="openinfer.kv.host_tier"):
        tier.after_step()
    assert not tier.reporting
    [msg] = [r.getMessage() for r in caplog.records]
    assert msg.startswith("KV restore again: 2 blocks (0.00 GB), copies untimed, 1 of its evicted blocks saved first")
    assert msg.endswith("landing to first token 4.0 ms")


def test_runs_and_numpy_host_pool_round_trip():
    assert runs([(3, 0), (4, 1), (5, 2), (9, 3), (2, 4), (3, 5)]) == [(3, 0, 3), (9, 3, 1), (2, 4, 2)]
    assert runs([(9, 7), (8, 6), (7, 5), (8, 9), (1, 1), (2, 2), (1, 3)]) == [(7, 5, 3), (8, 9, 1), (1, 1, 2), (1, 3, 1)]
    rng = np.random.default_rng(0)
    k, v = rng.standard_normal((6, 2, 4, 3)).astype(np.float32), rng.standard_normal((6, 2, 4, 3)).astype(np.float32)
    want = k.copy(), v.copy()
    copier = HostPoolCopier([k, v], 4)
    assert copier.save([(1, 0), (2, 1), (5, 3)]).done()
    k[:] = v[:] = 0
    copier.restore([(4, 1), (3, 0), (0, 3)]).wait()
    for dev, orig in zip((k, v), want):
        np.testing.assert_array_equal(dev[[4, 3, 0]], orig[[2, 1, 5]])


def test_a_group_that_cannot_be_checkpointed_refuses_the_tier():
    groups = [StateGroup("kv", "paged", 2, {"k": (2, 4), "v": (2, 4)}),
              StateGroup("idx", "paged", 2, {"k": (4,)}, checkpointable=False)]
    pools = StatePools(NumpyBackend(), groups, 4, 4)
    with pytest.raises(ValueError, match="'idx' cannot be checkpointed"):
        offloadable_arrays(pools)
    assert len(offloadable_arrays(StatePools(NumpyBackend(), groups[:1], 4, 4))) == 2
    with pytest.raises(ValueError, match="prefix cache"):
        EngineArgs(kv_offload=True, enable_prefix_caching=False)


# ---- the engine on the demo model (a tiny random Qwen3) ---------------------------------------------

def evict_all(engine, seed: int) -> None:
    """Fresh prompts through the whole device pool, so nothing cached before survives there."""
    rng = np.random.default_rng(seed)
    n = engine.blocks.usable_blocks * engine.blocks.block_size // 2 - 8
    for _ in range(3):
        generate(engine, [[int(t) for t in rng.integers(0, 150000, n)]], greedy(4))


def ladder(engine, prompt: Sequence[int]) -> dict[str, tuple[list[int], int]]:
    """Greedy tokens and cached tokens of: cold, device hit, host restore, device hit after the restore."""
    out = {}
    for tier in ("cold", "device", "host", "device again"):
        if tier == "host":
            evict_all(engine, 1)
        [(tokens, fin, cached)] = generate(engine, [list(prompt)], greedy(12))
        assert fin.cached_tokens == cached
        out[tier] = tokens, cached
    return out


def offload_engine():
    return build_engine(None, EngineArgs(max_model_len=512, kv_cache_memory_gib=demo_kv_gib(24),
                                         kv_offload=True, kv_offload_host_gib=demo_kv_gib(64)))


# 83 tokens: 5 full blocks reusable, the partial last one recomputed; 80: all 5 reusable, the last token recomputed
@pytest.mark.parametrize("n, cached", [(83, 80), (80, 79)])
def test_cold_device_hit_and_host_restore_give_identical_tokens(caplog, n, cached):
    engine = offload_engine()
    assert engine.blocks.usable_blocks == 23 and engine.host_tier.stats.capacity_blocks == 64
    assert engine.host_tier.watermark == 23                  # the largest restore: the whole pool
    prompt = [int(t) for t in np.random.default_rng(0).integers(0, 150000, n)]
    with caplog.at_level("INFO", logger="openinfer.kv.host_tier"):
        res = ladder(engine, prompt)
    cold = res["cold"][0]
    assert [res[t] for t in res] == [(cold, 0), (cold, cached), (cold, cached), (cold, cached)]
    stats = engine.stats().offload
    assert stats.restored_blocks == 5 and stats.hits == cached and stats.saved_blocks >= 5
    # every block was saved ahead of its eviction, so the restore found clean blocks to take
    assert stats.saved_ahead_blocks == stats.saved_blocks
    [report] = [r.getMessage() for r in caplog.records if r.getMessage().startswith("KV restore")]
    assert ": 5 blocks" in report and "0 of its evicted blocks saved first" in report
    assert stats.used_blocks > 0 and 0 < stats.usage <= 1 and stats.hit_rate == cached / stats.queries
    text = render([("demo", ModelMetrics(), engine.stats())])
    assert 'openinfer:kv_offload_restored_blocks_total{model_name="demo"} 5.0' in text
    assert f'openinfer:kv_offload_hits_total{{model_name="demo"}} {cached:.1f}' in text
    assert f'openinfer:kv_offload_saved_ahead_blocks_total{{model_name="demo"}} {stats.saved_ahead_blocks:.1f}' in text


def test_an_fp8_cache_saves_and_restores_its_bytes():
    """--kv-cache-dtype fp8: the host tier holds the e4m3 bytes (a block a quarter of float32's), and a restore
    gives the cold run's tokens."""
    engine = build_engine(None, EngineArgs(max_model_len=512, kv_cache_memory_gib=demo_kv_gib(24, itemsize=1),
                                           kv_offload=True, kv_offload_host_gib=demo_kv_gib(64, itemsize=1),
                                           kv_cache_dtype="fp8"))
    assert engine.blocks.usable_blocks == 23 and engine.host_tier.stats.capacity_blocks == 64
    prompt = [int(t) for t in np.random.default_rng(0).integers(0, 150000, 83)]
    res = ladder(engine, prompt)
    cold = res["cold"][0]
    assert [res[t] for t in res] == [(cold, 0), (cold, 80), (cold, 80), (cold, 80)]
    assert engine.stats().offload.restored_blocks == 5


def test_a_whole_prompt_restore_steps_through_the_decode_graph():
    """Through CPU-emulated decode graphs: after restoring every block of an 80-token prompt, its
    first step is its last token alone, so every step of the request replays the batch-1 graph."""
    engine = offload_engine()
    graphs = emulate_graphs(engine)
    prompt = [int(t) for t in np.random.default_rng(1).integers(0, 150000, 80)]
    [(cold, _, _)] = generate(engine, [prompt], greedy(8))
    evict_all(engine, 2)
    graphs.replays.clear()
    [(tokens, fin, cached)] = generate(engine, [prompt], greedy(8))
    assert tokens == cold and cached == fin.cached_tokens == 79 and engine.stats().offload.restored_blocks == 5
    assert graphs.replays == [1] * 8


def test_an_idle_engine_keeps_saving_ahead_in_small_batches(monkeypatch):
    """Batches of 2 blocks: the step that ends the request saves 2 of its 5 cached blocks, the
    engine thread's idle loop the rest (nothing else steps it); the tokens are those of a
    synchronously stepped engine, and a restore afterwards gives them again."""
    engine = offload_engine()
    monkeypatch.setattr(host_tier, "AHEAD_MIN_BYTES", 2 * engine.host_tier.block_bytes)
    prompt = [int(t) for t in np.random.default_rng(3).integers(0, 150000, 80)]
    [(cold, _, _)] = generate(offload_engine(), [prompt], greedy(1))
    engine.start()
    try:
        tokens, _, _ = collect(engine.submit(list(prompt), greedy(1)))
        for _ in range(500):                                # the idle loop polls every AHEAD_POLL_S
            if engine.stats().offload.saved_ahead_blocks >= 5:
                break
            time.sleep(0.01)
    finally:
        engine.shutdown()
    stats = engine.stats().offload
    assert tokens == cold and stats.saved_ahead_blocks == stats.saved_blocks == 5
    evict_all(engine, 4)
    [(again, _, cached)] = generate(engine, [prompt], greedy(1))
    assert again == cold and cached == 79 and engine.stats().offload.restored_blocks == 5
