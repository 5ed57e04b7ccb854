"""The numpy reference of the device sampler (sampling/reference.py) against the host sampler's
semantics: the same processed logits and logprobs, the same filtered support and probabilities,
a race draw that follows them, and the radix cut of the kernel (emulated) equal to the sorted one.
The draws themselves differ from the host sampler's: a seed reproduces per backend."""
from __future__ import annotations

import numpy as np
import pytest

from openinfer.sampling import reference as ref
from openinfer.sampling.philox import split64
from openinfer.sampling.sampler import SamplingParams, draw, kept_distribution, processed_logits, sample_row
from openinfer.sampling.batch import SampleRow, build_batch, to_results

V = 600


def host_distribution(x: np.ndarray, p: SamplingParams, prompt, out, blocked) -> dict[int, float]:
    """token -> probability of the host sampler's kept distribution (what sample_row draws from)."""
    ids, weights = kept_distribution(processed_logits(x, p, prompt, out, blocked) / p.temperature, p)
    ids = np.arange(len(weights)) if ids is None else ids
    return {int(ids[i]): float(weights[i] / weights.sum(dtype=np.float64)) for i in np.flatnonzero(weights)}


def row(p: SamplingParams, prompt=(), out=(), blocked=frozenset(), seed: int = 0) -> SampleRow:
    return SampleRow(p, list(prompt), list(out), blocked, split64(seed), (0, 0))


def reference_distribution(x: np.ndarray, p: SamplingParams, prompt, out, blocked) -> dict[int, float]:
    b = build_batch([row(p, prompt, out, blocked)], V)
    xp = ref.processed(x, b.edits)
    e, q = ref.masses(xp, np.float32(p.temperature))
    top_k = p.top_k if 0 < p.top_k < V else V
    keep = ref.kept(e, q, top_k, np.float32(p.top_p), np.float32(p.min_p)) & (e > 0)
    probs = np.where(keep, e.astype(np.float64), 0.0)
    probs /= probs.sum()
    return {int(t): float(probs[t]) for t in np.flatnonzero(probs)}


CASES = [
    dict(temperature=1.0),
    dict(temperature=0.7, top_k=20),
    dict(temperature=1.3, top_p=0.8),
    dict(temperature=0.9, min_p=0.05),
    dict(temperature=1.0, top_k=50, top_p=0.9, min_p=0.01),
    dict(temperature=0.5, repetition_penalty=1.3, presence_penalty=0.5, frequency_penalty=0.4,
         logit_bias={3: 5.0, 7: -100.0}, top_p=0.95),
    dict(temperature=20.0, top_p=0.97),   # nearly flat: top-p needs most of the vocabulary
    dict(temperature=1.0, top_k=V - 1, min_p=0.2),
]


@pytest.mark.parametrize("kw", CASES)
def test_filtered_distribution_matches_host(kw):
    rng = np.random.default_rng(len(str(kw)))
    x = (3 * rng.standard_normal(V)).astype(np.float32)
    prompt, out = rng.integers(0, V, 40).tolist(), rng.integers(0, V, 12).tolist()
    blocked = {int(np.argmax(x)), 5}
    p = SamplingParams(**kw)
    want = host_distribution(x, p, prompt, out, blocked)
    got = reference_distribution(x, p, prompt, out, blocked)
    assert set(got) == set(want)
    np.testing.assert_allclose([got[t] for t in want], list(want.values()), rtol=2e-4, atol=1e-7)


def test_processed_logits_and_logprobs_match_host():
    rng = np.random.default_rng(1)
    x = (2 * rng.standard_normal(V)).astype(np.float32)
    prompt, out = rng.integers(0, V, 30).tolist(), [4, 4, 9, 4]
    p = SamplingParams(temperature=0.0, repetition_penalty=1.7, presence_penalty=-0.5, frequency_penalty=1.5,
                       logit_bias={1: 2.5, 9: -3.0}, logprobs=V)
    host = sample_row(x, p, np.random.default_rng(0), prompt, out, {2, 8})
    host_logp = np.empty(V, np.float32)
    for t, lp in host.top:
        host_logp[t] = lp
    b = build_batch([row(p, prompt, out, {2, 8})], V)
    xp = ref.processed(x, b.edits)
    assert np.isneginf(xp[[2, 8]]).all()
    np.testing.assert_allclose(ref.log_softmax(xp), host_logp, rtol=1e-5, atol=1e-5)
    tokens, lps, top_v, top_i = ref.sample(x[None], b)
    assert tokens[0] == host.token
    [res] = to_results(b, tokens, lps, top_v, top_i)
    assert res.token == host.token and abs(res.logprob - host.logprob) < 1e-5
    assert [t for t, _ in res.top[:20]] == [t for t, _ in host.top[:20]]


def test_host_draw_is_the_inverse_cdf():
    """draw() against a float64 running sum, at the ends, at block edges and over zero weights."""
    rng = np.random.default_rng(3)
    w = rng.random(5000).astype(np.float32)
    w[rng.random(5000) < 0.5] = 0
    w[1024:2048] = 0                                  # a whole block without weight
    w[-1], w[0] = 0, 0
    cdf = np.cumsum(w, dtype=np.float64)
    positive = np.flatnonzero(w)
    for u in [0.0, 1 - 1e-12, *cdf[[1023, 1024, 2047, 2048, 3000]] / cdf[-1], *rng.random(200)]:
        want = int(np.searchsorted(cdf, u * cdf[-1], side="right"))
        got = draw(w, float(u))
        assert w[got] > 0 and (got == want or (want not in positive and got == positive[positive < want][-1]))
    assert draw(w, 0.0) == positive[0] and draw(w, 1 - 1e-12) == positive[-1]
    assert draw(np.array([0, 0, 2.0], np.float32), 0.99) == 2


def test_race_follows_the_kept_distribution():
    """Frequencies of the Philox race over 20000 steps against the probabilities (5 sigma)."""
    x = np.array([2.0, 1.5, 1.0, 0.2, -1.0, -3.0, 0.9, 1.4], np.float32)
    e, q = ref.masses(x, np.float32(0.8))
    keep = ref.kept(e, q, 5, np.float32(0.97), np.float32(0.0))
    probs = np.where(keep, e, 0) / np.where(keep, e, 0).sum()
    steps = 20000
    counts = np.zeros(len(x))
    for s in range(steps):
        E = ref.exponentials(len(x), split64(11), s, (0, 0))
        counts[np.argmax(np.where(keep, e / E, -1))] += 1
    sigma = np.sqrt(steps * probs * (1 - probs)) + 1
    assert (np.abs(counts - steps * probs) < 5 * sigma).all()
    assert counts[~keep].sum() == 0


def radix_cut(e: np.ndarray, top_k: int, limit: np.uint64) -> tuple[int, int]:
    """The kernel's radix_cut (sample_rows.cu) step for step: 8-bit passes over rank keys."""
    keys = ~e.view(np.uint32)
    q = (e * ref.MASS_SCALE).astype(np.uint64)
    prefix, before, mass_before = 0, 0, 0
    for shift in (24, 16, 8, 0):
        mask = 0 if shift == 24 else (0xFFFFFFFF << (shift + 8)) & 0xFFFFFFFF
        sel = (keys & np.uint32(mask)) == prefix
        bins = (keys[sel] >> np.uint32(shift)) & np.uint32(255)
        count = np.bincount(bins, minlength=256)
        mass = np.zeros(256, np.uint64)
        np.add.at(mass, bins, q[sel])
        b = 0
        while b < 255 and not (before + count[b] >= top_k or mass_before + int(mass[b]) >= int(limit)):
            before, mass_before = before + int(count[b]), mass_before + int(mass[b])
            b += 1
        prefix |= b << shift
        ties = int(count[b])
    keep = top_k - before
    qv = int((np.array([~np.uint32(prefix)], np.uint32).view(np.float32) * ref.MASS_SCALE).astype(np.uint64)[0])
    if limit != ref.NO_LIMIT and qv:
        keep = min(keep, (int(limit) - mass_before + qv - 1) // qv)
    index = len(e)
    if keep < ties:
        index = int(np.flatnonzero(keys == np.uint32(prefix))[keep - 1])
    return prefix, index


@pytest.mark.parametrize("case", range(18))
def test_radix_cut_equals_the_sorted_prefix(case):
    rng = np.random.default_rng(case)
    n = int(rng.integers(50, 3000))
    x = rng.standard_normal(n).astype(np.float32) * float(rng.choice([0.5, 3, 40]))
    if case % 3 == 1:   # bf16 logits: many exact ties
        x = (x.view(np.uint32) & np.uint32(0xFFFF0000)).view(np.float32)
    if case % 3 == 2:   # a few values only: the cut falls inside a tie
        x = rng.integers(-4, 4, n).astype(np.float32)
    e, q = ref.masses(x, np.float32(rng.choice([0.3, 1.0, 1.7])))
    top_k = int(rng.choice([1, 2, 7, n // 3, n]))
    top_p = np.float32(rng.choice([0.1, 0.5, 0.9, 0.999, 1.0]))
    limit = ref.mass_limit(top_p, q.sum())
    key, index = radix_cut(e, top_k, limit)
    keys = ~e.view(np.uint32)
    got = (keys < key) | ((keys == key) & (np.arange(n) <= index))
    np.testing.assert_array_equal(got, ref.kept(e, q, top_k, top_p, np.float32(0)))


def test_seeded_rows_ignore_the_batch_and_top_k_1_is_greedy():
    rng = np.random.default_rng(5)
    x = rng.standard_normal((3, V)).astype(np.float32)
    a = row(SamplingParams(temperature=1.0, seed=42), out=[1, 2, 3])
    others = [row(SamplingParams(temperature=0.8, top_p=0.9), seed=7), row(SamplingParams(temperature=0.0))]
    alone = ref.sample(x[:1], build_batch([a], V))[0]
    mixed = ref.sample(x[[1, 2, 0]], build_batch([*others, a], V))[0]
    assert alone[0] == mixed[2]
    again = ref.sample(x[:1], build_batch([row(SamplingParams(temperature=1.0, seed=42), out=[9, 9, 9])], V))[0]
    steps = [ref.sample(x[:1], build_batch([row(SamplingParams(temperature=1.0, seed=42), out=[0] * s)], V))[0][0]
             for s in range(8)]
    assert again[0] == alone[0] and len(set(steps)) > 1   # same step, same draw; other steps vary
    top1 = ref.sample(x, build_batch([row(SamplingParams(temperature=1.5, top_k=1), seed=s) for s in range(3)], V))[0]
    np.testing.assert_array_equal(top1, x.argmax(axis=1))
