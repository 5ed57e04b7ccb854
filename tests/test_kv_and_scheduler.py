"""Block manager, prefix cache and scheduler, with no model (CPU, fast)."""
from __future__ import annotations

import pytest

from openinfer.kv.block_manager import BlockManager, block_hashes
from openinfer.engine.request import Request, RequestStream, Status
from openinfer.sampling.sampler import SamplingParams
from openinfer.engine.scheduler import Scheduler


def req(rid: str, prompt: list[int], max_tokens: int = 4, priority: int = 0) -> Request:
    return Request(rid, prompt, SamplingParams(max_tokens=max_tokens), RequestStream(rid), 0.0, priority=priority)


def compute_all(bm: BlockManager, r: Request) -> None:
    bm.allocate(r, r.num_tokens)
    r.num_computed = r.num_tokens
    bm.commit(r)


def cache_prompt(bm: BlockManager, r: Request) -> Request:
    """Admit r, compute all of it and release it: its full blocks stay cached, unreferenced."""
    assert bm.try_admit(r)
    compute_all(bm, r)
    bm.release(r)
    return r


def test_reservation_covers_the_whole_lifetime():
    bm = BlockManager(num_blocks=9, block_size=4)          # 8 usable
    a = req("a", list(range(10)), max_tokens=6)             # 16 tokens -> 4 blocks
    assert bm.try_admit(a) and bm.reserved == 4
    b = req("b", list(range(100, 110)), max_tokens=10)      # 20 tokens -> 5 blocks: does not fit now
    assert not bm.try_admit(b) and b.block_ids == []
    bm.allocate(a, 16)
    assert bm.reserved == 0 and len(a.block_ids) == 4
    with pytest.raises(RuntimeError, match="outgrew"):
        bm.allocate(a, 17)
    bm.release(a)
    assert bm.try_admit(b)


def test_prefix_hit_needs_identical_tokens_and_recomputes_one_token():
    bm = BlockManager(num_blocks=32, block_size=4)
    a = cache_prompt(bm, req("a", list(range(12))))
    same = req("same", list(range(12)))     # 12 tokens: all 3 blocks hit, the last one copied on write
    assert bm.try_admit(same) and same.cached_tokens == 11 and same.num_computed == 11
    assert same.block_ids[:2] == a_blocks(bm, 2) and same.block_ids[2] not in bm.hash_of
    assert bm.block_copies == [(a_blocks(bm, 3)[2], same.block_ids[2])]
    other_salt = req("salt", list(range(12)))
    other_salt.cache_salt = "tenant-2"
    assert bm.try_admit(other_salt) and other_salt.cached_tokens == 0
    diverge = req("div", [0, 1, 2, 3, 9, 9, 9, 9, 8, 8])
    assert bm.try_admit(diverge) and diverge.cached_tokens == 4
    partial = req("partial", list(range(10)))   # the last token's block is not a full cached block
    assert bm.try_admit(partial) and partial.cached_tokens == 8
    assert bm.stats.hits == 11 + 4 + 8 and len(bm.block_copies) == 1


def a_blocks(bm: BlockManager, n: int) -> list[int]:
    """The cached blocks of the chain of range(4 * n) (block size 4)."""
    return [bm.by_hash[h] for h in block_hashes(list(range(4 * n)), 4)]


def test_copy_on_write_holds_the_source_until_the_copy_is_taken_and_never_writes_it():
    bm = BlockManager(num_blocks=5, block_size=4)            # 4 usable
    a = cache_prompt(bm, req("a", list(range(8)), max_tokens=1))
    src = a_blocks(bm, 2)[1]
    b = req("b", list(range(8)), max_tokens=4)                # 12 tokens: 1 hit + 2 blocks (copy + growth)
    assert bm.try_admit(b) and b.num_computed == 7 and bm.ref[src] == 1 and src not in bm.evictable
    assert bm.num_available() == 0                           # free 1 + evictable 0 - reserved 1
    assert not bm.try_admit(req("c", list(range(50, 54)), max_tokens=1))
    [(s, dst)] = bm.take_block_copies()
    assert s == src and dst == b.block_ids[1] and bm.ref[src] == 0 and src in bm.evictable
    b.num_computed = 8
    bm.commit(b)                                             # the private copy is not registered again
    assert bm.by_hash[block_hashes(list(range(8)), 4)[1]] == src and dst not in bm.hash_of
    bm.release(b)
    assert dst in bm.free and src in bm.evictable and bm.num_available() == 4


def test_lru_eviction_drops_unreferenced_cached_blocks_and_reports_them():
    bm = BlockManager(num_blocks=5, block_size=4)            # 4 usable
    evicted = []
    bm.on_evict = lambda blocks: evicted.extend(b for b, _, _ in blocks)
    a = cache_prompt(bm, req("a", list(range(8)), max_tokens=1))
    assert len(bm.evictable) == 2 and bm.usage() == 0.0
    b = req("b", list(range(50, 62)), max_tokens=4)          # 16 tokens: needs all 4 blocks
    assert bm.try_admit(b)
    bm.allocate(b, 16)
    assert len(evicted) == 2 and not bm.by_hash
    c = req("c", list(range(8)), max_tokens=1)
    assert not bm.try_admit(c)


def test_scheduler_chunks_prefill_and_mixes_decode_rows():
    bm = BlockManager(num_blocks=64, block_size=4)
    s = Scheduler(bm, max_num_batched_tokens=8, max_num_seqs=4)
    a, b = req("a", list(range(5))), req("b", list(range(20, 40)))
    s.add(a)
    s.add(b)
    plan = s.schedule()
    assert [(r.req.request_id, r.start, r.length, r.samples) for r in plan.runs] == [("a", 0, 5, True), ("b", 0, 3, False)]
    a.num_computed, b.num_computed = 5, 3
    a.output_ids.append(7)
    plan = s.schedule()
    assert [(r.req.request_id, r.start, r.length) for r in plan.runs] == [("a", 5, 1), ("b", 3, 7)]
    s.finish(a)
    assert a.status == Status.FINISHED and a.block_ids == [] and bm.reserved == b.reserved_blocks


def test_scheduler_caps_running_sequences():
    bm = BlockManager(num_blocks=64, block_size=4)
    s = Scheduler(bm, max_num_batched_tokens=100, max_num_seqs=2)
    for i in range(3):
        s.add(req(str(i), [1, 2, 3]))
    plan = s.schedule()
    assert len(plan.runs) == 2 and len(s.waiting) == 1


def test_can_admit_is_false_only_where_schedule_would_admit_nothing():
    """A pipelined engine queues the next decode step while can_admit() is False, so it must be False only when
    the next schedule() admits nothing: no free seat, or a pool that cannot hold the first request's lifetime
    even if its whole prompt hit the cache."""
    bm = BlockManager(num_blocks=9, block_size=4)          # 8 usable
    s = Scheduler(bm, max_num_batched_tokens=100, max_num_seqs=2)
    assert not s.can_admit()                                # nothing waits
    s.add(req("a", list(range(10)), max_tokens=6))          # 4 blocks
    assert s.can_admit()
    s.schedule()
    s.add(req("big", list(range(100, 110)), max_tokens=10))   # 5 blocks, 4 left, 2 of them its prompt's
    assert s.can_admit()                                    # a cached prompt would fit: schedule() must look
    assert not s.schedule().newly_scheduled                 # (it hashes and misses)
    s.waiting[0].params.max_tokens = 30                     # 10 blocks: never with 4 left
    assert not s.can_admit() and not s.schedule().newly_scheduled
    s.waiting[0].params.max_tokens = 2                      # 3 blocks: fits
    assert s.can_admit() and s.schedule().newly_scheduled
    s.add(req("c", [1, 2, 3]))
    assert not s.can_admit() and not s.schedule().newly_scheduled   # both seats taken


def test_max_num_seqs_defaults_per_device_and_from_the_kv_pool():
    """The CPU seats 64; a GPU engine seats what the loader chooses from its KV budget: the largest decode-graph
    bucket up to 256 with 1k tokens of pool per seat, its bounded state (hybrid models) in half the budget."""
    from openinfer.cli import _engine_args, build_parser
    from openinfer.engine.engine_args import EngineArgs
    from openinfer.loading.loader import auto_max_num_seqs
    parser = build_parser()
    assert EngineArgs().max_num_seqs == 64 and EngineArgs(device="cuda").max_num_seqs is None
    assert _engine_args(parser.parse_args(["serve", "--device", "cuda"])).max_num_seqs is None
    assert _engine_args(parser.parse_args(["serve", "--device", "cuda", "--max-num-seqs", "32"])).max_num_seqs == 32
    block = 16 * 147456                                     # Qwen3-4B: 144 KiB of KV a token
    assert auto_max_num_seqs(60 << 30, block, 16, lambda n: 0) == 256             # an H100's ~60 GiB pool
    assert auto_max_num_seqs(30 << 30, block, 16, lambda n: 0) == 208             # 213k tokens
    assert auto_max_num_seqs(block * 16, block, 16, lambda n: 0) == 1             # 256 tokens: one seat
    state = lambda n: (1 + 2 * n) * (50 << 20)              # Qwen3.5-4B: 50 MiB a row, a checkpoint per seat
    assert auto_max_num_seqs(30 << 30, 16 * 32768, 16, state) == 144            # 289 rows, 14.1 of 15 GiB
    # the loader's path, on the numpy backend (whose pool otherwise follows max_num_seqs): 327 blocks, 5232 tokens
    from openinfer.engine.engine import build_engine
    args = EngineArgs(max_model_len=256, kv_cache_memory_gib=0.01)
    args.max_num_seqs = None
    eng = build_engine(None, args)
    assert eng.blocks.num_blocks == 327 and eng.args.max_num_seqs == eng.scheduler.max_seqs == 4
    assert args.max_num_seqs is None   # the caller's arguments are left as they were
    # a hybrid model's state rows (a seat's and its checkpoint's, 57 KiB each here) come out of the budget first:
    # 17.9k tokens of pool would seat 16, but 16 seats' state leaves 16.0k
    args = EngineArgs(max_model_len=256, kv_cache_memory_gib=0.0171, load_format="dummy")
    args.max_num_seqs = None
    eng = build_engine("qwen3.5-tiny", args)
    assert eng.args.max_num_seqs == eng.scheduler.max_seqs == 8


@pytest.mark.parametrize("policy", ["fcfs", "priority"])
def test_priority_policy_admits_lower_priorities_first_in_arrival_order(policy):
    bm = BlockManager(num_blocks=64, block_size=4)
    s = Scheduler(bm, max_num_batched_tokens=100, max_num_seqs=3, policy=policy)
    for rid, priority in (("a", 0), ("b", 5), ("c", -1), ("d", 5), ("e", 0), ("f", -1)):
        s.add(req(rid, [1, 2, 3], priority=priority))
    order = [r.request_id for r in s.waiting]
    assert order == (list("abcdef") if policy == "fcfs" else list("cfaebd"))
    plan = s.schedule()   # three places: the first three of that order run
    assert [r.req.request_id for r in plan.runs] == order[:3] and [r.request_id for r in s.waiting] == order[3:]


def test_scheduling_policy_flag():
    from openinfer.cli import _engine_args, build_parser
    from openinfer.engine.engine_args import EngineArgs
    parser = build_parser()
    assert _engine_args(parser.parse_args(["serve"])).scheduling_policy == "fcfs"
    assert _engine_args(parser.parse_args(["serve", "--scheduling-policy", "priority"])).scheduling_policy == "priority"
    with pytest.raises(ValueError, match="scheduling_policy"):
        EngineArgs(scheduling_policy="lifo")


def test_admission_hashes_are_the_block_chain():
    """_match hashes a prompt in one pass; its chain must be block_hashes' (commit continues it, the
    host tier keys on it): same blocks and salt -> same hashes, another salt or parent -> others."""
    bm = BlockManager(num_blocks=64, block_size=4)
    prompt = [5, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5, 8, 9, 7]   # 3 full blocks and a partial one
    a = req("a", prompt)
    assert bm.try_admit(a) and a.block_hashes == block_hashes(prompt, 4) and len(a.block_hashes) == 3
    salted = req("s", prompt)
    salted.cache_salt = "t"
    assert bm.try_admit(salted) and salted.block_hashes == block_hashes(prompt, 4, salt="t")
    assert not set(salted.block_hashes) & set(a.block_hashes)
    shifted = req("p", [0, 0, 0, 0] + prompt[:12])         # the same blocks after another parent
    assert bm.try_admit(shifted) and not set(shifted.block_hashes[1:]) & set(a.block_hashes)
    assert block_hashes(prompt, 4, start=1, parent=a.block_hashes[0]) == a.block_hashes[1:]


def test_a_hash_match_with_other_tokens_is_no_hit():
    bm = BlockManager(num_blocks=32, block_size=4)
    a = cache_prompt(bm, req("a", list(range(12))))
    second = a_blocks(bm, 2)[1]
    bm.tokens_of[second] = (9, 9, 9, 9)    # as if another block's tokens had collided into its hash
    again = req("again", list(range(12)))
    assert bm.try_admit(again) and again.cached_tokens == 4 and bm.block_copies == []
    assert bm.num_available() == 31 - bm.reserved - 1   # the one hit left the evictable set


def test_step_token_budget_defaults_per_device():
    """Without --max-num-batched-tokens a GPU engine prefills in 8k-token chunks (long prompts are GEMM-bound
    there), a CPU engine in 1k ones; a budget given is kept on either."""
    from openinfer.cli import _engine_args, build_parser
    from openinfer.engine.engine_args import EngineArgs
    parser = build_parser()
    assert EngineArgs().max_num_batched_tokens == 1024
    assert EngineArgs(device="cuda:1").max_num_batched_tokens == 8192
    assert _engine_args(parser.parse_args(["serve", "--device", "cuda"])).max_num_batched_tokens == 8192
    assert _engine_args(parser.parse_args(["serve"])).max_num_batched_tokens == 1024
    got = _engine_args(parser.parse_args(["serve", "--device", "cuda", "--max-num-batched-tokens", "2048"]))
    assert got.max_num_batched_tokens == 2048
    with pytest.raises(ValueError, match="max_num_batched_tokens"):
        EngineArgs(device="cuda", max_num_batched_tokens=0)
