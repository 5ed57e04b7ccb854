"""Full-prompt prefix hits on the demo model (CPU): only the last prompt token is recomputed, in a
private copy of its cached block (copy-on-write), and greedy output is that of a cold run — alone,
beside concurrent readers of the shared block, batched with other work and under chunked prefill."""
from __future__ import annotations

import numpy as np
import pytest

from openinfer.engine.engine import EngineArgs, build_engine
from openinfer.testing.engine import collect, generate, greedy

BS = 16


def engine(**kw):
    return build_engine(None, EngineArgs(max_model_len=256, kv_cache_memory_gib=0.01, block_size=BS, **kw))


def prompt(n: int, seed: int = 0) -> list[int]:
    return [int(t) for t in np.random.default_rng(seed).integers(0, 5000, size=n)]


@pytest.fixture(scope="module")
def cold():
    """Greedy continuations with no prefix cache at all."""
    eng = engine(enable_prefix_caching=False)
    memo: dict[tuple[int, ...], list[int]] = {}

    def run(ids: list[int], n: int = 12) -> list[int]:
        key = (*ids, -n)
        if key not in memo:
            memo[key] = generate(eng, [ids], greedy(n))[0][0]
        return memo[key]
    return run


def shared_blocks(eng, ids: list[int]) -> dict[int, list[np.ndarray]]:
    """Copies of every paged array's slice of the cached blocks of `ids`' full blocks."""
    from openinfer.kv.block_manager import block_hashes
    bm = eng.blocks
    blocks = [bm.by_hash[h] for h in block_hashes(ids, BS)]
    arrays = [a for parts in eng.runner.pools.paged.values() for a in parts.values()]
    return {b: [a[b].copy() for a in arrays] for b in blocks}


@pytest.mark.parametrize("n", [BS, 3 * BS, 3 * BS + 5])
def test_hit_recomputes_one_token_and_matches_cold(cold, n):
    eng = engine()
    ids = prompt(n)
    [(first, _, c0)] = generate(eng, [ids], greedy(12))
    before = shared_blocks(eng, ids)
    [(again, fin, c1)] = generate(eng, [ids], greedy(12))
    # a prompt of whole blocks hits all of them; otherwise the partial last block is recomputed
    want_cached = n - 1 if n % BS == 0 else n // BS * BS
    assert c0 == 0 and c1 == fin.cached_tokens == want_cached
    assert first == again == cold(ids)
    after = shared_blocks(eng, ids)
    assert before.keys() == after.keys()
    for b in before:   # the cached blocks were read, never written
        assert all(np.array_equal(x, y) for x, y in zip(before[b], after[b]))
    s = eng.stats()
    assert s.prefix_queries == 2 * n and s.prefix_hits == want_cached


def test_concurrent_readers_of_the_copied_block(cold):
    eng = engine()
    ids = prompt(2 * BS, seed=1)
    first = eng.submit(ids, greedy(16))
    for _ in range(4):          # its prefill and three decode steps: its prompt blocks are cached
        eng.step()
    # two hits of the running request's blocks at once, and a prompt sharing only the first block
    branch = ids[:BS] + prompt(BS, seed=2)
    streams = [eng.submit(ids, greedy(12)), eng.submit(ids, greedy(12)), eng.submit(branch, greedy(12))]
    plan_copies = []
    while eng.has_unfinished():
        eng.step()
        plan_copies.append(eng.blocks.block_copies)   # taken within the step: nothing left pending
    assert all(c == [] for c in plan_copies)
    out = [collect(s) for s in (first, *streams)]
    assert out[0][0] == cold(ids, 16) and out[0][2] == 0
    assert [o[0] for o in out[1:3]] == [cold(ids)] * 2 and [o[2] for o in out[1:3]] == [2 * BS - 1] * 2
    assert out[3][0] == cold(branch) and out[3][2] == BS


@pytest.mark.parametrize("budget", [5, 16, 64])
def test_hits_batched_with_prefills_under_chunking(cold, budget):
    eng = engine(max_num_batched_tokens=budget)
    a, b = prompt(3 * BS, seed=3), prompt(2 * BS + 7, seed=4)
    generate(eng, [a], greedy(12))
    # the hit of `a` shares its steps with the chunked cold prefill of `b` and then its decode
    results = generate(eng, [b, a, a[:2 * BS]], greedy(12))
    assert [r[0] for r in results] == [cold(b), cold(a), cold(a[:2 * BS])]
    assert [r[2] for r in results] == [0, 3 * BS - 1, 2 * BS - 1]


def test_no_copy_without_the_prefix_cache():
    eng = engine(enable_prefix_caching=False)
    ids = prompt(2 * BS)
    generate(eng, [ids], greedy(4))
    [(_, fin, cached)] = generate(eng, [ids], greedy(4))
    assert cached == fin.cached_tokens == 0 and eng.blocks.block_copies == []


def test_hit_steps_replay_the_decode_graph(cold):
    """Through CPU-emulated decode graphs: a hit's first step is one token a sequence, so it
    replays a graph (two hits at once: the batch-2 bucket) and gives the cold run's tokens."""
    from openinfer.testing.graphs import emulate_graphs
    eng = engine()
    graphs = emulate_graphs(eng)
    ids = prompt(3 * BS, seed=6)
    generate(eng, [ids], greedy(12))
    assert len(graphs.replays) == 11                     # the cold prefill ran eagerly
    graphs.replays.clear()
    results = generate(eng, [ids, ids], greedy(12))
    assert graphs.replays == [2] * 12
    assert [r[0] for r in results] == [cold(ids)] * 2 and [r[2] for r in results] == [3 * BS - 1] * 2


def test_sha256_block_keys_hit_like_builtin_ones(cold):
    """--prefix-cache-hash sha256: the same hits and tokens as the builtin keys; the keys are 128-bit,
    chained (one block's key depends on every block before it) and salted."""
    from openinfer.kv.block_manager import block_hashes
    eng = engine(prefix_cache_hash="sha256")
    assert eng.blocks.block_hash == "sha256"
    ids = prompt(3 * BS + 5, seed=9)
    [(first, _, c0)] = generate(eng, [ids], greedy(12))
    [(again, fin, c1)] = generate(eng, [ids], greedy(12))
    assert c0 == 0 and c1 == fin.cached_tokens == 3 * BS and first == again == cold(ids)
    keys = block_hashes(ids, BS, scheme="sha256")
    assert set(keys) <= set(eng.blocks.by_hash) and keys != block_hashes(ids, BS)
    assert max(keys).bit_length() > 64   # not the builtin hash's 64 bits
    changed = [ids[0] + 1] + ids[1:]   # block 0 differs, blocks 1.. hold the same ids
    assert all(a != b for a, b in zip(block_hashes(changed, BS, scheme="sha256"), keys))
    assert block_hashes(ids, BS, scheme="sha256") == keys   # the same in every process: no random seed in it
    assert block_hashes(ids, BS, "tenant-a", scheme="sha256") != keys


def test_an_unknown_prefix_cache_hash_is_refused():
    with pytest.raises(ValueError, match="prefix_cache_hash 'md5'"):
        EngineArgs(prefix_cache_hash="md5")
    from openinfer.kv.block_manager import BlockManager
    with pytest.raises(ValueError, match="prefix-cache hash 'md5'"):
        BlockManager(4, BS, block_hash="md5")
