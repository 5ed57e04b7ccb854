"""The device sampler (sample_rows.cu) against its numpy reference, kernel by kernel, then whole:
identical tokens on random logits (GPU only; skipped elsewhere)."""
from __future__ import annotations

import numpy as np
import pytest

from openinfer.sampling import reference as ref
from openinfer.sampling.philox import split64
from openinfer.sampling.sampler import SamplingParams
from openinfer.sampling.batch import (EDIT_BEGIN, EDIT_END, LOGPROBS, ROW, TEMPERATURE, SampleRow, SamplingBatch,
                                      build_batch)
from openinfer.testing.cuda import kernel_stream, require_gpu

pytestmark = pytest.mark.cuda
cp = require_gpu()
ml_dtypes = pytest.importorskip("ml_dtypes")
own_stream = pytest.fixture(autouse=True)(kernel_stream)

from openinfer.kernels.cuda import sampler  # noqa: E402  (imports cupy-dependent modules)
from openinfer.kernels.cuda.module import launch, suffix  # noqa: E402

V = 151936
DTYPES = [np.dtype(ml_dtypes.bfloat16), np.dtype(np.float32)]
PARAMS = [
    dict(temperature=0.0, repetition_penalty=1.3, frequency_penalty=0.5, logprobs=5),
    dict(temperature=1.0),
    dict(temperature=0.7, top_k=50, logprobs=0),
    dict(temperature=1.2, top_p=0.9),
    dict(temperature=0.9, min_p=0.1, presence_penalty=1.0),
    dict(temperature=1.0, top_k=200, top_p=0.8, min_p=0.02, logit_bias={17: 8.0, 99: -100.0}, logprobs=3),
    dict(temperature=0.3, top_p=0.5, repetition_penalty=0.8, min_tokens=4),
    dict(temperature=1.5, top_k=1),
]


def make_batch(rng, kinds: list[dict], spare_rows: int = 3) -> SamplingBatch:
    rows = []
    for i, kw in enumerate(kinds):
        out = rng.integers(0, V, int(rng.integers(0, 30))).tolist()
        blocked = {151643, 151645} if len(out) < kw.get("min_tokens", 0) else frozenset()
        seeded = i % 2 == 0
        rows.append(SampleRow(SamplingParams(**kw), rng.integers(0, V, 50).tolist(), out, blocked,
                              split64(int(rng.integers(-2**40, 2**40))) if seeded else (12345, 678),
                              (0, 0) if seeded else (i + 1, 0)))
    batch = build_batch(rows, V)
    batch.params[:, ROW] = rng.permutation(len(rows) + spare_rows)[: len(rows)]  # rows of a wider logits array
    return batch


def logits_for(rng, batch: SamplingBatch, dtype, scale: float = 4.0) -> np.ndarray:
    x = (scale * rng.standard_normal((len(batch) + 3, V))).astype(np.float32)
    return x.astype(dtype).astype(np.float32)   # what the kernels read, in float32


def edits_of(batch: SamplingBatch, r: int) -> np.ndarray:
    return batch.edits[batch.params[r, EDIT_BEGIN]: batch.params[r, EDIT_END]]


def device_inputs(batch: SamplingBatch):
    edits = batch.edits if len(batch.edits) else np.zeros((1, 4), np.int32)
    return cp.asarray(batch.params), cp.asarray(edits)


def run(logits: np.ndarray, batch: SamplingBatch, dtype):
    params, edits = device_inputs(batch)
    top_rows = np.flatnonzero(batch.params[:, LOGPROBS] > 0)
    out, values, ids = sampler.sample(cp.asarray(logits.astype(dtype)), params, edits, batch.top_k, top_rows)
    out = cp.asnumpy(out)
    return out[0], out[1].view(np.float32), values, ids, top_rows


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_gather_and_edits(dtype):
    rng = np.random.default_rng(0)
    batch = make_batch(rng, PARAMS)
    logits = logits_for(rng, batch, dtype)
    x = cp.asarray(logits.astype(dtype))
    params, edits = device_inputs(batch)
    S = len(batch)
    work = cp.empty((S, V), cp.float32)
    launch("sample_rows", f"sampling_rows_{suffix(x.dtype)}", (32, S), 256, (x, np.int64(V), params, np.int32(V), work))
    launch("sample_rows", "apply_edits", (S,), 128, (work, np.int32(V), params, edits))
    got = cp.asnumpy(work)
    for r in range(S):
        np.testing.assert_array_equal(got[r], ref.processed(logits[batch.params[r, ROW]], edits_of(batch, r)))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_tokens_and_logprobs_match_the_reference(dtype):
    rng = np.random.default_rng(1)
    for trial in range(3):
        batch = make_batch(rng, PARAMS)
        logits = logits_for(rng, batch, dtype, scale=[1.0, 4.0, 12.0][trial])
        tokens, lps, values, ids, top_rows = run(logits, batch, dtype)
        want_t, want_lp, want_v, want_i = ref.sample(logits[batch.params[:, ROW]], batch)
        np.testing.assert_array_equal(tokens, want_t)
        asked = batch.params[:, LOGPROBS] >= 0
        np.testing.assert_allclose(lps[asked], want_lp[asked], atol=1e-4, rtol=1e-5)
        k = batch.top_k
        np.testing.assert_array_equal(cp.asnumpy(ids), want_i[top_rows, :k])
        np.testing.assert_allclose(cp.asnumpy(values), want_v[top_rows, :k], atol=1e-4, rtol=1e-5)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_cut_inside_ties(dtype):
    """A few distinct logits: the top-k / top-p prefix ends inside a run of equal values."""
    rng = np.random.default_rng(2)
    kinds = [dict(temperature=1.0, top_k=k) for k in (3, 1000, 50000)] + \
            [dict(temperature=0.8, top_p=p) for p in (0.05, 0.3, 0.9)]
    batch = make_batch(rng, kinds)   # no penalties: no edits
    logits = rng.integers(-6, 3, (len(batch) + 3, V)).astype(np.float32)
    tokens, *_ = run(logits, batch, dtype)
    np.testing.assert_array_equal(tokens, ref.sample(logits[batch.params[:, ROW]], batch)[0])


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_probabilities_left_in_the_work_rows(dtype):
    rng = np.random.default_rng(3)
    batch = make_batch(rng, PARAMS[1:4])
    logits = logits_for(rng, batch, dtype)
    params, edits = device_inputs(batch)
    S = len(batch)
    x = cp.asarray(logits.astype(dtype))
    work, out = cp.empty((S, V), cp.float32), cp.empty((2, S), cp.int32)
    launch("sample_rows", f"sampling_rows_{suffix(x.dtype)}", (32, S), 256, (x, np.int64(V), params, np.int32(V), work))
    launch("sample_rows", "apply_edits", (S,), 128, (work, np.int32(V), params, edits))
    launch("sample_rows", f"sample_rows_{suffix(x.dtype)}", (S,), 512,
           (work, np.int32(V), x, np.int64(V), params, edits, out[0], out[1]))
    got = cp.asnumpy(work)
    for r in range(S):
        xp = ref.processed(logits[batch.params[r, ROW]], edits_of(batch, r))
        e, _ = ref.masses(xp, batch.field(TEMPERATURE)[r])
        np.testing.assert_allclose(got[r], e, rtol=1e-6, atol=0)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_a_seeded_row_ignores_its_batch(dtype):
    rng = np.random.default_rng(4)
    seeded = SampleRow(SamplingParams(temperature=1.0, top_p=0.9, seed=7), [1, 2], [3], frozenset(), split64(7), (0, 0))
    others = [SampleRow(SamplingParams(**kw), [], [], frozenset(), (1, 2), (3, 0)) for kw in PARAMS[1:4]]
    logits = (4 * rng.standard_normal((4, V))).astype(dtype).astype(np.float32)
    alone = build_batch([seeded], V)
    alone.params[:, ROW] = 3
    crowd = build_batch([*others, seeded], V)
    crowd.params[:, ROW] = np.arange(4)
    assert run(logits, alone, dtype)[0][0] == run(logits, crowd, dtype)[0][3]


def test_flat_logits_draw_the_largest_philox_word():
    """Equal logits: the race picks the smallest E_j, the largest word >> 9 of the Philox stream,
    so the device generator and its stream layout are checked without the reference's race."""
    from openinfer.sampling.philox import uniform_words
    n = 1001   # not a multiple of 4: the last group is partial
    rows = [SampleRow(SamplingParams(temperature=1.0), [], [0] * step, frozenset(), split64(seed), (stream, 0))
            for seed, step, stream in ((0, 0, 0), (1, 5, 0), (-3, 7, 9), (2**63 + 5, 123456, 2**31))]
    batch = build_batch(rows, n)
    tokens = run(np.zeros((len(rows), n), np.float32), batch, np.float32)[0]
    for r, tok in zip(rows, tokens):
        words = uniform_words(n, r.key, len(r.output_ids), r.stream) >> 9
        assert tok == int(np.argmax(words))
