"""The Qwen3 line on the CUDA backend (GPU only): against the CPU engine and transformers, eager
against CUDA-graph replay, batched and prefix-hit runs, and the weight upload path."""
from __future__ import annotations

import numpy as np
import pytest

from openinfer.testing.cuda import require_gpu
from openinfer.testing.engine import assert_graphs_replay_eager, generate, greedy, prompt_logits
from openinfer.testing.hf_reference import hf_greedy, hf_logits

from conftest import _build
from test_fidelity import _prompts, assert_logits_close, chat_prompt, engine_for

pytestmark = pytest.mark.cuda
cp = require_gpu()

GPU = dict(device="cuda", kv_cache_memory_gib=0.25, max_num_seqs=16)


# the CUDA attention kernels take head_dim 64, 128 or 256 (the CPU tests' tiny models use 32)
@pytest.fixture(scope="module")
def untied(tmp_path_factory):
    return _build(tmp_path_factory, "qwen3-untied-d64", tie_word_embeddings=False, head_dim=64)


@pytest.fixture(scope="module")
def bf16(tmp_path_factory):
    return _build(tmp_path_factory, "qwen3-bf16-d64", tie_word_embeddings=True, head_dim=64, save_dtype="bfloat16")


def gpu_engine(ckpt, **kw):
    return engine_for(ckpt, **{**GPU, **kw})


def test_float32_matches_cpu_and_transformers(untied):
    ckpt, hf = untied
    gpu = gpu_engine(ckpt, dtype="float32")
    ids = chat_prompt(gpu)
    ref = hf_logits(hf, ids)
    ours = prompt_logits(gpu, ids)
    np.testing.assert_allclose(ours, ref, rtol=1e-3, atol=1e-3 * np.abs(ref).max())
    assert_logits_close(prompt_logits(engine_for(ckpt), ids), ref)
    [(tokens, _, _)] = generate(gpu, [ids], greedy(32))
    assert tokens == hf_greedy(hf, ids, 32)


def test_bfloat16_against_transformers_on_the_gpu(bf16):
    """bf16 rounds differently from torch's kernels, so compare logits at bf16 tolerance and the
    teacher-forced top-1 choice at every position (a tiny random model has near ties)."""
    import torch
    ckpt, hf = bf16
    gpu = gpu_engine(ckpt)
    rng = np.random.default_rng(3)
    ids = chat_prompt(gpu) + [int(t) for t in rng.integers(0, 151000, 200)]
    ours = prompt_logits(gpu, ids)
    model = hf.to("cuda", torch.bfloat16)
    try:
        with torch.no_grad():
            ref = model(torch.tensor([ids], device="cuda")).logits[0].float().cpu().numpy()
    finally:
        hf.to("cpu", torch.float32)
    assert np.abs(ours - ref).max() < 0.05 * np.abs(ref).max()
    agree = float((ours.argmax(1) == ref.argmax(1)).mean())
    assert agree >= 0.9, f"top-1 agreement {agree:.3f}"  # 0.949 measured on the H200


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_graph_replay_matches_eager(untied, dtype):
    """Batch sizes that are graph buckets, so eager and replay run the same GEMM shapes."""
    ckpt, _ = untied
    eager = gpu_engine(ckpt, dtype=dtype, enforce_eager=True, max_num_seqs=32)
    graph = gpu_engine(ckpt, dtype=dtype, max_num_seqs=32)
    prompts = _prompts(graph, 32)
    assert_graphs_replay_eager(eager, graph, prompts, 24)
    # a prefix-cache hit replays too, with the same tokens
    [(hit, fin, cached)] = generate(graph, [prompts[7]], greedy(24))
    assert cached > 0 and fin.cached_tokens == cached
    assert hit == generate(eager, [prompts[7]], greedy(24))[0][0]


def test_fp8_kv_cache_keeps_greedy_in_graphs_and_prefix_hits(untied):
    """--kv-cache-dtype fp8: e4m3 pools in twice the blocks of bf16 for the same memory; graph-replayed steps
    give the eager engine's greedy tokens, batched, and a prefix hit its cold run's; logits stay near the bf16
    cache's (fp8 rounding moves them)."""
    ckpt, _ = untied
    eager = gpu_engine(ckpt, dtype="bfloat16", enforce_eager=True, kv_cache_dtype="fp8")
    graph = gpu_engine(ckpt, dtype="bfloat16", kv_cache_dtype="fp8")
    plain = gpu_engine(ckpt, dtype="bfloat16")
    assert graph.runner.pools.paged["kv"]["k"].dtype == np.uint8
    assert graph.blocks.num_blocks >= 2 * plain.blocks.num_blocks - 1
    prompts = _prompts(graph, 8)
    assert_graphs_replay_eager(eager, graph, prompts, 24)
    fresh = [int(t) for t in np.random.default_rng(9).integers(0, 151000, 40)]
    [(cold, _, cached0)] = generate(eager, [fresh], greedy(16))
    [(hit, fin, cached)] = generate(eager, [fresh], greedy(16))
    assert cached0 == 0
    assert cached > 0 and fin.cached_tokens == cached and hit == cold
    got, want = prompt_logits(graph, prompts[7]), prompt_logits(plain, prompts[7])
    assert 0 < np.abs(got - want).max() < 0.1 * np.abs(want).max()
    assert (got.argmax(1) == want.argmax(1)).mean() >= 0.8


def test_programmatic_dependent_launch_keeps_every_token(untied, monkeypatch):
    """Every kernel launched with PDL against none at all: the same greedy
    tokens, eager and in graphs, batched, and bit-identical logits (PDL changes when a kernel starts,
    never what it computes)."""
    from openinfer.plugin_api.cuda import pdl
    ckpt, _ = untied
    runs, launched, launch, suspended, suspend = {}, [], pdl.launch, [], pdl.suspended

    def spy(*a, **kw):   # cluster launches (the split-K GEMV) go through pdl.launch with PDL off too
        if kw.get("pdl_on", True):
            launched.append(a[0])
        launch(*a, **kw)
    monkeypatch.setattr(pdl, "launch", spy)
    monkeypatch.setattr(pdl, "suspended", lambda yes=True: suspended.append(yes) or suspend(yes))
    monkeypatch.setattr(pdl, "KERNELS", ("",))   # every kernel, not just the default's small ones
    for on in (False, True):
        monkeypatch.setattr(pdl, "ENABLED", on)
        eager = gpu_engine(ckpt, dtype="bfloat16", enforce_eager=True)
        graph = gpu_engine(ckpt, dtype="bfloat16")
        assert bool(launched) == on
        prompts = _prompts(graph, 6)
        runs[on] = ([t for t, _, _ in generate(eager, prompts, greedy(16))],
                    [t for t, _, _ in generate(graph, prompts, greedy(16))],
                    prompt_logits(eager, prompts[0]))
    assert runs[True][0] == runs[False][0] and runs[True][1] == runs[False][1]
    np.testing.assert_array_equal(runs[True][2], runs[False][2])
    # graphs of 16 rows (eager warm-up and capture) without PDL, those of 8, 4, 2 and 1 with it; per engine
    assert suspended == 2 * [True, True, False, False, False, False]


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_full_prompt_hit_is_one_graph_replay(untied, dtype, monkeypatch):
    """A prompt of whole blocks hits every block: the last token's block is copied on the device and
    the hit's first token comes from a one-token step that replays the decode graph, with the tokens
    of the eager engine's hit (and, in float32, of the cold run)."""
    ckpt, _ = untied
    eager = gpu_engine(ckpt, dtype=dtype, enforce_eager=True)
    graph = gpu_engine(ckpt, dtype=dtype)
    base = chat_prompt(graph)
    ids = (base + [int(t) for t in np.random.default_rng(5).integers(0, 151000, 64)])[:64]
    eager_cold, eager_hit = (generate(eager, [ids], greedy(16))[0][0] for _ in range(2))
    cold = generate(graph, [ids], greedy(16))[0][0]
    steps = []
    replay, forward = graph.runner.graphs.replay, graph.runner._forward
    monkeypatch.setattr(graph.runner.graphs, "replay", lambda *a: (steps.append("graph"), replay(*a))[1])
    monkeypatch.setattr(graph.runner, "_forward", lambda b: (steps.append("eager"), forward(b))[1])
    [(hit, fin, cached)] = generate(graph, [ids], greedy(16))
    assert cached == fin.cached_tokens == len(ids) - 1
    assert steps == ["graph"] * 16
    assert hit == eager_hit
    if dtype == "float32":
        assert hit == cold == eager_cold


def test_float32_batching_and_prefix_hits_keep_greedy(untied):
    ckpt, hf = untied
    eng = gpu_engine(ckpt, dtype="float32")
    prompts = _prompts(eng, 6)
    for p, (tokens, _, _) in zip(prompts, generate(eng, prompts, greedy(16))):
        assert tokens == hf_greedy(hf, p, 16)
    [(again, _, cached)] = generate(eng, [prompts[5]], greedy(16))
    assert cached > 0 and again == hf_greedy(hf, prompts[5], 16)


def test_non_greedy_rows_sample_beside_greedy_rows(untied):
    from openinfer.testing import SamplingParams
    ckpt, _ = untied
    eng = gpu_engine(ckpt, dtype="float32")
    prompts = _prompts(eng, 3)
    plain = greedy(8)
    logprob = greedy(8, logprobs=2)
    seeded = SamplingParams(max_tokens=8, temperature=0.8, seed=7, ignore_eos=True)
    out = generate(eng, prompts, [plain, logprob, seeded])
    assert out[1][0] == generate(eng, [prompts[1]], plain)[0][0]  # logprobs leave the greedy choice alone
    assert out[2][0] == generate(eng, [prompts[2]], seeded)[0][0]


def test_weights_upload_raw_bytes_and_fuse(bf16, untied):
    from openinfer.testing import Checkpoint, DummyWeights
    from openinfer.testing.cuda import CudaBackend
    be = CudaBackend(0, "bfloat16")
    names = [f"model.layers.0.self_attn.{p}_proj.weight" for p in "qkv"]
    for ckpt in (bf16[0], untied[0]):   # a bf16 checkpoint (bytes as is) and an f32 one (cast on the GPU)
        w = Checkpoint(ckpt)
        want = np.concatenate([w.get(n) for n in names]).astype(be._np_dtype(None))
        got = be.to_host(be.load(w, *names))
        np.testing.assert_array_equal(got.view(np.uint16), want.view(np.uint16))
    dummy = be.to_host(be.load(DummyWeights({"a": (64, 32), "n": (32,)}), "a")).astype(np.float32)
    assert dummy.shape == (64, 32) and 0.015 < dummy.std() < 0.025
    be.loaded()


def test_pipelined_decode_streams_match_serial(untied):
    """--pipelined-decode on the real graphs: step N+1 replays before step N's tokens reach the host
    (its ids copied on the device, N's tokens fetched by an async copy). Every stream's events equal
    the serial engine's: rows of different lengths, stop tokens mid-batch, an abort, a late arrival."""
    from openinfer.testing.pipelined import abort, pipelined_launches, run_script, submit
    ckpt, _ = untied
    serial = gpu_engine(ckpt, dtype="float32", pipelined_decode=False)
    prompts = _prompts(serial, 6)
    # the probe runs on an engine of its own: on `serial` it would leave prefix-cache hits the fresh
    # pipelined engine cannot have (Scheduled.cached_tokens would differ)
    probe = [t for t, _, _ in generate(gpu_engine(ckpt, dtype="float32"), prompts[:4], greedy(20))]
    script = {0: [submit(f"r{i}", p, greedy(8 + 4 * i, stop_token_ids=[probe[i][5 + i]]))
                  for i, p in enumerate(prompts[:4])] + [submit("long", prompts[4], greedy(40))],
              6: [abort("r3")],
              12: [submit("late", prompts[5], greedy(16))]}
    want = run_script(serial, script)
    piped = gpu_engine(ckpt, dtype="float32", pipelined_decode=True)
    launches = pipelined_launches(piped)
    assert run_script(piped, script) == want and len(launches) >= 10
    assert piped.blocks.reserved == 0 and not piped.scheduler.running


def test_mixed_steps_replay_their_decode_rows_beside_the_prompts(untied):
    """The real graphs: a mixed step's decode rows replay on the graphs' stream while its prompt runs eagerly on the
    step stream (whatever the rows read: model_runner.BESIDE_READ_RATIO 0); every stream's tokens equal those of the
    engine that runs each mixed step as one eager forward, prompts chunked and a logprobs row among the decode rows."""
    from openinfer.testing.graphs import beside_read_ratio
    from openinfer.testing.pipelined import run_script, submit
    eng = gpu_engine(untied[0], dtype="float32", max_num_batched_tokens=24)
    prompts = _prompts(eng, 8)
    script = {0: [submit(f"r{i}", p, greedy(16)) for i, p in enumerate(prompts[:3])],
              3: [submit("late", prompts[7], greedy(10))],
              5: [submit("scored", prompts[6], greedy(6, logprobs=2)), submit("last", prompts[5], greedy(4))]}
    with beside_read_ratio(float("inf")):
        want = run_script(eng, script)
    eng = gpu_engine(untied[0], dtype="float32", max_num_batched_tokens=24)
    beside, replay_beside = [], eng.runner.graphs.replay_beside
    eng.runner.graphs.replay_beside = lambda h, rest: beside.append(len(h.token_ids)) or replay_beside(h, rest)
    with beside_read_ratio(0.0):
        got = run_script(eng, script)
    assert len(beside) >= 3
    for rid, events in want.items():   # logprobs equal to float32 rounding across the two GEMM shapes
        assert [getattr(e, "token_ids", None) for e in got[rid]] == [getattr(e, "token_ids", None) for e in events], rid


def test_two_models_on_one_gpu_step_at_once(untied):
    """A multi-model host's engines on one GPU, each stepping in its own thread at the same time: every request's
    tokens equal those of an engine run alone (each backend's kernels keep their own cuBLAS handle, workspace and
    arrival counters: kernels/cuda/lanes.py)."""
    from openinfer.testing.engine import collect
    alone = gpu_engine(untied[0], dtype="float32")
    prompts = _prompts(alone, 8)
    want = [t for t, _, _ in generate(alone, prompts, greedy(24))]
    engines = [gpu_engine(untied[0], dtype="float32").start() for _ in range(2)]
    try:
        for _ in range(3):
            streams = [[e.submit(list(p), greedy(24)) for p in prompts] for e in engines]
            for per_engine in streams:
                assert [collect(s)[0] for s in per_engine] == want
    finally:
        for e in engines:
            e.shutdown()
