"""The host offload tier (--kv-offload): save on eviction, restore at admission, LRU and capacity,
blocks in flight, abort while restoring; identical greedy output for cold / device hit / host restore."""
from __future__ import annotations

from typing import Sequence

import numpy as np
import pytest

from openinfer.backends import NumpyBackend
from openinfer.backends.block_copy import BlockCopier, HostPoolCopier, Pairs, Transfer, runs
from openinfer.engine import EngineArgs, build_engine
from openinfer.kv.block_manager import BlockManager
from openinfer.kv.host_tier import HostTier, offloadable_arrays
from openinfer.kv.pool import StatePools
from openinfer.model_line import StateGroup
from openinfer.request import Status
from openinfer.scheduler import Scheduler
from openinfer.server.metrics import ModelMetrics, render
from openinfer.testing.engine import demo_kv_gib, generate, greedy
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
    host: list[np.ndarray] = []

    def __init__(self) -> None:
        self.saves: list[list[tuple[int, int]]] = []
        self.restores: list[tuple[list[tuple[int, int]], HeldTransfer]] = []

    def save(self, pairs: Pairs) -> Transfer:
        self.saves.append(list(pairs))
        t = HeldTransfer()
        t.landed = True
        return t

    def restore(self, pairs: Pairs) -> Transfer:
        t = HeldTransfer()
        self.restores.append((list(pairs), t))
        return t


def tiered(num_blocks: int = 5, capacity: int = 8) -> tuple[BlockManager, HostTier, RecordingCopier]:
    bm = BlockManager(num_blocks=num_blocks, block_size=4)
    copier = RecordingCopier()
    return bm, HostTier(bm, copier, capacity), copier


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


def test_blocks_in_flight_are_held_and_abort_waits_for_the_copy():
    bm, tier, copier = tiered(num_blocks=5, capacity=8)
    cache_and_release(bm, "a", list(range(9)))
    fill(bm, "fill", 100)
    s = Scheduler(bm, max_num_batched_tokens=64, max_num_seqs=4, host_tier=tier)
    r = req("r", list(range(9)), max_tokens=3)              # 12 tokens: 3 blocks, 2 restored
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


def test_cold_device_hit_and_host_restore_give_identical_tokens():
    engine = build_engine(None, EngineArgs(max_model_len=512, kv_cache_memory_gib=demo_kv_gib(24),
                                           kv_offload=True, kv_offload_host_gib=demo_kv_gib(64)))
    assert engine.blocks.usable_blocks == 23 and engine.host_tier.stats.capacity_blocks == 64
    prompt = [int(t) for t in np.random.default_rng(0).integers(0, 150000, 83)]   # 5 full blocks reusable
    res = ladder(engine, prompt)
    cold = res["cold"][0]
    assert [res[t] for t in res] == [(cold, 0), (cold, 80), (cold, 80), (cold, 80)]
    stats = engine.stats().offload
    assert stats.restored_blocks == 5 and stats.hits == 80 and stats.saved_blocks >= 5
    assert stats.used_blocks > 0 and 0 < stats.usage <= 1 and stats.hit_rate == 80 / stats.queries
    text = render([("demo", ModelMetrics(), engine.stats())])
    assert 'openinfer:kv_offload_restored_blocks_total{model_name="demo"} 5.0' in text
    assert 'openinfer:kv_offload_hits_total{model_name="demo"} 80.0' in text
