"""The glm52 DSA CUDA kernels against their numpy references, and a tiny GLM model (sparse attention, full and
shared indexer layers) on the GPU against the CPU engine, eager and through CUDA graphs (GPU only; skipped
elsewhere). The model tests also need the core MLA and MoE ops on "cuda" (mla_rope, mla_write_latent,
mla_attention, per_head_linear, router_logits, moe_router, moe_experts; bf16 only): without them the engine refuses
to load, naming the missing ops. Kernel cases round the inputs to bf16 first, so both sides see the same data."""
from __future__ import annotations

import numpy as np
import pytest

from openinfer.plugin_api import ForwardBatch, RopeConfig, cos_sin
from openinfer.testing.cuda import kernel_stream, require_gpu
from openinfer.testing.engine import generate, greedy, logits_with_shared_choices
from openinfer_glm52 import ops as ref

from glm52_tiny import TINY
from test_glm52_fidelity import chat_prompt, engine_for

pytestmark = pytest.mark.cuda
cp = require_gpu()
ml_dtypes = pytest.importorskip("ml_dtypes")

from openinfer_glm52.cuda import ops  # noqa: E402  (imports cupy)

BF16 = np.dtype(ml_dtypes.bfloat16)
own_stream = pytest.fixture(autouse=True)(kernel_stream)
DTYPES = {"bfloat16": (BF16, 2e-2), "float32": (np.dtype(np.float32), 1e-5)}
BS, BLOCKS, LAYERS = 16, 96, 3
RUNS = [(0, 37), (5, 1), (300, 1), (64, 20), (1, 1)]   # (keys before the run, run length): prefill and decode
GPU = dict(device="cuda", dtype="bfloat16", kv_cache_memory_gib=0.25, max_num_seqs=8)
SHARED = ("glm52_indexer_topk", "moe_router")   # the discontinuous choices two engines' logits are compared over


@pytest.fixture(params=list(DTYPES))
def dt(request):
    return DTYPES[request.param]


def exact(rng, shape, dtype, scale=1.0) -> np.ndarray:
    """Random float32 values that dtype holds exactly."""
    return (scale * rng.standard_normal(shape)).astype(np.float32).astype(dtype).astype(np.float32)


def batches(runs):
    """(host batch, device batch) with scattered blocks."""
    rng = np.random.default_rng(1)
    qs = np.concatenate([[0], np.cumsum([n for _, n in runs])]).astype(np.int32)
    lens = np.asarray([p + n for p, n in runs], dtype=np.int32)
    width = max(-(-L // BS) for L in lens)
    tables = rng.permutation(BLOCKS)[: len(runs) * width].astype(np.int32).reshape(len(runs), width)
    pos = np.concatenate([np.arange(p, p + n) for p, n in runs]).astype(np.int32)
    seq = np.repeat(np.arange(len(runs)), [n for _, n in runs])
    slots = (tables[seq, pos // BS] * BS + pos % BS).astype(np.int64)
    z = np.zeros(1, np.int32)
    fields = (z, pos, slots, tables, qs, lens, z)
    host = ForwardBatch(*fields, qs, lens, BS, max(n for _, n in runs), int(lens.max()))
    dev = ForwardBatch(*[cp.asarray(f) for f in fields], qs, lens, BS, max(n for _, n in runs), int(lens.max()))
    return host, dev


@pytest.mark.parametrize("interleave", [True, False])
def test_indexer_rope_write(dt, interleave):
    dtype, tol = dt
    rng = np.random.default_rng(0)
    host, dev = batches(RUNS)
    T, Hi, Di, P = host.num_tokens, 32, 128, 64
    cos, sin = cos_sin(RopeConfig(8e6, P), 512)
    q, k = exact(rng, (T, Hi, Di), dtype), exact(rng, (T, Di), dtype)
    w, b = exact(rng, Di, dtype), exact(rng, Di, dtype)
    pool = np.zeros((BLOCKS, LAYERS, BS, Di), np.float32)
    want_q = ref.glm52_indexer_rope_write(q, k, w, b, host.positions, cos, sin, pool[:, 1], host.slot_mapping,
                                          interleave)
    dpool = cp.zeros(pool.shape, dtype)
    got_q = ops.glm52_indexer_rope_write(cp.asarray(q.astype(dtype)), cp.asarray(k.astype(dtype)),
                                         cp.asarray(w.astype(dtype)), cp.asarray(b.astype(dtype)), dev.positions,
                                         cp.asarray(cos), cp.asarray(sin), dpool[:, 1], dev.slot_mapping, interleave)
    np.testing.assert_allclose(cp.asnumpy(got_q).astype(np.float32), want_q, rtol=tol, atol=tol)
    np.testing.assert_allclose(cp.asnumpy(dpool).astype(np.float32), pool, rtol=tol, atol=tol)


def test_indexer_topk(dt):
    """Rows whose k-th and (k+1)-th scores differ by more than the kernels' rounding select the same keys."""
    dtype, tol = dt
    rng = np.random.default_rng(2)
    host, dev = batches(RUNS)
    T, Hi, Di, topk = host.num_tokens, 32, 128, 24
    q = exact(rng, (T, Hi, Di), dtype, 0.2)
    w = rng.standard_normal((T, Hi)).astype(np.float32)
    cache = exact(rng, (BLOCKS, BS, Di), dtype, 0.2)
    want = ref.glm52_indexer_topk(q, w, cache, host, topk, Di ** -0.5)
    got = cp.asnumpy(ops.glm52_indexer_topk(cp.asarray(q.astype(dtype)), cp.asarray(w), cp.asarray(cache.astype(dtype)),
                                            dev, topk, Di ** -0.5))
    t, compared = 0, 0
    for i, (p, n) in enumerate(RUNS):
        keys = ref._sequence_keys(cache, host.block_tables[i], p + n)
        scores = ref.glm52_indexer_scores(q[t:t + n], w[t:t + n], keys, Di ** -0.5)
        for j in range(n):
            visible = p + j + 1
            s = np.sort(scores[j, :visible])[::-1]
            if visible <= topk or s[topk - 1] - s[topk] > 1e-3 * max(1.0, abs(s[0])):
                np.testing.assert_array_equal(got[t + j], want[t + j])
                compared += 1
        t += n
    assert compared > T // 2


def test_indexer_topk_ties_go_to_the_earliest_keys(dt):
    """Zero weights make every score exactly 0 (of either sign): the selection is the first topk keys."""
    dtype, _ = dt
    host, dev = batches(RUNS)
    T, Hi, Di, topk = host.num_tokens, 16, 64, 8
    q = cp.asarray(np.random.default_rng(3).standard_normal((T, Hi, Di)).astype(dtype))
    w = cp.asarray(np.where(np.arange(Hi) % 2, -0.0, 0.0).astype(np.float32)[None].repeat(T, 0))
    got = cp.asnumpy(ops.glm52_indexer_topk(q, w, cp.zeros((BLOCKS, BS, Di), dtype), dev, topk, 0.1))
    for t, p in enumerate(host.positions):
        want = [i if i <= p else -1 for i in range(topk)]
        assert got[t].tolist() == want


SELECT_RUNS = [(4, 1), (2047, 1), (2048, 1), (2999, 1), (9000, 1), (131071, 1), (3000, 40)]   # a 128k row among them


def select_inputs(rng, runs, kind: str):
    """(scores [T, width] float32 on the host, device batch, each token's visible keys) for the select alone (its
    block tables are never read). Scores past a token's visible keys are NaN: the select must not read them."""
    qs = np.concatenate([[0], np.cumsum([n for _, n in runs])]).astype(np.int32)
    lens = np.asarray([p + n for p, n in runs], np.int32)
    visible = np.concatenate([np.arange(p, p + n) for p, n in runs]) + 1
    T, width = int(qs[-1]), int(lens.max())
    s = rng.standard_normal((T, width)).astype(np.float32)
    if kind == "zeros of both signs":   # the ReLU's exact ties
        s = np.where(rng.random(s.shape) < 0.7, np.float32(0) * rng.choice([-1, 1], s.shape), s).astype(np.float32)
    elif kind == "few values":          # ties across whole rows, the cut inside them
        s = rng.integers(-3, 3, s.shape).astype(np.float32)
    s[np.arange(width)[None] >= visible[:, None]] = np.nan
    tables, z = np.zeros((len(runs), -(-width // BS)), np.int32), np.zeros(1, np.int32)
    dev = ForwardBatch(*[cp.asarray(f) for f in (z, visible - 1, z, tables, qs, lens, z)], qs, lens, BS,
                       max(n for _, n in runs), width)
    return s, dev, visible


@pytest.mark.parametrize("ranks", [None, 1, 3, 8])
@pytest.mark.parametrize("kind", ["normal", "zeros of both signs", "few values"])
def test_select_topk_is_the_reference_selection(monkeypatch, ranks, kind):
    """The select on given scores, a row on one CTA or split over a cluster (None: the launcher's pick, 2 CTAs on an
    H100 here): exactly the reference's keys in its order, ties at the cut to the earlier ones, for decode rows of
    different lengths and a prefill run. One CTA's segment of the 128k-wide batch is too long for shared memory
    (every pass reads the row); 3 and 8 ranks' segments are staged there."""
    if ranks is not None:
        monkeypatch.setattr(ops, "select_ranks", lambda *_: ranks)
    rng = np.random.default_rng(8)
    topk = 2048
    s, dev, visible = select_inputs(rng, SELECT_RUNS, kind)
    got = cp.asnumpy(ops.select_topk(cp.asarray(s), dev, cp.empty((len(visible), topk), np.int32)))
    for t, v in enumerate(visible):
        np.testing.assert_array_equal(got[t], ref.select_topk(s[t], int(v), topk), err_msg=f"token {t}")


def test_select_topk_replays_in_a_cuda_graph():
    """Captured once with its grid fixed by the shapes, the select follows new scores and contexts on replay."""
    rng = np.random.default_rng(9)
    runs, topk = [(131071, 1), (5000, 1), (100, 1)], 2048
    s, dev, _ = select_inputs(rng, runs, "normal")
    scores, out = cp.asarray(s), cp.empty((len(runs), topk), np.int32)
    stream = cp.cuda.Stream(non_blocking=True)
    with stream:
        ops.select_topk(scores, dev, out)   # compile and load outside the capture
        stream.begin_capture()
        ops.select_topk(scores, dev, out)
        graph = stream.end_capture()
        for new_runs in ([(70000, 1), (131071, 1), (2047, 1)], [(3, 1), (9999, 1), (131071, 1)]):
            s, new, visible = select_inputs(rng, new_runs, "few values")
            scores.set(s)
            dev.context_lens[...] = new.context_lens
            graph.launch(stream)
            stream.synchronize()
            got = cp.asnumpy(out)
            for t, v in enumerate(visible):
                np.testing.assert_array_equal(got[t], ref.select_topk(s[t], int(v), topk), err_msg=f"token {t}")


def test_sparse_mla_attention(dt):
    dtype, tol = dt
    rng = np.random.default_rng(4)
    host, dev = batches(RUNS)
    T, H, R, P, topk = host.num_tokens, 20, 512, 64, 40   # 20 heads: a partial head group
    ql, qp = exact(rng, (T, H, R), dtype, 0.1), exact(rng, (T, H, P), dtype, 0.1)
    pool = exact(rng, (BLOCKS, LAYERS, BS, R + P), dtype)
    sel = np.full((T, topk), -1, np.int32)
    for t, p in enumerate(host.positions):   # a random selection, some entries past the token (ignored), -1 padded
        picks = rng.choice(p + 3, size=min(topk - 5, p + 3), replace=False)
        sel[t, :len(picks)] = np.sort(picks)
        sel[t, 0] = min(sel[t, 0], p)        # at least one visible key
    want = ref.glm52_sparse_mla_attention(ql, qp, pool[:, 2], sel, host, 0.06)
    got = ops.glm52_sparse_mla_attention(cp.asarray(ql.astype(dtype)), cp.asarray(qp.astype(dtype)),
                                         cp.asarray(pool.astype(dtype))[:, 2], cp.asarray(sel), dev, 0.06)
    np.testing.assert_allclose(cp.asnumpy(got).astype(np.float32), want, rtol=tol, atol=tol)


LATENT = dict(kv_lora_rank=512, qk_rope_head_dim=64, qk_nope_head_dim=32, v_head_dim=32, index_head_dim=128,
              index_topk=64)


@pytest.fixture(scope="module")
def gpu_sparse(tmp_path_factory, glm_tokenizer_dir):
    """The tiny model with the real latent widths (the CUDA MLA ops take kv_lora_rank 512 + qk_rope_head_dim 64),
    in bf16 as the checkpoints are; index_topk 64, so the long prompts below are sparse."""
    pytest.importorskip("torch")
    from openinfer.testing.hf_reference import build_hf_checkpoint
    out = tmp_path_factory.mktemp("glm-gpu")
    return out, build_hf_checkpoint(out, "glm_moe_dsa", {**TINY, **LATENT}, tokenizer_dir=glm_tokenizer_dir,
                                    save_dtype="bfloat16")


def gpu_engine(ckpt, **kw):
    return engine_for(ckpt, **{**GPU, **kw})


def long_prompt(eng, n: int, seed: int) -> list[int]:
    return chat_prompt(eng) + [int(t) for t in np.random.default_rng(seed).integers(20, 700, n)]


def test_bfloat16_logits_follow_the_cpu_engine(gpu_sparse):
    """bf16 rounds every activation where the CPU engine computes in float32 (on the same bf16 weights): nearly
    the same selected keys and experts, and over the GPU's selections and routing (a key or expert moved across a
    cut is no rounding error: testing.engine.logits_with_shared_choices) logits at bf16 tolerance and the
    teacher-forced top-1 choice at nearly every position."""
    ckpt, _ = gpu_sparse
    gpu, cpu = gpu_engine(ckpt), engine_for(ckpt)
    ids = long_prompt(gpu, 300, 7)
    ours, ref, agree = logits_with_shared_choices(gpu, cpu, ids, SHARED)
    assert np.isfinite(ours).all()
    assert min(agree.values()) >= 0.95, f"the GPU's choices agree with the CPU's: {agree}"
    assert np.abs(ours - ref).max() < 0.05 * np.abs(ref).max()
    assert float((ours.argmax(1) == ref.argmax(1)).mean()) >= 0.9


def test_decode_follows_the_cpu_engine(gpu_sparse):
    """The GPU's greedy decode against the same sequence teacher-forced on the CPU engine (over the GPU's
    selections and routing, as above)."""
    ckpt, _ = gpu_sparse
    gpu, cpu = gpu_engine(ckpt), engine_for(ckpt)
    ids = long_prompt(gpu, 200, 3)
    [(tokens, _, _)] = generate(gpu, [ids], greedy(24))
    full = ids + tokens
    ours, ref, agree = logits_with_shared_choices(gpu, cpu, full, SHARED)
    ours, ref = ours[len(ids) - 1:], ref[len(ids) - 1:]
    assert min(agree.values()) >= 0.95, f"the GPU's choices agree with the CPU's: {agree}"
    assert np.abs(ours - ref).max() < 0.05 * np.abs(ref).max()
    assert float((ours[:-1].argmax(1) == np.array(tokens)).mean()) >= 0.9


def test_graph_replay_matches_eager(gpu_sparse):
    """Batch sizes that are graph buckets, so eager and replay run the same shapes: the same greedy tokens."""
    ckpt, _ = gpu_sparse
    eager, graph = gpu_engine(ckpt, enforce_eager=True), gpu_engine(ckpt)
    assert graph.runner.graphs is not None and eager.runner.graphs is None
    prompts = [long_prompt(graph, 40 * i, i) for i in range(4)]
    for batch in ([prompts[3]], prompts[:2], prompts):
        want = [t for t, _, _ in generate(eager, batch, greedy(16))]
        assert [t for t, _, _ in generate(graph, batch, greedy(16))] == want, f"batch of {len(batch)}"
