"""Every qwen35_* CUDA op against its numpy reference on random inputs (GPU only; skipped elsewhere),
at tiny and Qwen3.5-4B shapes, on varlen batches mixing fresh and continuing runs over stale state
rows, with the strided views the model passes (slices of the fused projections, a layer's slice
of the state pool). bf16 cases round the inputs to bf16 first, so both sides see the same data."""
from __future__ import annotations

import numpy as np
import pytest

from openinfer.plugin_api import ForwardBatch
from openinfer.testing.cuda import kernel_stream, require_gpu
from openinfer_qwen35 import ops as ref

pytestmark = pytest.mark.cuda
cp = require_gpu()
ml_dtypes = pytest.importorskip("ml_dtypes")

from openinfer_qwen35.cuda import ops  # noqa: E402  (imports cupy-dependent modules)

BF16 = np.dtype(ml_dtypes.bfloat16)
own_stream = pytest.fixture(autouse=True)(kernel_stream)
DTYPES = {"bfloat16": (BF16, 2e-2, 2e-2), "float32": (np.dtype(np.float32), 1e-5, 1e-4)}
# (nk, nv, dk, dv, conv channels): the tiny test model and Qwen3.5-4B
SHAPES = {"tiny": (2, 4, 16, 16, 2 * 2 * 16 + 4 * 16), "4b": (16, 32, 128, 128, 2 * 16 * 128 + 32 * 128)}
# (tokens before the run, run length) per sequence: around the 64-token chunk, fresh and continuing
PREFILL_RUNS = [(0, 1), (5, 63), (0, 64), (100, 65), (0, 300), (9, 0), (40, 129)]
DECODE_RUNS = [(0, 1), (7, 1), (300, 1), (1, 1), (64, 1)]
LAYERS, ROWS, K = 2, 9, 4


@pytest.fixture(params=list(DTYPES))
def dt(request):
    return DTYPES[request.param]


def rnd(rng, *shape, scale=1.0):
    return (scale * rng.standard_normal(shape)).astype(np.float32)


def exact(x: np.ndarray, dtype) -> np.ndarray:
    return x.astype(dtype).astype(np.float32)


def host(x) -> np.ndarray:
    return cp.asnumpy(x).astype(np.float32)


def close(got, want, dt, scale=1.0):
    _, atol, rtol = dt
    np.testing.assert_allclose(host(got), want, atol=atol * scale, rtol=rtol)


def batches(runs, rng) -> tuple[ForwardBatch, ForwardBatch]:
    """The host batch for the reference and its device twin (every per-sequence array on the GPU)."""
    qs = np.concatenate([[0], np.cumsum([n for _, n in runs])]).astype(np.int32)
    lens = np.array([p + n for p, n in runs], np.int32)
    slots = rng.permutation(ROWS)[:len(runs)].astype(np.int32)
    z = np.zeros(1, np.int32)
    meta = dict(query_start_host=qs, context_lens_host=lens, block_size=16,
                max_query_len=int(np.diff(qs).max()), max_context_len=int(lens.max()))
    hb = ForwardBatch(z, z, z, z, qs, lens, z, **meta, state_slots=slots)
    db = ForwardBatch(*(cp.asarray(a) for a in (z, z, z, z, qs, lens, z)), **meta, state_slots=cp.asarray(slots))
    return hb, db


def states(rng, *shape) -> tuple[np.ndarray, "cp.ndarray"]:
    """Stale random state rows [ROWS, LAYERS, *shape] (fresh runs must ignore them): the ops get
    layer 1's strided view; returns the reference's copy of it and the device pool."""
    pool = rnd(rng, ROWS, LAYERS, *shape)
    return pool[:, 1].copy(), cp.asarray(pool)


def check_pool(pool_d, want: np.ndarray, layer0: np.ndarray, tol: float = 0.0) -> None:
    """Layer 1 of the device pool holds the reference's states; layer 0 is untouched."""
    np.testing.assert_allclose(host(pool_d[:, 1]), want, atol=tol, rtol=tol * 10)
    np.testing.assert_array_equal(host(pool_d[:, 0]), layer0)


@pytest.mark.parametrize("shape", list(SHAPES))
def test_causal_conv1d_prefill_then_update(dt, shape):
    rng = np.random.default_rng(1)
    C = SHAPES[shape][4]
    w = exact(rnd(rng, C, K, scale=0.5), dt[0])
    state, pool = states(rng, K - 1, C)
    layer0 = host(pool[:, 0])
    for runs, op in ((PREFILL_RUNS, "qwen35_causal_conv1d"), (DECODE_RUNS, "qwen35_causal_conv1d_update")):
        hb, db = batches(runs, rng)
        T = int(hb.query_start_host[-1])
        wide = exact(rnd(rng, T, C + 24), dt[0])         # x is a slice of the fused in_proj output
        want = getattr(ref, op)(wide[:, 8:8 + C], w, state, hb)
        got = getattr(ops, op)(cp.asarray(wide.astype(dt[0]))[:, 8:8 + C], cp.asarray(w.astype(dt[0])),
                               pool[:, 1], db)
        assert got.dtype == dt[0]
        close(got, want, dt)
        check_pool(pool, state, layer0)   # the rows are copies of inputs: exact


def test_gdn_gating(dt):
    rng = np.random.default_rng(2)
    T, nv = 37, 32
    ab = exact(rnd(rng, T, 2 * nv + 5, scale=3), dt[0])
    A_log, dt_bias = np.log(rng.uniform(0.5, 20, nv)).astype(np.float32), rnd(rng, nv)
    want = ref.qwen35_gdn_gating(ab[:, :nv], ab[:, nv + 5:], A_log, dt_bias)
    abd = cp.asarray(ab.astype(dt[0]))
    got = ops.qwen35_gdn_gating(abd[:, :nv], abd[:, nv + 5:], cp.asarray(A_log), cp.asarray(dt_bias))
    for g, w in zip(got, want):
        assert g.dtype == np.float32
        np.testing.assert_allclose(host(g), w, rtol=1e-5, atol=1e-6)


def gdn_inputs(rng, T: int, shape: str, dtype):
    """q, k, v as head views of a conv-output-like [T, C] buffer (host, device) and g, beta."""
    nk, nv, dk, dv, C = SHAPES[shape]
    mixed = exact(rnd(rng, T, C), dtype)
    g, beta = ref.qwen35_gdn_gating(rnd(rng, T, nv), rnd(rng, T, nv),
                                    np.log(rng.uniform(0.02, 0.1, nv)).astype(np.float32), rnd(rng, nv))

    def split(m):
        return (m[:, :nk * dk].reshape(T, nk, dk), m[:, nk * dk:2 * nk * dk].reshape(T, nk, dk),
                m[:, 2 * nk * dk:].reshape(T, nv, dv))
    return split(mixed), split(cp.asarray(mixed.astype(dtype))), (g, beta), (cp.asarray(g), cp.asarray(beta))


@pytest.mark.parametrize("shape", list(SHAPES))
@pytest.mark.parametrize("decode", [False, True], ids=["chunked_prefill", "decode"])
def test_gated_delta_rule(dt, shape, decode):
    rng = np.random.default_rng(3)
    nk, nv, dk, dv, _ = SHAPES[shape]
    runs = DECODE_RUNS if decode else PREFILL_RUNS
    hb, db = batches(runs, rng)
    host_in, dev_in, gb, gb_d = gdn_inputs(rng, int(hb.query_start_host[-1]), shape, dt[0])
    state, pool = states(rng, nv, dk, dv)
    layer0 = host(pool[:, 0])
    op = "qwen35_gated_delta_rule_update" if decode else "qwen35_gated_delta_rule"
    want = getattr(ref, op)(*host_in, *gb, state, hb)
    got = getattr(ops, op)(*dev_in, *gb_d, pool[:, 1], db)
    assert got.dtype == dt[0] and got.shape == want.shape
    close(got, want, dt, scale=2)
    check_pool(pool, state, layer0, 1e-4)   # same inputs on both sides, fp32 math: tight for bf16 too


@pytest.mark.parametrize("shape", list(SHAPES))
def test_gdn_decode_computes_its_gating_bit_for_bit(dt, shape):
    """qwen35_gdn_decode (the gating inside the decode step) against qwen35_gdn_gating then the update kernel: the
    same output and state bits, from a and b as strided slices of an in_proj-like row."""
    rng = np.random.default_rng(6)
    nk, nv, dk, dv, _ = SHAPES[shape]
    hb, db = batches(DECODE_RUNS, rng)
    B = len(DECODE_RUNS)
    _, dev_in, _, _ = gdn_inputs(rng, B, shape, dt[0])
    ab = cp.asarray(exact(rnd(rng, B, 2 * nv + 5), dt[0]).astype(dt[0]))   # [b | 5 others | a]
    a, b = ab[:, nv + 5:], ab[:, :nv]
    A_log = cp.asarray(np.log(rng.uniform(0.02, 0.1, nv)).astype(np.float32))
    dt_bias = cp.asarray(rnd(rng, nv))
    _, pool = states(rng, nv, dk, dv)
    pool2 = pool.copy()
    g, beta = ops.qwen35_gdn_gating(a, b, A_log, dt_bias)
    want = ops.qwen35_gated_delta_rule_update(*dev_in, g, beta, pool[:, 1], db)
    got = ops.qwen35_gdn_decode(*dev_in, a, b, A_log, dt_bias, pool2[:, 1], db)
    np.testing.assert_array_equal(host(got), host(want))
    np.testing.assert_array_equal(cp.asnumpy(pool2), cp.asnumpy(pool))


# (nk, nv, dk, dv) of the folded decode step: the tiny model (one column tile: no cluster), Qwen3.5-4B (clusters of
# 4), heads of 80 values (3 tiles, the last one part-filled) and of 256 (clusters of 8, the most)
FOLD_SHAPES = {"tiny": (2, 4, 16, 16), "4b": (16, 32, 128, 128), "dv80": (2, 6, 64, 80), "dv256": (1, 2, 128, 256)}
# B = 1, a live row and a fresh one (no state before it: a graph's padding rows are such rows), and B = 3 with one
FOLD_RUNS = {"b1": [(9, 1)], "b1_fresh": [(0, 1)], "b3": [(7, 1), (0, 1), (300, 1)]}


def fold_host(rng, B: int, shape: str, dtype) -> dict[str, np.ndarray]:
    """Host buffers of the folded step's inputs (bf16 cases rounded first): a conv-output-like [B, C] row
    (q | k | v), an in_proj-like one [b | 5 others | a], the fused projection's z part with 16 columns before it,
    w, A_log and dt_bias."""
    nk, nv, dk, dv = FOLD_SHAPES[shape]
    return dict(mixed=exact(rnd(rng, B, 2 * nk * dk + nv * dv), dtype).astype(dtype),
                ab=exact(rnd(rng, B, 2 * nv + 5), dtype).astype(dtype),
                zw=exact(rnd(rng, B, nv * dv + 16), dtype).astype(dtype), w=exact(rnd(rng, dv), dtype).astype(dtype),
                A_log=np.log(rng.uniform(0.02, 0.1, nv)).astype(np.float32), dt_bias=rnd(rng, nv))


def fold_inputs(rng, B: int, shape: str, dtype) -> tuple:
    """Device buffers of `fold_host`, the op's views of them ((q, k, v, a, b, A_log, dt_bias), z, w: strided as the
    model passes them) and a stale state pool [ROWS, LAYERS, nv, dk, dv]."""
    nk, nv, dk, dv = FOLD_SHAPES[shape]
    bufs = {name: cp.asarray(a) for name, a in fold_host(rng, B, shape, dtype).items()}
    m, ab = bufs["mixed"], bufs["ab"]
    gdn_in = (m[:, :nk * dk].reshape(B, nk, dk), m[:, nk * dk:2 * nk * dk].reshape(B, nk, dk),
              m[:, 2 * nk * dk:].reshape(B, nv, dv), ab[:, nv + 5:], ab[:, :nv], bufs["A_log"], bufs["dt_bias"])
    _, pool = states(rng, nv, dk, dv)
    return bufs, gdn_in, bufs["zw"][:, 16:].reshape(B, nv, dv), bufs["w"], pool


def require_clusters() -> None:
    from openinfer_qwen35.cuda import delta_rule
    if not delta_rule.norm_fold_applies(128):
        pytest.skip("no thread-block clusters (sm_90+): qwen35_gdn_decode_norm runs the two launches")


@pytest.mark.parametrize("runs", list(FOLD_RUNS))
@pytest.mark.parametrize("shape", list(FOLD_SHAPES))
def test_gdn_decode_norm_folds_the_output_norm_bit_for_bit(dt, shape, runs):
    """qwen35_gdn_decode_norm (gdn_decode_gated_norm: the gated RMSNorm inside the decode step, a head's column
    tiles as one cluster) against qwen35_gdn_decode then qwen35_gated_rms_norm: the same output and state bits."""
    require_clusters()
    rng = np.random.default_rng(8)
    _, db = batches(FOLD_RUNS[runs], rng)
    _, gdn_in, z, w, pool = fold_inputs(rng, len(FOLD_RUNS[runs]), shape, dt[0])
    pool2 = pool.copy()
    want = ops.qwen35_gated_rms_norm(ops.qwen35_gdn_decode(*gdn_in, pool[:, 1], db), z, w, 1e-6)
    got = ops.qwen35_gdn_decode_norm(*gdn_in, pool2[:, 1], db, z, w, 1e-6)
    assert got.dtype == dt[0] and got.shape == want.shape
    assert np.isfinite(host(got)).all()
    np.testing.assert_array_equal(host(got), host(want))
    np.testing.assert_array_equal(cp.asnumpy(pool2), cp.asnumpy(pool))


@pytest.mark.parametrize("shape", ["4b", "dv80"])
def test_gdn_decode_norm_replays_in_a_cuda_graph(dt, shape):
    """The fold captured once replays right after the batch's index arrays and the inputs change in place, with the
    bits of the two launches run eagerly on a copy of the state before the replay."""
    require_clusters()
    rng = np.random.default_rng(9)
    B = 3
    bufs, gdn_in, z, w, pool = fold_inputs(rng, B, shape, dt[0])
    _, db = batches([(3, 1)] * B, rng)
    stream = cp.cuda.Stream(non_blocking=True)

    def fold():
        return ops.qwen35_gdn_decode_norm(*gdn_in, pool[:, 1], db, z, w, 1e-6)

    with stream:
        fold()                                       # compile and load outside the capture
        stream.begin_capture()
        out = fold()
        graph = stream.end_capture()
        for runs in ([(0, 1), (5, 1), (90, 1)], [(12, 1), (1, 1), (0, 1)]):
            _, new = batches(runs, rng)
            for field in ("query_start", "context_lens", "state_slots"):
                getattr(db, field)[...] = getattr(new, field)
            for name, a in fold_host(rng, B, shape, dt[0]).items():   # in place: the views the graph reads
                bufs[name].set(a)
            before = pool.copy()
            graph.launch(stream)
            want = ops.qwen35_gated_rms_norm(ops.qwen35_gdn_decode(*gdn_in, before[:, 1], db), z, w, 1e-6)
            stream.synchronize()
            np.testing.assert_array_equal(host(out), host(want))
            np.testing.assert_array_equal(cp.asnumpy(pool), cp.asnumpy(before))


def test_gated_delta_rule_long_runs(dt):
    """A 1024-token prompt (16 chunks, the prefill the kernels are tuned for) beside a continuing
    run: the state carried through many chunks stays as close to the recurrence."""
    rng = np.random.default_rng(5)
    _, nv, dk, dv, _ = SHAPES["4b"]
    hb, db = batches([(0, 1024), (200, 300)], rng)
    host_in, dev_in, gb, gb_d = gdn_inputs(rng, int(hb.query_start_host[-1]), "4b", dt[0])
    state, pool = states(rng, nv, dk, dv)
    layer0 = host(pool[:, 0])
    want = ref.qwen35_gated_delta_rule(*host_in, *gb, state, hb)
    close(ops.qwen35_gated_delta_rule(*dev_in, *gb_d, pool[:, 1], db), want, dt, scale=2)
    check_pool(pool, state, layer0, 1e-4)


def test_chunked_prefill_then_decode_equals_one_run(dt):
    """One sequence as two prefill chunks (the second continuing the state), then decode steps."""
    rng = np.random.default_rng(4)
    (q, k, v), (qd, kd, vd), (g, beta), (gd, bd) = gdn_inputs(rng, 150, "4b", dt[0])
    nk, nv, dk, dv, _ = SHAPES["4b"]
    state = np.zeros((ROWS, nv, dk, dv), np.float32)
    hb, _ = batches([(0, 150)], np.random.default_rng(0))   # seed 0: the same slot at every step
    want = ref.qwen35_gated_delta_rule(q, k, v, g, beta, state, hb)
    pool = cp.zeros((ROWS, LAYERS, nv, dk, dv), cp.float32)
    got, done = [], 0
    for n in (70, 77, 1, 1, 1):
        _, db = batches([(done, n)], np.random.default_rng(0))
        s = slice(done, done + n)
        op = ops.qwen35_gated_delta_rule_update if n == 1 else ops.qwen35_gated_delta_rule
        got.append(op(qd[s], kd[s], vd[s], gd[s], bd[s], pool[:, 1], db))
        done += n
    close(cp.concatenate(got), want, dt, scale=2)
    np.testing.assert_allclose(host(pool[:, 1]), state, atol=1e-4, rtol=1e-3)


# prefill runs saving their state part-way (kv/hybrid.py), to rows no run uses: the 1024-token
# prompt's last full block (1008: off the 64-token chunk grid), others on it, 1 and 2 tokens in
# (the conv window reaches into the old row), and a run without one
CHECKPOINT_RUNS, CHECKPOINT_LENS = [(0, 1024), (200, 300), (0, 70), (7, 2), (16, 3)], [1008, 128, 16, 1, 0]


def with_checkpoints(hb: ForwardBatch, db: ForwardBatch, lens: list[int]) -> None:
    """Run i saves after lens[i] tokens (0: none) into a row no run of the batch holds."""
    lens = np.asarray(lens, np.int32)
    rows = np.zeros(len(lens), np.int32)
    rows[lens > 0] = np.setdiff1d(np.arange(ROWS), np.asarray(hb.state_slots))[:int((lens > 0).sum())]
    hb.checkpoint_lens, hb.checkpoint_rows = lens, rows
    db.checkpoint_lens, db.checkpoint_rows = cp.asarray(lens), cp.asarray(rows)


def test_prefill_ops_save_checkpoints_part_way(dt):
    """The conv and the chunked delta rule also write each checkpoint row (conv window and state
    as of its token) as the reference does, outputs and slot rows unchanged by the split grid."""
    rng = np.random.default_rng(6)
    nk, nv, dk, dv, C = SHAPES["4b"]
    hb, db = batches(CHECKPOINT_RUNS, rng)
    with_checkpoints(hb, db, CHECKPOINT_LENS)
    T = int(hb.query_start_host[-1])
    w = exact(rnd(rng, C, K, scale=0.5), dt[0])
    conv_state, conv_pool = states(rng, K - 1, C)
    x = exact(rnd(rng, T, C), dt[0])
    close(ops.qwen35_causal_conv1d(cp.asarray(x.astype(dt[0])), cp.asarray(w.astype(dt[0])), conv_pool[:, 1], db),
          ref.qwen35_causal_conv1d(x, w, conv_state, hb), dt)
    np.testing.assert_array_equal(host(conv_pool[:, 1]), conv_state)
    host_in, dev_in, gb, gb_d = gdn_inputs(rng, T, "4b", dt[0])
    state, pool = states(rng, nv, dk, dv)
    layer0 = host(pool[:, 0])
    want = ref.qwen35_gated_delta_rule(*host_in, *gb, state, hb)
    close(ops.qwen35_gated_delta_rule(*dev_in, *gb_d, pool[:, 1], db), want, dt, scale=2)
    check_pool(pool, state, layer0, 1e-4)


def test_gated_rms_norm(dt):
    rng = np.random.default_rng(5)
    T, nv, dv = 11, 32, 128
    x = exact(rnd(rng, T, nv, dv), dt[0])
    zw = exact(rnd(rng, T, nv * dv + 16), dt[0])          # z is a slice of the fused projection
    w = exact(rnd(rng, dv), dt[0])
    want = ref.qwen35_gated_rms_norm(x, zw[:, 16:].reshape(T, nv, dv), w, 1e-6)
    zd = cp.asarray(zw.astype(dt[0]))[:, 16:].reshape(T, nv, dv)
    got = ops.qwen35_gated_rms_norm(cp.asarray(x.astype(dt[0])), zd, cp.asarray(w.astype(dt[0])), 1e-6)
    close(got, want, dt, scale=5)


def test_sigmoid_gate(dt):
    rng = np.random.default_rng(6)
    T, n = 9, 16 * 256
    x = exact(rnd(rng, T, n), dt[0])
    wide = exact(rnd(rng, T, 2 * n, scale=3), dt[0])        # the gate is the last columns of qkvg
    want = ref.qwen35_sigmoid_gate(x, wide[:, n:])
    got = ops.qwen35_sigmoid_gate(cp.asarray(x.astype(dt[0])), cp.asarray(wide.astype(dt[0]))[:, n:])
    close(got, want, dt)


def test_decode_ops_replay_in_a_cuda_graph(dt):
    """The one-token ops read slots, context_lens and query_start on the device: a graph captured
    once replays right after those arrays and the inputs change in place."""
    rng = np.random.default_rng(7)
    nk, nv, dk, dv, C = SHAPES["tiny"]
    B = 4
    x_d = cp.zeros((B, C), dt[0])
    w = exact(rnd(rng, C, K), dt[0])
    w_d = cp.asarray(w.astype(dt[0]))
    conv_pool = cp.asarray(rnd(rng, ROWS, LAYERS, K - 1, C))
    ssm_pool = cp.asarray(rnd(rng, ROWS, LAYERS, nv, dk, dv))
    gd, bd = cp.zeros((B, nv), cp.float32), cp.zeros((B, nv), cp.float32)
    hb, db = batches([(3, 1)] * B, rng)
    stream = cp.cuda.Stream(non_blocking=True)

    def step():
        conv = ops.qwen35_causal_conv1d_update(x_d, w_d, conv_pool[:, 1], db)
        q, k = conv[:, :nk * dk].reshape(B, nk, dk), conv[:, nk * dk:2 * nk * dk].reshape(B, nk, dk)
        o = ops.qwen35_gated_delta_rule_update(q, k, conv[:, 2 * nk * dk:].reshape(B, nv, dv), gd, bd,
                                               ssm_pool[:, 1], db)
        return conv, o

    layer0 = host(conv_pool[:, 0]), host(ssm_pool[:, 0])
    with stream:
        step()                                       # compile and load outside the capture
        stream.begin_capture()
        conv_out, o_out = step()
        graph = stream.end_capture()
        for runs in ([(0, 1), (5, 1), (1, 1), (90, 1)], [(12, 1), (0, 1), (0, 1), (2, 1)]):
            hb, new = batches(runs, rng)
            for field in ("query_start", "context_lens", "state_slots"):
                getattr(db, field)[...] = getattr(new, field)
            x = exact(rnd(rng, B, C), dt[0])
            g, beta = ref.qwen35_gdn_gating(rnd(rng, B, nv), rnd(rng, B, nv),
                                            np.log(rng.uniform(0.02, 0.1, nv)).astype(np.float32), rnd(rng, nv))
            x_d[...], gd[...], bd[...] = cp.asarray(x.astype(dt[0])), cp.asarray(g), cp.asarray(beta)
            conv_state, ssm_state = host(conv_pool[:, 1]), host(ssm_pool[:, 1])
            graph.launch(stream)
            stream.synchronize()
            conv = ref.qwen35_causal_conv1d_update(x, w, conv_state, hb)
            close(conv_out, conv, dt)
            c = host(conv_out)                       # what the delta rule read (bf16 rounding may differ)
            want = ref.qwen35_gated_delta_rule_update(
                c[:, :nk * dk].reshape(B, nk, dk), c[:, nk * dk:2 * nk * dk].reshape(B, nk, dk),
                c[:, 2 * nk * dk:].reshape(B, nv, dv), g, beta, ssm_state, hb)
            close(o_out, want, dt, scale=5)
            check_pool(conv_pool, conv_state, layer0[0])
            check_pool(ssm_pool, ssm_state, layer0[1], 1e-4)
