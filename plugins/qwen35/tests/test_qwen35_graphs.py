"""Decode through (CPU-emulated) CUDA graphs on the hybrid model: the captured batch's static
buffers carry the state rows, padding rows use the reserved row 0, and greedy output equals the
eager engine's — at batch 1, batched (with padding rows), on prefix hits and with one-token prompts."""
from __future__ import annotations

from openinfer.testing.engine import generate, greedy
from openinfer.testing.graphs import emulate_graphs

from test_qwen35_fidelity import engine_for, tokens


def test_emulated_graph_decode_matches_eager(untied):
    ckpt, _ = untied
    eager = engine_for(ckpt, max_num_seqs=4, block_size=16)
    graph = engine_for(ckpt, max_num_seqs=4, block_size=16)
    graphs = emulate_graphs(graph)
    prompts = [tokens(45, seed=1), tokens(1, seed=2), tokens(20, seed=3), tokens(33, seed=4)]
    for batch in ([prompts[0]], prompts[:2], prompts[:3], prompts):
        want = [t for t, _, _ in generate(eager, batch, greedy(20))]
        got = [t for t, _, _ in generate(graph, batch, greedy(20))]
        assert got == want, f"batch of {len(batch)}"
    assert {1, 2, 4} <= set(graphs.replays)      # batch 3 ran in the bucket of 4 (one padding row)
    # a prefix hit restores a checkpoint row before decoding through the graphs
    again = tokens(40, seed=6)
    first = generate(graph, [again], greedy(20))[0][0]
    [(hit, fin, cached)] = generate(graph, [again], greedy(20))
    assert cached == 32 and fin.cached_tokens == 32
    assert hit == first == generate(eager, [again], greedy(20))[0][0]


def test_padding_rows_touch_only_the_reserved_state_row(untied):
    """Three sequences decode in the bucket of 4: the padding row's state writes land in row 0,
    never in a live or free row."""
    import numpy as np
    ckpt, _ = untied
    # no checkpoint copies; serial steps, so that one step() is one replay (pipelined, it queues the next too)
    eng = engine_for(ckpt, max_num_seqs=4, enable_prefix_caching=False, pipelined_decode=False)
    graphs = emulate_graphs(eng)
    streams = [eng.submit(tokens(10 + i, seed=5 + i), greedy(6)) for i in range(3)]
    eng.step()                                   # the prompts: one eager prefill step
    live = sorted(r.state_slot for r in eng.scheduler.running)
    pools = eng.runner.pools.slots["gdn"]
    untouched = [r for r in range(pools["ssm"].shape[0]) if r not in live and r != 0]
    assert len(live) == 3 and untouched
    before = {part: arr.copy() for part, arr in pools.items()}
    eng.step()
    assert graphs.replays == [4]
    for part, arr in pools.items():
        assert all(not np.array_equal(arr[r], before[part][r]) for r in live)
        np.testing.assert_array_equal(arr[untouched], before[part][untouched])
    while eng.has_unfinished():
        eng.step()
    assert all(s.done for s in streams)


def test_pipelined_decode_streams_match_serial(untied):
    """Pipelined decode (engine/pipeline.py) on the hybrid model: the state row of a dropped (aborted) row
    is freed after the step that wrote it, and a step whose commit saves a rolling state checkpoint
    (every block_size tokens, with prefix caching) runs serially, so the checkpoint holds the state
    before the next token. Every stream's events match the serial engine's, including a second
    turn that hits a decode checkpoint."""
    from openinfer.testing.pipelined import abort, pipelined_launches, run_script, submit
    ckpt, _ = untied
    prompts = [tokens(5 + 13 * i, seed=20 + i) for i in range(3)]
    answer = generate(engine_for(ckpt, max_num_seqs=4, block_size=16), [prompts[2]], greedy(22))[0][0]
    script = {0: [submit(f"r{i}", p, greedy(10 + 6 * i)) for i, p in enumerate(prompts)],
              4: [abort("r1")],
              30: [submit("turn2", prompts[2] + answer, greedy(12))]}
    events = []
    for pipelined in (False, True):
        eng = engine_for(ckpt, max_num_seqs=4, block_size=16, pipelined_decode=pipelined)
        emulate_graphs(eng)
        launches = pipelined_launches(eng)
        events.append(run_script(eng, script))
        assert bool(launches) == pipelined and not eng.scheduler.running
    assert events[1] == events[0]
    assert events[0]["turn2"][0].cached_tokens == 48   # the rolling checkpoint after 48 tokens


def test_mixed_steps_replay_their_decode_rows_beside_the_prompts(untied):
    """A mixed step's decode rows (their state rows) replay the emulated graph beside the prompts' chunked prefill
    (whatever they read: model_runner.BESIDE_READ_RATIO 0), prompts crossing block boundaries (their state
    checkpoints go with the prompts' part) and a second turn hitting one: every stream's events equal the eager
    engine's."""
    from openinfer.testing.graphs import beside_read_ratio
    from openinfer.testing.pipelined import run_script, submit
    ckpt, _ = untied
    prompts = [tokens(9 + 11 * i, seed=30 + i) for i in range(5)]
    script = {0: [submit(f"r{i}", p, greedy(24)) for i, p in enumerate(prompts[:3])],
              3: [submit("late", prompts[3], greedy(12))],
              6: [submit("later", prompts[4], greedy(8)), submit("turn2", prompts[2] + prompts[0], greedy(6))],
              12: [submit("turn3", prompts[3] + prompts[1], greedy(6))]}   # hits "late"'s, saved beside the rows
    events, beside = [], []
    for graphs in (False, True):
        eng = engine_for(ckpt, max_num_seqs=8, block_size=16, max_num_batched_tokens=24)
        if graphs:
            beside = emulate_graphs(eng).beside
        with beside_read_ratio(0.0):
            events.append(run_script(eng, script))
    assert events[1] == events[0] and events[0]["turn3"][0].cached_tokens == 32
    assert len(beside) >= 3
