"""The glm52 TileLang kernels (cuda/tilelang_ops.py, sm_90 only) against the numpy references on random inputs,
at the batch layouts of the hand-written kernels' tests and at GLM-5.2 decode shapes (block size 64, top-2048), and
the tiny GLM model with them picked by name (`--kernel OP=tilelang`) against the CPU engine, eager and through CUDA
graphs. GPU only; skipped elsewhere."""
from __future__ import annotations

import numpy as np
import pytest

from openinfer.plugin_api import ForwardBatch
from openinfer.testing.cuda import kernel_stream, require_gpu
from openinfer.testing.engine import generate, greedy, logits_with_shared_choices
from openinfer_glm52 import ops as ref

from glm52_tiny import TINY
from test_glm52_cuda import BLOCKS, BS, LATENT, LAYERS, RUNS, SHARED, batches, exact, gpu_engine, long_prompt

pytestmark = pytest.mark.cuda
cp = require_gpu()
if cp.cuda.Device().compute_capability != "90":
    pytest.skip("the TileLang cubins are built for sm_90a", allow_module_level=True)
ml_dtypes = pytest.importorskip("ml_dtypes")

from openinfer_glm52.cuda import tilelang_ops  # noqa: E402  (imports cupy)

BF16 = np.dtype(ml_dtypes.bfloat16)
TOL = 2e-2
own_stream = pytest.fixture(autouse=True)(kernel_stream)
TILELANG = {op: "tilelang" for op in ("glm52_sparse_mla_attention", "glm52_indexer_topk")}
NVRTC = {op: "nvrtc" for op in TILELANG}


@pytest.fixture
def no_hand_written_fallback(monkeypatch):
    """The kernel cases have the TileLang kernels' shapes: a call handed to the hand-written kernels is a failure."""
    def refuse(*_):
        raise AssertionError("handed to the hand-written kernel")
    monkeypatch.setattr(tilelang_ops.nvrtc, "glm52_sparse_mla_attention", refuse)
    monkeypatch.setattr(tilelang_ops.nvrtc, "glm52_indexer_topk", refuse)


def decode_batches(lens: list[int], block_size: int, blocks: int):
    """(host, device) decode batches: one token a sequence at the end of its context, scattered blocks."""
    rng = np.random.default_rng(5)
    width = max(-(-L // block_size) for L in lens)
    tables = rng.permutation(blocks)[: len(lens) * width].astype(np.int32).reshape(len(lens), width)
    qs, lens_ = np.arange(len(lens) + 1, dtype=np.int32), np.asarray(lens, np.int32)
    pos = lens_ - 1
    slots = (tables[np.arange(len(lens)), pos // block_size] * block_size + pos % block_size).astype(np.int64)
    z = np.zeros(1, np.int32)
    fields = (z, pos, slots, tables, qs, lens_, z)
    host = ForwardBatch(*fields, qs, lens_, block_size, 1, int(lens_.max()))
    dev = ForwardBatch(*[cp.asarray(f) for f in fields], qs, lens_, block_size, 1, int(lens_.max()))
    return host, dev


def random_selection(rng, positions, topk: int) -> np.ndarray:
    """Sorted random picks among each token's visible keys and a few past it (ignored), -1 padded."""
    sel = np.full((len(positions), topk), -1, np.int32)
    for t, p in enumerate(positions):
        picks = rng.choice(p + 3, size=min(topk - 5, p + 3), replace=False)
        sel[t, :len(picks)] = np.sort(picks)
        sel[t, 0] = min(sel[t, 0], p)
    return sel


def check_sparse_mla(rng, host, dev, pool, layer, heads, topk):
    T = host.num_tokens
    ql, qp = exact(rng, (T, heads, 512), BF16, 0.1), exact(rng, (T, heads, 64), BF16, 0.1)
    sel = random_selection(rng, host.positions, topk)
    want = ref.glm52_sparse_mla_attention(ql, qp, pool[:, layer], sel, host, 0.06)
    got = tilelang_ops.glm52_sparse_mla_attention(cp.asarray(ql.astype(BF16)), cp.asarray(qp.astype(BF16)),
                                                  cp.asarray(pool.astype(BF16))[:, layer], cp.asarray(sel), dev, 0.06)
    np.testing.assert_allclose(cp.asnumpy(got).astype(np.float32), want, rtol=TOL, atol=TOL)


@pytest.mark.usefixtures("no_hand_written_fallback")
@pytest.mark.parametrize("heads, topk", [(64, 40), (20, 128), (128, 200)])
def test_sparse_mla_attention(heads, topk):
    """Prefill and decode runs; a partial head block (20), two head blocks (128), partial key tiles."""
    rng = np.random.default_rng(4)
    host, dev = batches(RUNS)
    check_sparse_mla(rng, host, dev, exact(rng, (BLOCKS, LAYERS, BS, 576), BF16), 2, heads, topk)


@pytest.mark.usefixtures("no_hand_written_fallback")
def test_sparse_mla_attention_at_decode_shapes():
    """GLM-5.2's decode: 64 heads, block size 64, top-2048, contexts shorter and longer than the selection."""
    rng = np.random.default_rng(6)
    lens, blocks = [1000, 2100, 5000], 256
    host, dev = decode_batches(lens, 64, blocks)
    check_sparse_mla(rng, host, dev, exact(rng, (blocks, 2, 64, 576), BF16), 1, 64, 2048)


def _rows_of(host: ForwardBatch, rows: list[int], extra: int = 0):
    """The device decode batch of `rows` of a host decode batch; with extra > 0, sequence rows[0]'s last extra + 1
    tokens as one prefill run instead (the last is its decode token)."""
    tables, lens = host.block_tables[rows], host.context_lens_host[rows].astype(np.int32)
    if extra:
        pos = np.arange(lens[0] - 1 - extra, lens[0], dtype=np.int32)
        qs = np.asarray([0, extra + 1], np.int32)
    else:
        pos, qs = lens - 1, np.arange(len(rows) + 1, dtype=np.int32)
    z = np.zeros(1, np.int32)
    fields = [cp.asarray(f) for f in (z, pos, np.zeros(len(pos), np.int64), tables, qs, lens, z)]
    return ForwardBatch(*fields, qs, lens, host.block_size, int(np.diff(qs).max()), int(lens.max()))


@pytest.mark.usefixtures("no_hand_written_fallback")
def test_sparse_mla_bits_do_not_depend_on_the_batch():
    """A token's attention is the same bits computed alone, in decode batches of 3 and 24 among other sequences, and
    as the last token of a prefill run: the split follows from the selection's width alone, so batching and chunking
    never move a greedy token."""
    rng = np.random.default_rng(12)
    lens = [int(x) for x in rng.integers(60, 3000, 24)]
    lens[:3] = [5, 2048, 2900]
    host, _ = decode_batches(lens, 64, 24 * 47)
    pool = cp.asarray(exact(rng, (24 * 47, 1, 64, 576), BF16).astype(BF16))[:, 0]
    n = len(lens)
    ql = cp.asarray(exact(rng, (n, 64, 512), BF16, 0.1).astype(BF16))
    qp = cp.asarray(exact(rng, (n, 64, 64), BF16, 0.1).astype(BF16))
    sel = cp.asarray(random_selection(rng, host.positions, 2048))

    def attend(rows, batch, q_latent=None, q_pe=None, selection=None):
        return cp.asnumpy(tilelang_ops.glm52_sparse_mla_attention(
            ql[rows] if q_latent is None else q_latent, qp[rows] if q_pe is None else q_pe, pool,
            sel[rows] if selection is None else selection, batch, 0.06))

    alone = [attend([i], _rows_of(host, [i]))[0] for i in range(n)]
    for size in (3, n):
        rows = [int(r) for r in rng.permutation(n)[:size]]
        got = attend(rows, _rows_of(host, rows))
        for j, r in enumerate(rows):
            np.testing.assert_array_equal(got[j], alone[r], err_msg=f"sequence {r}, decode batch of {size}")
    for i in (1, 2, 5):
        extra = min(7, lens[i] - 1)
        before = random_selection(rng, np.arange(lens[i] - 1 - extra, lens[i] - 1), 2048)
        q_latent = cp.concatenate([cp.asarray(exact(rng, (extra, 64, 512), BF16, 0.1).astype(BF16)), ql[i:i + 1]])
        q_pe = cp.concatenate([cp.asarray(exact(rng, (extra, 64, 64), BF16, 0.1).astype(BF16)), qp[i:i + 1]])
        got = attend(None, _rows_of(host, [i], extra), q_latent, q_pe, cp.concatenate([cp.asarray(before), sel[i:i + 1]]))
        np.testing.assert_array_equal(got[-1], alone[i], err_msg=f"sequence {i}, last token of a prefill run")


def run_indexer(rng, host, dev, cache, topk, op):
    """op's selection and the score rows it selected from, against the reference's."""
    T, Hi, Di = host.num_tokens, 32, 128
    q = exact(rng, (T, Hi, Di), BF16, 0.2)
    w = rng.standard_normal((T, Hi)).astype(np.float32)
    seen = {}
    scores_of = tilelang_ops._indexer_scores

    def spy(*args):
        seen["scores"] = scores_of(*args)
        return seen["scores"]

    tilelang_ops._indexer_scores = spy
    try:
        got = cp.asnumpy(op(cp.asarray(q.astype(BF16)), cp.asarray(w), cp.asarray(cache.astype(BF16)), dev, topk,
                            Di ** -0.5))
    finally:
        tilelang_ops._indexer_scores = scores_of
    rows = cp.asnumpy(seen["scores"])
    t = 0
    for i, L in enumerate(host.context_lens_host):
        n = int(host.query_start_host[i + 1] - host.query_start_host[i])
        keys = ref._sequence_keys(cache, host.block_tables[i], int(L))
        scores = ref.glm52_indexer_scores(q[t:t + n], w[t:t + n], keys, Di ** -0.5)
        for j in range(n):
            visible, row, s = int(L) - n + j + 1, rows[t + j], scores[j]
            tol = 1e-3 * np.abs(s[:visible]).max()
            np.testing.assert_allclose(row[:visible], s[:visible], rtol=1e-3, atol=tol)
            assert np.all(row[visible:] == -np.inf)
            want = ref.select_topk(s, visible, topk)
            picked = got[t + j][got[t + j] >= 0]
            assert len(picked) == min(visible, topk) and np.all(np.diff(picked) > 0)
            assert np.all(got[t + j][len(picked):] == -1)
            # keys the two selections disagree on score within rounding of the cut
            kth = np.sort(s[:visible])[::-1][min(visible, topk) - 1]
            differ = np.setxor1d(picked, want[want >= 0])
            assert np.all(np.abs(s[differ] - kth) <= tol), (t + j, differ)
        t += n


INDEXER_OPS = {"tilelang": tilelang_ops.glm52_indexer_topk,
               "tilelang+nvrtc": tilelang_ops.glm52_indexer_topk_nvrtc_select}


@pytest.mark.usefixtures("no_hand_written_fallback")
@pytest.mark.parametrize("impl", list(INDEXER_OPS))
def test_indexer_topk(impl):
    rng = np.random.default_rng(2)
    host, dev = batches(RUNS)
    run_indexer(rng, host, dev, exact(rng, (BLOCKS, BS, 128), BF16, 0.2), 24, INDEXER_OPS[impl])


@pytest.mark.usefixtures("no_hand_written_fallback")
@pytest.mark.parametrize("impl", list(INDEXER_OPS))
def test_indexer_topk_at_decode_shapes(impl):
    rng = np.random.default_rng(7)
    host, dev = decode_batches([1000, 2100, 5000], 64, 256)
    run_indexer(rng, host, dev, exact(rng, (256, 64, 128), BF16, 0.2), 2048, INDEXER_OPS[impl])


@pytest.mark.parametrize("kind", ["normal", "zeros of both signs", "few values"])
def test_topk_select_is_the_reference_selection(kind):
    """The TileLang select on given scores: exactly the reference's keys, ties at the cut to the earlier ones."""
    rng = np.random.default_rng(8)
    host, dev = decode_batches([5, 300, 2048, 2049, 3000, 9000], 64, 1024)
    width, topk = host.max_context_len, 2048
    s = rng.standard_normal((host.num_tokens, width)).astype(np.float32)
    if kind == "zeros of both signs":
        s = np.where(rng.random(s.shape) < 0.7, np.float32(0) * rng.choice([-1, 1], s.shape), s).astype(np.float32)
    elif kind == "few values":
        s = rng.integers(-3, 3, s.shape).astype(np.float32)
    got = cp.asnumpy(tilelang_ops.select_topk(cp.asarray(s), dev, cp.empty((host.num_tokens, topk), np.int32)))
    for t, p in enumerate(host.positions):
        np.testing.assert_array_equal(got[t], ref.select_topk(s[t], int(p) + 1, topk))


@pytest.fixture(scope="module")
def gpu_sparse32(tmp_path_factory, glm_tokenizer_dir):
    """The GPU tests' tiny model with GLM-5.x's 32 indexer heads, so both TileLang kernels run in it."""
    pytest.importorskip("torch")
    from openinfer.testing.hf_reference import build_hf_checkpoint
    out = tmp_path_factory.mktemp("glm-gpu-tilelang")
    build_hf_checkpoint(out, "glm_moe_dsa", {**TINY, **LATENT, "index_n_heads": 32}, tokenizer_dir=glm_tokenizer_dir,
                        save_dtype="bfloat16")
    return out


def test_model_with_tilelang_kernels_follows_the_hand_written_ones(gpu_sparse32):
    """The same model through both implementations: nearly the same selected keys and experts, and over the TileLang
    model's choices logits at bf16 tolerance, nearly every top-1 choice equal."""
    ours, theirs = gpu_engine(gpu_sparse32, kernels=TILELANG), gpu_engine(gpu_sparse32, kernels=NVRTC)
    ids = long_prompt(ours, 300, 7)
    a, b, agree = logits_with_shared_choices(ours, theirs, ids, SHARED)
    assert np.isfinite(a).all()
    assert min(agree.values()) >= 0.95, f"the two implementations' choices agree: {agree}"
    assert np.abs(a - b).max() < 0.05 * np.abs(b).max()
    assert float((a.argmax(1) == b.argmax(1)).mean()) >= 0.9


def test_model_with_tilelang_kernels_graph_replay_matches_eager(gpu_sparse32):
    eager, graph = gpu_engine(gpu_sparse32, kernels=TILELANG, enforce_eager=True), gpu_engine(gpu_sparse32,
                                                                                             kernels=TILELANG)
    assert graph.runner.graphs is not None
    prompts = [long_prompt(graph, 40 * i, i) for i in range(4)]
    for batch in ([prompts[3]], prompts):
        want = [t for t, _, _ in generate(eager, batch, greedy(16))]
        assert [t for t, _, _ in generate(graph, batch, greedy(16))] == want, f"batch of {len(batch)}"
