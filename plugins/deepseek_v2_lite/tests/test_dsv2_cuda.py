"""The DeepSeek-V2 line on the CUDA backend (GPU only): a tiny model with the real latent widths (the CUDA MLA
kernels take kv_lora_rank 512 + qk_rope_head_dim 64) against the CPU engine, eager against CUDA-graph replay,
batched, long contexts (split decode) and prefix-cache hits, in bfloat16 as the checkpoints are (the CUDA MLA and
MoE ops are bf16 only)."""
from __future__ import annotations

import numpy as np
import pytest

from openinfer.testing.cuda import require_gpu
from openinfer.testing.engine import assert_graphs_replay_eager, generate, greedy, logits_with_shared_choices

from dsv2_tiny import FULL, TINY
from test_dsv2_fidelity import _prompts, chat_prompt, engine_for, random_prompt

pytestmark = pytest.mark.cuda
cp = require_gpu()

GPU = dict(device="cuda", dtype="bfloat16", kv_cache_memory_gib=0.25, max_num_seqs=16)
LATENT = dict(kv_lora_rank=512, qk_rope_head_dim=64, qk_nope_head_dim=32, v_head_dim=32)


def _build(tmp_path_factory, tokenizer_dir, name: str, config: dict):
    pytest.importorskip("torch")
    from openinfer.testing.hf_reference import build_hf_checkpoint
    out = tmp_path_factory.mktemp(name)
    return out, build_hf_checkpoint(out, "deepseek_v2", dict(config, **LATENT), tokenizer_dir=tokenizer_dir,
                                    save_dtype="bfloat16")


@pytest.fixture(scope="module")
def lite(tmp_path_factory, tokenizer_dir):
    return _build(tmp_path_factory, tokenizer_dir, "dsv2-lite-gpu", TINY)


@pytest.fixture(scope="module")
def full(tmp_path_factory, tokenizer_dir):
    """q-LoRA and group-limited routing."""
    return _build(tmp_path_factory, tokenizer_dir, "dsv2-full-gpu", FULL)


def gpu_engine(ckpt, **kw):
    return engine_for(ckpt, **{**GPU, **kw})


@pytest.mark.parametrize("which", ["lite", "full"])
def test_bfloat16_logits_follow_the_cpu_engine(which, request):
    """bf16 rounds every activation where the CPU engine computes in float32 (on the same bf16 weights): nearly the
    same experts, and over the GPU's routing (an expert moved across the top-k cut by rounding is no kernel error:
    testing.engine.logits_with_shared_choices) logits at bf16 tolerance and the teacher-forced top-1 choice at nearly
    every position (a tiny random model has near ties), over a prompt long enough for several attention tiles and
    both expert-GEMM tilings."""
    ckpt, _ = request.getfixturevalue(which)
    gpu, cpu = gpu_engine(ckpt), engine_for(ckpt)
    ids = chat_prompt(gpu) + random_prompt(300, 7)
    ours, ref, shared = logits_with_shared_choices(gpu, cpu, ids, ["moe_router"])
    assert np.isfinite(ours).all()
    assert shared["moe_router"] >= 0.95, f"the GPU routes {shared['moe_router']:.3f} of tokens' experts as the CPU"
    assert np.abs(ours - ref).max() < 0.05 * np.abs(ref).max()
    agree = float((ours.argmax(1) == ref.argmax(1)).mean())
    assert agree >= 0.9, f"top-1 agreement {agree:.3f}"


@pytest.mark.parametrize("context", [40, 1500])
def test_decode_follows_the_cpu_engine(lite, context):
    """The GPU's greedy decode (one token a step; a long context splits its keys over the grid) against the same
    sequence teacher-forced: the GPU's prefill logits at bf16 tolerance of the CPU engine's, and their argmax
    the decoded token at nearly every step. The 1500-token prefill gives each of the 8 experts ~560 rows: its routed
    experts run through cuBLAS (kernels/cuda/moe_blas.py), the decode steps' through the grouped GEMMs."""
    ckpt, _ = lite
    gpu, cpu = gpu_engine(ckpt), engine_for(ckpt)
    ids = chat_prompt(gpu) + random_prompt(context, 3)
    [(tokens, _, _)] = generate(gpu, [ids], greedy(24))
    full = ids + tokens
    ours, ref, shared = logits_with_shared_choices(gpu, cpu, full, ["moe_router"])
    ours, ref = ours[len(ids) - 1:], ref[len(ids) - 1:]
    assert shared["moe_router"] >= 0.95, f"the GPU routes {shared['moe_router']:.3f} of tokens' experts as the CPU"
    assert np.abs(ours - ref).max() < 0.05 * np.abs(ref).max()
    assert float((ours[:-1].argmax(1) == np.array(tokens)).mean()) >= 0.9


@pytest.mark.parametrize("which", ["lite", "full"])
def test_graph_replay_matches_eager(which, request):
    """Batch sizes that are graph buckets, so eager and replay run the same shapes: the same greedy tokens."""
    ckpt, _ = request.getfixturevalue(which)
    graph = gpu_engine(ckpt, max_num_seqs=32)
    assert_graphs_replay_eager(gpu_engine(ckpt, enforce_eager=True, max_num_seqs=32), graph, _prompts(graph, 32), 24)


def test_long_context_replays_like_eager(lite):
    """A 1500-token context: decode splits its keys over the grid (merged in the kernel) in graph replays as in
    eager steps."""
    ckpt, _ = lite
    ids = random_prompt(1500, 11)
    tokens = [generate(e, [ids], greedy(16))[0][0] for e in (gpu_engine(ckpt, enforce_eager=True), gpu_engine(ckpt))]
    assert tokens[0] == tokens[1]


def test_prefix_hit_replays_like_eager(lite):
    """A prompt run twice on the graph engine: the second run hits the cache and gives the eager engine's hit tokens
    (a hit prefills only the prompt's tail, whose GEMMs round differently in bf16 from the whole prompt's, so the
    cold run's tokens are not the reference)."""
    ckpt, _ = lite
    graph, eager = gpu_engine(ckpt), gpu_engine(ckpt, enforce_eager=True)
    ids = chat_prompt(graph) + random_prompt(70, 5)
    eager_hit = [generate(eager, [ids], greedy(16))[0] for _ in range(2)][1]
    generate(graph, [ids], greedy(16))
    [(hit, fin, cached)] = generate(graph, [ids], greedy(16))
    assert cached > 0 and fin.cached_tokens == cached == eager_hit[2]
    assert hit == eager_hit[0]
