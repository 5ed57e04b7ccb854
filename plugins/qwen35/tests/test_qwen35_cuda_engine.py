"""The Qwen3.5 line on the CUDA backend (GPU only; eager: test_qwen35_cuda.py covers the decode
graphs): a tiny model against transformers, prompts crossing the delta rule's 64-token
chunks, batched requests of different lengths, in float32 and bfloat16."""
from __future__ import annotations

import numpy as np
import pytest

from openinfer.testing.cuda import require_gpu
from openinfer.testing.engine import assert_scores_match, generate, greedy, prompt_logits, score_prompt
from openinfer.testing.hf_reference import assert_within_bf16_noise, hf_greedy_stepwise, hf_logits

from conftest import _build
from test_qwen35_fidelity import engine_for, tokens

pytestmark = pytest.mark.cuda
cp = require_gpu()


@pytest.fixture(scope="module")
def d64(tmp_path_factory):
    """The CUDA attention kernels take head_dim 64, 128 or 256 (the CPU tests' model uses 32)."""
    return _build(tmp_path_factory, "qwen35-d64", vl=True, tied=False, head_dim=64)


def gpu_engine(ckpt, dtype: str):
    return engine_for(ckpt, device="cuda", dtype=dtype, enforce_eager=True, kv_cache_memory_gib=0.25,
                      max_num_seqs=8)


def test_float32_matches_transformers(d64):
    ckpt, hf = d64
    eng = gpu_engine(ckpt, "float32")
    ids = tokens(150, seed=1)
    ref = hf_logits(hf, ids)
    np.testing.assert_allclose(prompt_logits(eng, ids), ref, rtol=1e-3, atol=1e-3 * np.abs(ref).max())
    prompts = [tokens(n, seed=10 + n) for n in (1, 3, 64, 65, 150)]
    want = [hf_greedy_stepwise(hf, p, 16) for p in prompts]
    assert [out for out, _, _ in generate(eng, prompts, greedy(16))] == want


def test_prompt_logprobs_match_transformers(d64):
    """Prompt logprobs in float32 on the GPU (score_rows; 8 rows a step, so chunks end inside the delta rule's
    64-token chunks) against transformers' log-softmax, within the 1e-3 the float32 logits meet."""
    ckpt, hf = d64
    eng = engine_for(ckpt, device="cuda", dtype="float32", enforce_eager=True, kv_cache_memory_gib=0.25,
                     max_num_seqs=8, max_num_batched_tokens=32)
    ids = tokens(100, seed=3)
    scored, _, _ = score_prompt(eng, ids, 2)
    assert_scores_match(scored, ids, hf_logits(hf, ids), 2, atol=2e-3)


def test_bfloat16_against_transformers(d64):
    """bf16 rounds away from the float32 reference: ours may stray about as far as transformers'
    own bf16 run does."""
    import torch
    ckpt, hf = d64
    ids = tokens(200, seed=2)
    ref32 = hf_logits(hf, ids)
    try:
        ref16 = hf_logits(hf.to(torch.bfloat16), ids)
    finally:
        hf.to(torch.float32)
    assert_within_bf16_noise(prompt_logits(gpu_engine(ckpt, "bfloat16"), ids), ref32, ref16)
