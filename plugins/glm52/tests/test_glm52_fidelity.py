"""The GLM-5.x line against transformers on tiny random models whose prompts are longer than index_topk (so
attention really is sparse), with full and shared indexer layers: logits and greedy continuations, also batched,
chunked, on prefix-cache hits, restored from the host tier and through emulated decode graphs.

Exact score ties at the top-k cut would make the selection depend on torch.topk's order among them; with 16
indexer heads the tiny models have none, so any difference in a selection shows up as a logits mismatch."""
from __future__ import annotations

import json
import shutil
from contextlib import contextmanager

import numpy as np
import pytest

from openinfer.testing import EngineArgs, build_engine
from openinfer.testing import bytes_per_block
from openinfer.testing import LoadError
from openinfer.testing.engine import generate, greedy, prompt_logits
from openinfer.testing.graphs import emulate_graphs
from openinfer.testing.hf_reference import hf_greedy, hf_logits
from openinfer.testing import Checkpoint
from openinfer_glm52.chat import GLM52_CHAT_FORMAT
from openinfer_glm52.line import Glm52Line

from glm52_tiny import TINY

CHAT = [{"role": "system", "content": "You are terse."},
        {"role": "user", "content": "Name three prime numbers and explain why 1 is not prime."}]


def engine_for(ckpt, **kw):
    return build_engine(str(ckpt), EngineArgs(**kw))


def chat_prompt(engine) -> list[int]:
    text = engine.tokenizer.apply_chat_template(GLM52_CHAT_FORMAT.template_messages(CHAT), enable_thinking=False)
    return engine.tokenizer.encode(text)


_GREEDY: dict = {}


def ref_greedy(hf, ids: list[int], n: int) -> list[int]:
    """transformers' greedy continuation, generated once per prompt (32 tokens) and cut to n <= 32."""
    key = (id(hf), tuple(ids))
    if key not in _GREEDY:
        _GREEDY[key] = hf_greedy(hf, ids, 32)
    return _GREEDY[key][:n]


def assert_logits_close(ours: np.ndarray, ref: np.ndarray) -> None:
    np.testing.assert_allclose(ours, ref, rtol=1e-4, atol=1e-4 * np.abs(ref).max())


def _prompts(eng, n=6):
    base = chat_prompt(eng)
    rng = np.random.default_rng(0)
    return [base[: 5 + 7 * i] + [int(t) for t in rng.integers(0, 700, size=i)] for i in range(n)]


@pytest.mark.parametrize("which", ["sparse", "dense"])
def test_logits_and_greedy_match_transformers(which, request):
    ckpt, hf = request.getfixturevalue(which)
    eng = engine_for(ckpt)
    ids = chat_prompt(eng)
    assert len(ids) > 16
    assert_logits_close(prompt_logits(eng, ids), hf_logits(hf, ids))
    [(tokens, fin, _)] = generate(eng, [ids], greedy(32))
    assert tokens == ref_greedy(hf, ids, 32)
    assert fin.reason == "length" and fin.completion_tokens == 32


@contextmanager
def every_key_selected(hf):
    """transformers' model with a top-k covering every key: DSA selects all, attention is plain MLA."""
    indexers = [layer.self_attn.indexer for layer in hf.model.layers if layer.self_attn.indexer is not None]
    for m in indexers:
        m.index_topk = 4096
    try:
        yield hf
    finally:
        for m in indexers:
            m.index_topk = TINY["index_topk"]


def test_sparse_attention_changes_the_logits(sparse):
    """The sparse model's prompts really select: the same weights with a top-k covering every key give other
    logits (transformers' own), and ours follow the sparse ones."""
    ckpt, hf = sparse
    ids = chat_prompt(engine_for(ckpt))
    want = hf_logits(hf, ids)
    with every_key_selected(hf):
        dense = hf_logits(hf, ids)
    assert np.abs(dense[8:] - want[8:]).max() > 100 * 1e-4 * np.abs(want).max()
    assert_logits_close(prompt_logits(engine_for(ckpt), ids), want)


def test_an_index_topk_override_runs_dense_mla_over_the_same_weights(sparse):
    """--hf-overrides '{"index_topk": N}', N the model's length: every key is selected, so the engine runs plain
    MLA attention, eager and in (emulated) decode graphs, whose batches carry the model's length: transformers'
    logits and greedy tokens with every key selected. scripts/gpu_glm52_steps.sh times its dense steps so."""
    ckpt, hf = sparse
    overrides = {"index_topk": TINY["max_position_embeddings"]}
    eng = engine_for(ckpt, hf_overrides=overrides)
    ids = chat_prompt(eng)
    with every_key_selected(hf):
        want, want_tokens = hf_logits(hf, ids), hf_greedy(hf, ids, 12)
    assert_logits_close(prompt_logits(eng, ids), want)
    graph = engine_for(ckpt, hf_overrides=overrides, max_num_seqs=4)
    graphs = emulate_graphs(graph)
    [(tokens, _, _)] = generate(graph, [ids], greedy(12))
    assert tokens == want_tokens and graphs.replays


def test_shared_layers_load_without_indexer_weights(sparse):
    ckpt, _ = sparse
    config = json.loads((ckpt / "config.json").read_text())
    assert config["indexer_types"] == ["full", "full", "shared", "full"]
    names = set(Checkpoint(str(ckpt)).names())
    assert not any(n.startswith("model.layers.2.self_attn.indexer.") for n in names)
    cfg = Glm52Line().parse_config(config)
    groups = {g.name: g for g in Glm52Line().state_spec(cfg)}
    assert groups["indexer"].layers == 3 and groups["mla"].layers == 4


def test_a_full_layer_without_indexer_weights_is_refused(sparse, tmp_path):
    ckpt, _ = sparse
    copy = tmp_path / "ckpt"
    shutil.copytree(ckpt, copy)
    config = json.loads((copy / "config.json").read_text())
    config["indexer_types"] = ["full"] * 4
    (copy / "config.json").write_text(json.dumps(config))
    with pytest.raises(LoadError, match="model.layers.2.self_attn.indexer"):
        engine_for(copy)


def test_concurrent_requests_of_different_lengths(sparse):
    ckpt, hf = sparse
    eng = engine_for(ckpt)
    prompts = _prompts(eng, 4)
    for p, (tokens, _, _) in zip(prompts, generate(eng, prompts, greedy(16))):
        assert tokens == ref_greedy(hf, p, 16)


def test_chunked_prefill_matches(sparse):
    ckpt, hf = sparse
    ids = chat_prompt(engine_for(ckpt))
    want = ref_greedy(hf, ids, 24)
    for budget in (3, 16):
        [(tokens, _, _)] = generate(engine_for(ckpt, max_num_batched_tokens=budget), [ids], greedy(24))
        assert tokens == want, f"token budget {budget}"
    eng = engine_for(ckpt, max_num_batched_tokens=10)   # decode rows and prefill chunks in one step
    prompts = _prompts(eng, 4)
    for p, (tokens, _, _) in zip(prompts, generate(eng, prompts, greedy(12))):
        assert tokens == ref_greedy(hf, p, 12)


def test_prefix_cache_hit_same_output(sparse):
    """A hit restores both the latents and the indexer keys of the cached blocks."""
    ckpt, hf = sparse
    eng = engine_for(ckpt, block_size=8)
    ids = chat_prompt(eng)
    [(first, _, cached0)] = generate(eng, [ids], greedy(24))
    [(again, _, cached1)] = generate(eng, [ids], greedy(24))
    assert cached0 == 0 and cached1 >= len(ids) - 8
    assert first == again == ref_greedy(hf, ids, 24)
    turn2 = ids + first + eng.tokenizer.encode("<|user|>And five more?<|assistant|><think></think>")
    [(tokens, _, cached2)] = generate(eng, [turn2], greedy(12))
    assert cached2 >= (len(ids) + len(first)) // 8 * 8 - 8
    assert tokens == ref_greedy(hf, turn2, 12)


def test_host_tier_restore_gives_identical_tokens(sparse):
    """--kv-offload: blocks evicted from a small device pool (latents and indexer keys alike) come back from the
    host tier and the output is transformers'."""
    ckpt, hf = sparse
    groups = list(engine_for(ckpt).runner.pools.groups.values())
    per_block = bytes_per_block(groups, 16, {g.name: 4 for g in groups})
    eng = engine_for(ckpt, max_model_len=512, kv_cache_memory_gib=24 * per_block / 2**30, kv_offload=True,
                     kv_offload_host_gib=64 * per_block / 2**30)
    rng = np.random.default_rng(5)
    prompt = [int(t) for t in rng.integers(10, 700, 83)]
    [(cold, _, cached)] = generate(eng, [prompt], greedy(12))
    assert cached == 0 and cold == ref_greedy(hf, prompt, 12)
    for _ in range(3):   # fresh prompts through the whole device pool: nothing of the first stays there
        generate(eng, [[int(t) for t in rng.integers(10, 700, eng.blocks.usable_blocks * 8 - 8)]], greedy(4))
    [(restored, fin, cached)] = generate(eng, [prompt], greedy(12))
    assert cached == fin.cached_tokens == 80 and restored == cold
    assert eng.stats().offload.restored_blocks == 5


def test_emulated_graph_decode_matches_eager(sparse):
    ckpt, _ = sparse
    eager, graph = engine_for(ckpt, max_num_seqs=4), engine_for(ckpt, max_num_seqs=4)
    graphs = emulate_graphs(graph)
    prompts = _prompts(graph, 4)
    for batch in ([prompts[2]], prompts[:3], prompts):
        want = [t for t, _, _ in generate(eager, batch, greedy(10))]
        assert [t for t, _, _ in generate(graph, batch, greedy(10))] == want, f"batch of {len(batch)}"
    assert {1, 4} <= set(graphs.replays)


def test_dummy_weights_cover_every_tensor_the_model_loads(sparse):
    """--load-format dummy draws every tensor weight_shapes names, and the model loads nothing else."""
    ckpt, _ = sparse
    eng = engine_for(ckpt, load_format="dummy")
    [(tokens, _, _)] = generate(eng, [chat_prompt(eng)], greedy(4))
    assert len(tokens) == 4


def test_the_mtp_layer_is_skipped_and_named_in_the_log(sparse, tmp_path, caplog):
    """A checkpoint's next-token-prediction layer (model.layers.{num_hidden_layers}.*) loads as unused, and the
    log says so; the output is the model's without it."""
    from safetensors.numpy import save_file
    ckpt, hf = sparse
    copy = tmp_path / "ckpt"
    shutil.copytree(ckpt, copy)
    config = json.loads((copy / "config.json").read_text())
    (copy / "config.json").write_text(json.dumps({**config, "num_nextn_predict_layers": 1}))
    save_file({"model.layers.4.eh_proj.weight": np.ones((64, 128), np.float32),
               "model.layers.4.self_attn.q_a_proj.weight": np.ones((48, 64), np.float32)},
              str(copy / "mtp.safetensors"))
    caplog.set_level("INFO", logger="openinfer")
    eng = engine_for(copy)
    assert "model.layers.4.* are skipped" in caplog.text and "not used" not in caplog.text
    ids = chat_prompt(eng)
    [(tokens, _, _)] = generate(eng, [ids], greedy(8))
    assert tokens == ref_greedy(hf, ids, 8)
