"""The device sampler in numpy: the same arithmetic, step for step, and the same Philox stream,
so a GPU test can demand identical tokens (kernels/cuda/sample_rows.cu documents the kernels).

Per row: x = float32 logits with the edits applied (batch.py); logprobs are
log_softmax(x), the processed distribution before temperature and filters, as the host sampler
reports them. temperature 0 takes argmax(x). Otherwise y = x / T and e = exp(y - max y) (exp in
float64, rounded to float32); the candidates are ordered by (e descending, index ascending),
top-k and top-p keep a prefix of that order (top-p on the fixed-point masses q = trunc(e * 2^40),
which the device sums exactly in integers), min-p keeps e >= min_p, and the token is the
exponential race argmax(e_j / E_j) over the kept tokens, E_j = -log(u_j) with u_j from Philox:
a draw from the kept distribution that needs no sort and no prefix sum.
"""
from __future__ import annotations

import numpy as np

from .philox import uniform_words
from .batch import (EDIT_BEGIN, EDIT_END, KEY_HI, KEY_LO, LOGPROBS, MIN_P, STEP, STREAM_HI, STREAM_LO,
                    TEMPERATURE, TOP_K, TOP_P, SamplingBatch)

MASS_SCALE = np.float32(2.0 ** 40)   # fixed-point unit of the top-p masses: e <= 1, so q < 2^40
NO_LIMIT = np.uint64(0xFFFFFFFFFFFFFFFF)


def edit(x: np.float32, rep: np.float32, sub: np.float32, bias: np.float32) -> np.float32:
    if rep != 1:
        x = x / rep if x > 0 else x * rep
    return (x - sub) + bias


def processed(logits: np.ndarray, edits: np.ndarray) -> np.ndarray:
    """One row's float32 logits with its edits [n, 4] applied."""
    x = logits.astype(np.float32, copy=True)
    f = edits.view(np.float32)
    for i in range(len(edits)):
        t = edits[i, 0]
        x[t] = edit(x[t], f[i, 1], f[i, 2], f[i, 3])
    return x


def masses(x: np.ndarray, temperature: np.float32) -> tuple[np.ndarray, np.ndarray]:
    """(e, q): exp(y - max y) as float32 and its fixed-point mass, y = x / T."""
    y = x / temperature
    d = y - np.float32(x.max()) / temperature
    e = np.exp(d.astype(np.float64)).astype(np.float32)
    return e, (e * MASS_SCALE).astype(np.uint64)


def mass_limit(top_p: np.float32, total: np.uint64) -> np.uint64:
    """Top-p keeps a token while the mass ranked before it is below this (no limit at top_p 1)."""
    return NO_LIMIT if top_p >= 1 else np.uint64(np.float64(top_p) * np.float64(total))


def kept(e: np.ndarray, q: np.ndarray, top_k: int, top_p: np.float32, min_p: np.float32) -> np.ndarray:
    """The tokens top-k, top-p and min-p keep: a prefix of the (e desc, index asc) order."""
    order = np.argsort(~e.view(np.uint32), kind="stable")
    mass = q[order]
    before = np.cumsum(mass) - mass
    n = min(top_k, int(np.count_nonzero(before < mass_limit(top_p, mass.sum()))))
    keep = np.zeros(len(e), bool)
    keep[order[:n]] = True
    return keep & (e >= min_p) if min_p > 0 else keep


def exponentials(n: int, key: tuple[int, int], step: int, stream: tuple[int, int]) -> np.ndarray:
    """E_j = -log(u_j), u_j = (word >> 9 + 1/2) / 2^23 in (0, 1): float64 log, rounded to float32."""
    u = ((uniform_words(n, key, step, stream) >> 9).astype(np.float64) + 0.5) * 2.0 ** -23
    return (-np.log(u)).astype(np.float32)


def top_logprobs(x: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    logp = log_softmax(x)
    idx = np.lexsort((np.arange(len(x)), -logp))[:k]
    return logp[idx], idx


def log_softmax(x: np.ndarray) -> np.ndarray:
    m = x.max()
    return (x - m) - np.log(np.exp(x - m).sum())


def sample(logits: np.ndarray, batch: SamplingBatch) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(tokens [S], chosen logprobs [S] (nan where not asked), top values [S, k], top ids [S, k])
    for the rows of [S, V] logits (row i of `logits` is batch row i)."""
    S, V = logits.shape
    k = max(batch.top_k, 1)
    tokens, lps = np.zeros(S, np.int64), np.full(S, np.nan, np.float32)
    top_v, top_i = np.zeros((S, k), np.float32), np.zeros((S, k), np.int32)
    P, temp, top_p, min_p = batch.params, batch.field(TEMPERATURE), batch.field(TOP_P), batch.field(MIN_P)
    u = P.view(np.uint32)
    for r in range(S):
        x = processed(logits[r], batch.edits[P[r, EDIT_BEGIN]: P[r, EDIT_END]])
        if temp[r] == 0:
            tokens[r] = int(np.argmax(x))
        else:
            e, q = masses(x, temp[r])
            ok = kept(e, q, int(P[r, TOP_K]), top_p[r], min_p[r]) & (e > 0)
            E = exponentials(V, (int(u[r, KEY_LO]), int(u[r, KEY_HI])), int(u[r, STEP]),
                             (int(u[r, STREAM_LO]), int(u[r, STREAM_HI])))
            tokens[r] = int(np.argmax(np.where(ok, e / E, np.float32(-1))))
        if P[r, LOGPROBS] >= 0:
            lps[r] = log_softmax(x)[tokens[r]]
            top_v[r], top_i[r] = top_logprobs(x, k)
    return tokens, lps, top_v, top_i
