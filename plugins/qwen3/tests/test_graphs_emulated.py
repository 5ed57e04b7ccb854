"""Decode through CPU-emulated CUDA graphs (openinfer.testing.graphs) on Qwen3: the static inputs
without state rows; greedy output equals the eager engine's, padding rows included."""
from __future__ import annotations

from openinfer.testing.engine import generate, greedy
from openinfer.testing.graphs import emulate_graphs

from test_fidelity import _prompts, engine_for


def test_emulated_graph_decode_matches_eager(untied):
    ckpt, _ = untied
    eager = engine_for(ckpt, max_num_seqs=4)
    graph = engine_for(ckpt, max_num_seqs=4)
    graphs = emulate_graphs(graph)
    prompts = _prompts(graph, 4)
    for batch in ([prompts[2]], prompts[:3], prompts):
        want = [t for t, _, _ in generate(eager, batch, greedy(12))]
        assert [t for t, _, _ in generate(graph, batch, greedy(12))] == want, f"batch of {len(batch)}"
    assert {1, 4} <= set(graphs.replays) and graphs.batches[4].state_slots is None


def test_mixed_steps_replay_their_decode_rows_beside_the_prompts(untied):
    """A mixed step's decode rows replay their (emulated) graph beside its prompt runs' eager forward, here whatever
    they read (model_runner.BESIDE_READ_RATIO 0): prompts chunked and finished beside running rows, a row asking
    for logprobs among them; every stream's events equal the eager engine's."""
    from openinfer.testing.graphs import beside_read_ratio
    from openinfer.testing.pipelined import run_script, submit
    ckpt, _ = untied
    eager = engine_for(ckpt, max_num_seqs=8, max_num_batched_tokens=24)
    prompts = _prompts(eager, 8)
    script = {0: [submit(f"r{i}", p, greedy(16)) for i, p in enumerate(prompts[:3])],
              3: [submit("late", prompts[7], greedy(10))],
              5: [submit("scored", prompts[6], greedy(6, logprobs=2)), submit("last", prompts[5], greedy(4))]}
    want = run_script(eager, script)
    eng = engine_for(ckpt, max_num_seqs=8, max_num_batched_tokens=24)
    graphs = emulate_graphs(eng)
    with beside_read_ratio(0.0):
        assert run_script(eng, script) == want
    assert len(graphs.beside) >= 3 and min(graphs.beside) >= 2
