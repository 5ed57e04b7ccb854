"""The Qwen3.5 line on the CUDA backend (GPU only): against transformers + torch on the same GPU
and the CPU engine, eager against CUDA-graph replay (state rows in the graphs' inputs), batched,
chunked and prefix-hit runs. The tiny models use the real head sizes (attention head 256 with
rotary 64, Gated DeltaNet heads 128) so the kernels run their production shapes."""
from __future__ import annotations

from unittest import mock

import numpy as np
import pytest

from openinfer.testing.cuda import require_gpu
from openinfer.testing.engine import assert_graphs_replay_eager, generate, greedy, prompt_logits
from openinfer.testing.hf_reference import assert_within_bf16_noise, hf_greedy_stepwise, hf_logits

from conftest import _build
from test_qwen35_checkpoints import checkpoint_row, state_row
from test_qwen35_fidelity import assert_logits_close, engine_for, tokens

pytestmark = pytest.mark.cuda
cp = require_gpu()

GPU = dict(device="cuda", kv_cache_memory_gib=0.25, max_num_seqs=16)
SHAPES = dict(hidden_size=128, head_dim=256, linear_key_head_dim=128, linear_value_head_dim=128,
              rope_parameters={"rope_type": "default", "rope_theta": 1e7, "partial_rotary_factor": 0.25,
                               "mrope_section": [11, 11, 10], "mrope_interleaved": True})


def _gpu_build(tmp_path_factory, name: str, tied: bool, save_dtype: str = "float32"):
    """A tiny checkpoint (the real VL layout, the line's own tokenizer) and its transformers model on
    the GPU in float32. cuDNN's TF32 would round transformers' causal conv to ~1e-3: off."""
    import torch
    from openinfer_qwen35.line import Qwen35Line
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cuda.matmul.allow_tf32 = False
    ckpt, hf = _build(tmp_path_factory, name, vl=True, tied=tied, tokenizer_dir=Qwen35Line().tokenizer_dir(),
                      save_dtype=save_dtype, **SHAPES)
    return ckpt, hf.to("cuda")


@pytest.fixture(scope="module")
def untied(tmp_path_factory):
    return _gpu_build(tmp_path_factory, "qwen35-gpu-untied", tied=False)


@pytest.fixture(scope="module")
def tied(tmp_path_factory):
    return _gpu_build(tmp_path_factory, "qwen35-gpu-tied", tied=True)


@pytest.fixture(scope="module")
def bf16(tmp_path_factory):
    return _gpu_build(tmp_path_factory, "qwen35-gpu-bf16", tied=True, save_dtype="bfloat16")


def gpu_engine(ckpt, **kw):
    return engine_for(ckpt, **{**GPU, **kw})


@pytest.mark.parametrize("which", ["untied", "tied"])
def test_float32_matches_transformers_and_the_cpu_engine(which, request):
    ckpt, hf = request.getfixturevalue(which)
    gpu = gpu_engine(ckpt, dtype="float32")
    assert gpu.runner.graphs is not None          # hybrid models decode through CUDA graphs now
    ids = tokens(45, seed=1)
    ref = hf_logits(hf, ids)
    ours = prompt_logits(gpu, ids)
    np.testing.assert_allclose(ours, ref, rtol=1e-3, atol=1e-3 * np.abs(ref).max())
    assert_logits_close(prompt_logits(engine_for(ckpt), ids), ref)
    want = hf_greedy_stepwise(hf, ids, 32)
    assert generate(gpu, [ids], greedy(32))[0][0] == want
    assert generate(engine_for(ckpt), [ids], greedy(32))[0][0] == want


def test_bfloat16_against_transformers_on_the_gpu(bf16):
    """bf16 rounds differently from torch's kernels: ours may stray from transformers' float32 logits
    about as far as transformers' own bf16 run does (bf16-valued weights, so only compute differs)."""
    import torch
    ckpt, hf = bf16
    ids = tokens(200, seed=3)
    ours = prompt_logits(gpu_engine(ckpt), ids)
    ref32 = hf_logits(hf, ids)
    try:
        ref16 = hf_logits(hf.to(torch.bfloat16), ids)
    finally:
        hf.to(torch.float32)
    assert_within_bf16_noise(ours, ref32, ref16)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_graph_replay_matches_eager(untied, dtype):
    """Batch sizes that are graph buckets, so eager and replay run the same GEMM shapes; one-token
    prompts decode their first token through a graph with no state before it."""
    ckpt, _ = untied
    eager = gpu_engine(ckpt, dtype=dtype, enforce_eager=True, max_num_seqs=32)
    graph = gpu_engine(ckpt, dtype=dtype, max_num_seqs=32)
    assert_graphs_replay_eager(eager, graph, [tokens(3 + 11 * i, seed=10 + i) for i in range(32)], 24)
    one_token = [tokens(1, seed=2), tokens(1, seed=3)]
    assert [t for t, _, _ in generate(graph, one_token, greedy(24))] == \
        [t for t, _, _ in generate(eager, one_token, greedy(24))]
    # a prefix hit restores a state checkpoint, then replays: the same tokens
    again = tokens(45, seed=6)
    first = generate(graph, [again], greedy(24))[0][0]
    [(hit, fin, cached)] = generate(graph, [again], greedy(24))
    assert cached == 32 and fin.cached_tokens == 32
    assert hit == first == generate(eager, [again], greedy(24))[0][0]


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_gdn_norm_fold_keeps_greedy_eager_and_in_graphs(untied, dtype):
    """The decode step runs the GDN output norm inside the delta-rule kernel (a head's 4 column tiles as one cluster)
    with the same bits as the two launches it stands for, so eager and graph-replayed greedy tokens equal those of
    an eager engine whose decode runs the two launches (delta_rule.norm_fold_applies patched off)."""
    from openinfer_qwen35.cuda import delta_rule
    if not delta_rule.norm_fold_applies(128):
        pytest.skip("no thread-block clusters (sm_90+): the fold runs the two launches")
    ckpt, _ = untied
    plain = gpu_engine(ckpt, dtype=dtype, enforce_eager=True)
    eager = gpu_engine(ckpt, dtype=dtype, enforce_eager=True)
    graph = gpu_engine(ckpt, dtype=dtype)
    assert graph.runner.graphs is not None and eager.runner.graphs is None
    prompts = [tokens(3 + 11 * i, seed=10 + i) for i in range(8)]
    # graph buckets (1, 2, 4, 8), so eager and replay run the same GEMM shapes (test_graph_replay_matches_eager)
    for batch in ([prompts[3]], prompts[:2], prompts[:4], prompts, [tokens(1, seed=2), tokens(1, seed=3)]):
        with mock.patch.object(delta_rule, "norm_fold_applies", lambda dv: False):
            want = [t for t, _, _ in generate(plain, batch, greedy(24))]
        assert [t for t, _, _ in generate(eager, batch, greedy(24))] == want, f"eager, batch of {len(batch)}"
        assert [t for t, _, _ in generate(graph, batch, greedy(24))] == want, f"graphs, batch of {len(batch)}"


def test_float32_batching_chunking_and_prefix_hits_keep_greedy(untied):
    ckpt, hf = untied
    prompts = [tokens(3 + 11 * i, seed=10 + i) for i in range(6)]
    want = [hf_greedy_stepwise(hf, p, 16) for p in prompts]
    eng = gpu_engine(ckpt, dtype="float32")
    assert [t for t, _, _ in generate(eng, prompts, greedy(16))] == want        # batch of 6: bucket 8
    chunked = gpu_engine(ckpt, dtype="float32", max_num_batched_tokens=7)      # chunks end inside conv windows
    assert [t for t, _, _ in generate(chunked, prompts, greedy(16))] == want
    ids = tokens(45, seed=6)
    first = generate(eng, [ids], greedy(24))[0][0]
    turn2 = ids + first + tokens(10, seed=7)
    [(out, _, cached)] = generate(eng, [turn2], greedy(16))
    assert cached == 64 and out == hf_greedy_stepwise(hf, turn2, 16)


@pytest.mark.parametrize("budget", [1024, 503], ids=["one_step", "chunked"])
def test_prefill_checkpoint_matches_the_cpu_engine_and_keeps_greedy(untied, budget):
    """The in-prefill save of a 1024-token prompt's last full block (1008, off the 64-token chunk
    grid: the state walk restarts there; with budget 503 the last chunk starts at 1006, so the saved
    conv window reaches into the previous chunk's state): the checkpoint row equals the numpy
    engine's, and resending the prompt hits it with the greedy tokens of the uncached engine."""
    ckpt, _ = untied
    ids = tokens(1024, seed=41)
    kw = dict(block_size=16, max_num_batched_tokens=budget)
    gpu, cpu = gpu_engine(ckpt, dtype="float32", **kw), engine_for(ckpt, **kw)
    first, on_cpu = (generate(e, [ids], greedy(8))[0][0] for e in (gpu, cpu))
    got, want = (state_row(e, checkpoint_row(e, ids, 1008)) for e in (gpu, cpu))
    for part in want:
        np.testing.assert_allclose(got[part], want[part], rtol=1e-3, atol=1e-3 * np.abs(want[part]).max(),
                                   err_msg=part)
    [(again, _, cached)] = generate(gpu, [ids], greedy(8))
    [(plain, _, _)] = generate(gpu_engine(ckpt, dtype="float32", enable_prefix_caching=False, **kw), [ids],
                               greedy(8))
    assert cached == 1008 and first == again == plain == on_cpu
