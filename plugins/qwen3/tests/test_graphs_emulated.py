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
