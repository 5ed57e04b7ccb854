"""The glm52 CUDA launchers driven by the model itself, on the CPU: the CPU engine runs with its glm52_* ops replaced
by the CUDA launchers (openinfer_glm52.cuda.ops) on host stand-ins of device arrays, each launch checked against the
compiled kernel and emulated from its raw arguments (dsa_emulation.py), so the arrays the model really passes
(layer views of the paged pools, the indexer's own layer slots, shared layers' selections, prefix hits, chunked
prefill, decode-graph batches) reach the kernels' index arithmetic. The logits and greedy tokens must be the
numpy references' ones."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from openinfer.plugin_api import ForwardBatch
from openinfer.testing.engine import generate, greedy, prompt_logits
from openinfer.testing.graphs import emulate_graphs

from test_glm52_fidelity import _prompts, chat_prompt, engine_for

pytest.importorskip("cupy")   # the launchers import it (nothing here touches a GPU)


def _on_device(a):
    from openinfer.testing.launch_check import FakeArray
    if isinstance(a, ForwardBatch):
        return dataclasses.replace(a, **{f.name: _on_device(getattr(a, f.name)) for f in dataclasses.fields(a)
                                         if not f.name.endswith("_host") and isinstance(getattr(a, f.name),
                                                                                         np.ndarray)})
    return a.view(FakeArray) if isinstance(a, np.ndarray) and not isinstance(a, FakeArray) else a


@pytest.fixture
def emulate(monkeypatch):
    """emulate(engine): the engine's glm52_* ops through the CUDA launchers and dsa_emulation's kernels; returns
    the launches made."""
    from openinfer.testing.launch_check import record_launches
    from openinfer_glm52.cuda import ops as cuda_ops
    from dsa_emulation import emulated_launch
    from test_glm52_cuda_compile import on_h100
    record_launches(monkeypatch, [cuda_ops])
    on_h100(monkeypatch)
    names: list[str] = []

    def launch(*args, **kw):
        names.append(args[1])
        emulated_launch(*args, **kw)
    monkeypatch.setattr(cuda_ops, "launch", launch)

    def install(engine):
        ops = engine.runner.model.ops
        for name in cuda_ops.__all__:
            def op(*args, _fn=getattr(cuda_ops, name)):
                return np.asarray(_fn(*[_on_device(a) for a in args]))
            monkeypatch.setattr(ops, name, op)
        return names
    return install


def test_prompt_logits_through_the_emulated_kernels(sparse, emulate):
    ckpt, _ = sparse
    eng = engine_for(ckpt)
    ids = chat_prompt(eng) + [int(t) for t in np.random.default_rng(5).integers(20, 700, 40)]
    want = prompt_logits(eng, ids)
    launches = emulate(eng)
    got = prompt_logits(eng, ids)
    assert {"indexer_rope_write_f32", "indexer_scores_f32", "indexer_topk_select", "sparse_mla_attention_f32"} \
        <= set(launches)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * np.abs(want).max())


def test_eager_decode_through_the_emulated_kernels(sparse, emulate):
    """Decode steps without graphs: the batch's own max_context_len sizes the indexer's score rows."""
    assert _emulated_selects(sparse, emulate, first=2, tokens=8) > 20


def test_rows_split_over_clusters_through_the_emulated_kernels(sparse, emulate, monkeypatch):
    """The select with each row split over a cluster of CTAs (a few keys a CTA here, as 128k-key rows are on a GPU)
    gives the numpy engine's greedy tokens."""
    from openinfer_glm52.cuda import ops as cuda_ops
    monkeypatch.setattr(cuda_ops, "SELECT_KEYS_PER_RANK", 4)
    assert _emulated_selects(sparse, emulate, first=1, tokens=6) > 10


def _emulated_selects(sparse, emulate, first: int, tokens: int) -> int:
    """Eager greedy decode of prompts[first:] through the emulated kernels gives the numpy engine's tokens; returns
    how many top-k selects launched."""
    ckpt, _ = sparse
    ref, eng = engine_for(ckpt, max_num_seqs=4), engine_for(ckpt, max_num_seqs=4)
    launches = emulate(eng)
    prompts = _prompts(eng, 4)[first:]
    want = [t for t, _, _ in generate(ref, prompts, greedy(tokens))]
    assert [t for t, _, _ in generate(eng, prompts, greedy(tokens))] == want
    return launches.count("indexer_topk_select")


def test_batched_chunked_cached_and_graph_decode_through_the_emulated_kernels(sparse, emulate):
    """Several sequences a step, prefix-cache hits, chunked prefill and decode-graph batches (the model's length
    as max_context_len, padding rows) give the numpy engine's greedy tokens."""
    ckpt, _ = sparse
    ref, eng = engine_for(ckpt, max_num_seqs=4), engine_for(ckpt, max_num_seqs=4, max_num_batched_tokens=24)
    graphs = emulate_graphs(eng)
    launches = emulate(eng)
    prompts = _prompts(eng, 4)
    for batch in ([prompts[3]], prompts[:3]):
        want = [t for t, _, _ in generate(ref, batch, greedy(6))]
        assert [t for t, _, _ in generate(eng, batch, greedy(6))] == want, f"batch of {len(batch)}"
    assert graphs.replays and launches.count("sparse_mla_attention_f32") > 20


def test_a_negative_slot_stores_nothing(emulate):
    """A padded token (slot -1) leaves the cache as it was, in the launcher as in the reference."""
    from openinfer_glm52 import ops as ref
    from openinfer_glm52.cuda import ops as cuda_ops
    from openinfer.plugin_api import RopeConfig, cos_sin
    rng = np.random.default_rng(0)
    cos, sin = cos_sin(RopeConfig(1e4, 8), 16)
    q, k = rng.standard_normal((3, 2, 16)).astype(np.float32), rng.standard_normal((3, 16)).astype(np.float32)
    w, b = np.ones(16, np.float32), np.zeros(16, np.float32)
    pos, slots = np.array([0, 1, 2], np.int32), np.array([5, -1, 6], np.int64)
    pools = [np.zeros((4, 2, 4, 16), np.float32) for _ in range(2)]
    want = ref.glm52_indexer_rope_write(q, k, w, b, pos, cos, sin, pools[0][:, 1], slots, True)
    got = cuda_ops.glm52_indexer_rope_write(*[_on_device(a) for a in (q, k, w, b, pos, cos, sin, pools[1][:, 1],
                                                                       slots)], True)
    np.testing.assert_allclose(np.asarray(got), want, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(pools[1], pools[0], rtol=1e-6, atol=1e-6)
    assert np.count_nonzero(pools[0].any(axis=-1)) == 2   # rows 5 and 6 of layer 1 only


def test_the_emulation_catches_a_layer_view_indexed_as_a_packed_cache(sparse, emulate, monkeypatch):
    """The check itself: a launcher that passes a layer view's block stride wrong reads outside the view."""
    from openinfer_glm52.cuda import ops as cuda_ops
    ckpt, _ = sparse
    eng = engine_for(ckpt)
    emulate(eng)
    monkeypatch.setattr(cuda_ops, "layer_view", lambda cache, dim, what: cache.shape[1] * dim)
    with pytest.raises(AssertionError, match="outside the array passed"):
        prompt_logits(eng, chat_prompt(eng))
