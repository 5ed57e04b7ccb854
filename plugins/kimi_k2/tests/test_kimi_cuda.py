"""The kimi_k2 line on the CUDA backend (GPU only): tiny INT4 and FP8 Kimi checkpoints with the real latent widths
(the CUDA MLA kernels take kv_lora_rank 512 + qk_rope_head_dim 64) in bfloat16 against the CPU engine, greedy
decode against the same sequence teacher-forced, and CUDA-graph replay against eager. The quantized weights stay
packed on the device (the W4A16 expert kernels and the FP8 linears of quant.cu run them)."""
from __future__ import annotations

import numpy as np
import pytest

from openinfer.testing.cuda import require_gpu
from openinfer.testing.engine import generate, greedy, logits_with_shared_choices

from kimi_tiny import KIMI, build_checkpoint
from test_kimi_fidelity import chat_prompt, engine_for, random_prompt

pytestmark = pytest.mark.cuda
cp = require_gpu()

GPU = dict(device="cuda", dtype="bfloat16", kv_cache_memory_gib=0.25, max_num_seqs=16)
LATENT = dict(KIMI, kv_lora_rank=512, qk_rope_head_dim=64, qk_nope_head_dim=32, v_head_dim=32)


@pytest.fixture(scope="module", params=["int4", "fp8"])
def quantized(request, tmp_path_factory, kimi_tokenizer_dir, vocab):
    return build_checkpoint(tmp_path_factory, kimi_tokenizer_dir, vocab, f"kimi-{request.param}-gpu", LATENT,
                            request.param)


def test_weights_stay_quantized_on_the_gpu(quantized):
    layer = engine_for(quantized[0], **GPU).runner.model.layers[1]
    w = layer.mlp.w.gate_up
    assert isinstance(w.packed if hasattr(w, "packed") else w.data, cp.ndarray)
    assert (w.packed if hasattr(w, "packed") else w.data).dtype in (np.int32, np.uint8)


def test_bfloat16_logits_follow_the_cpu_engine(quantized, vocab):
    ckpt, _ = quantized
    gpu, cpu = engine_for(ckpt, **GPU), engine_for(ckpt)
    ids = chat_prompt(gpu) + random_prompt(300, 7, vocab)
    ours, ref, agree = logits_with_shared_choices(gpu, cpu, ids, ["moe_router"])   # over the GPU's routing
    assert np.isfinite(ours).all()
    assert agree["moe_router"] >= 0.95, f"the GPU routes {agree['moe_router']:.3f} of tokens' experts as the CPU"
    assert np.abs(ours - ref).max() < 0.05 * np.abs(ref).max()
    assert float((ours.argmax(1) == ref.argmax(1)).mean()) >= 0.9


def test_decode_follows_teacher_forcing(quantized, vocab):
    ckpt, _ = quantized
    gpu, cpu = engine_for(ckpt, **GPU), engine_for(ckpt)
    ids = chat_prompt(gpu) + random_prompt(40, 3, vocab)
    [(tokens, _, _)] = generate(gpu, [ids], greedy(24))
    full = ids + tokens
    ours, ref, agree = logits_with_shared_choices(gpu, cpu, full, ["moe_router"])
    ours, ref = ours[len(ids) - 1:], ref[len(ids) - 1:]
    assert agree["moe_router"] >= 0.95, f"the GPU routes {agree['moe_router']:.3f} of tokens' experts as the CPU"
    assert np.abs(ours - ref).max() < 0.05 * np.abs(ref).max()
    assert float((ours[:-1].argmax(1) == np.array(tokens)).mean()) >= 0.9


def test_graph_replay_matches_eager(quantized, vocab):
    ckpt, _ = quantized
    eager, graphs = engine_for(ckpt, **GPU, enforce_eager=True), engine_for(ckpt, **GPU)
    prompts = [chat_prompt(eager)[: 6 + 5 * i] + random_prompt(i, i, vocab) for i in range(4)]
    assert [t for t, _, _ in generate(graphs, prompts, greedy(12))] == \
        [t for t, _, _ in generate(eager, prompts, greedy(12))]


def test_graph_replay_matches_eager_past_the_gemv_rows(quantized, vocab):
    """20 sequences decode at once: the FP8 Linears take their dequantize + GEMM path inside the captured graphs
    (more rows than the quantized GEMV's 16) and the expert kernels group 160 (token, expert) pairs."""
    ckpt, _ = quantized
    args = dict(GPU, max_num_seqs=24)
    eager, graphs = engine_for(ckpt, **args, enforce_eager=True), engine_for(ckpt, **args)
    prompts = [chat_prompt(eager)[: 4 + i % 9] + random_prompt(2 + i % 5, 100 + i, vocab) for i in range(20)]
    assert [t for t, _, _ in generate(graphs, prompts, greedy(8))] == \
        [t for t, _, _ in generate(eager, prompts, greedy(8))]
