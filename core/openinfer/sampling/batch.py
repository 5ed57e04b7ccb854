"""The device sampler's inputs, packed on the host: one int32 row of parameters per sampled row
and a ragged list of logit edits, so a step uploads two arrays and reads back token ids.

Edits fold every sparse change of the host sampler (sampler.py) into one formula per token:
x -> (x > 0 ? x / rep : x * rep) - sub + bias, with rep the repetition penalty of a seen token
(prompt or output), sub = frequency * count + presence for an output token, bias the logit_bias,
and -inf for a blocked token (eos and stop ids while min_tokens is unmet).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .sampler import SampleResult, SamplingParams

# columns of SamplingBatch.params (floats stored as their bits)
(ROW, LOGPROBS, TEMPERATURE, TOP_P, MIN_P, TOP_K, KEY_LO, KEY_HI, STREAM_LO, STREAM_HI, STEP,
 EDIT_BEGIN, EDIT_END) = range(13)
NUM_FIELDS = 16
FLOAT_FIELDS = (TEMPERATURE, TOP_P, MIN_P)


@dataclass
class SampleRow:
    """One row to sample: its request's parameters and history, and its Philox key and stream."""
    params: SamplingParams
    prompt_ids: list[int] | np.ndarray   # or the prompt's unique ids (all the edits need)
    output_ids: list[int]
    blocked: frozenset[int] | set[int]
    key: tuple[int, int]          # seeded: the seed's low 64 bits; else the engine's key
    stream: tuple[int, int]       # seeded: (0, 0); else the request's serial number


@dataclass
class SamplingBatch:
    params: np.ndarray   # [S, NUM_FIELDS] int32; ROW is the row of the logits array, set by the runner
    edits: np.ndarray    # [E, 4] int32: token id, then rep, sub, bias as float32 bits
    top_k: int           # the most top-logprob alternatives any row asks for (0: none)
    sampled: np.ndarray  # [S] each row's position among the step's sampled rows

    def __len__(self) -> int:
        return len(self.params)

    def field(self, col: int) -> np.ndarray:
        v = self.params[:, col]
        return v.view(np.float32) if col in FLOAT_FIELDS else v


def _unique(a: np.ndarray) -> np.ndarray:
    """np.unique by sorting: several times faster than numpy 2's hashing on these short arrays."""
    a = np.sort(a)
    return a[np.concatenate(([True], a[1:] != a[:-1]))] if len(a) else a


def logit_edits(p: SamplingParams, prompt_ids: list[int] | np.ndarray, output_ids: list[int],
                blocked: frozenset[int] | set[int]) -> np.ndarray | None:
    """The row's edits [n, 4] int32 (token ids sorted and unique; rep, sub, bias as float32 bits),
    or None when nothing changes its logits. `prompt_ids` may be the prompt's unique ids."""
    repeat = p.repetition_penalty != 1.0
    count = bool((p.presence_penalty or p.frequency_penalty) and output_ids)
    if not (repeat or count or p.logit_bias or blocked):
        return None
    empty = np.zeros(0, np.int64)
    out = np.asarray(output_ids, np.int64)
    seen = _unique(np.concatenate([np.asarray(prompt_ids, np.int64), out])) if repeat else empty
    counted, counts = np.unique(out, return_counts=True) if count else (empty, empty)
    biased = np.fromiter(p.logit_bias, np.int64, len(p.logit_bias))
    blocked_ids = np.fromiter(blocked, np.int64, len(blocked))
    ids = _unique(np.concatenate([seen, counted, biased, blocked_ids]))
    e = np.zeros((len(ids), 4), np.int32)
    f = e.view(np.float32)
    e[:, 0] = ids
    f[:, 1] = 1.0
    f[np.searchsorted(ids, seen), 1] = p.repetition_penalty
    f[np.searchsorted(ids, counted), 2] = p.frequency_penalty * counts + p.presence_penalty
    f[np.searchsorted(ids, biased), 3] = np.fromiter(p.logit_bias.values(), np.float32, len(biased))
    f[np.searchsorted(ids, blocked_ids), 3] = -np.inf
    return e


def build_batch(rows: list[SampleRow], vocab_size: int, sampled: list[int] | None = None) -> SamplingBatch:
    """`sampled`: each row's position among the step's sampled rows (default: 0..S-1)."""
    S = len(rows)
    params = np.zeros((S, NUM_FIELDS), np.int32)
    ps = [r.params for r in rows]
    params[:, LOGPROBS] = [-1 if p.logprobs is None else p.logprobs for p in ps]
    params[:, TOP_K] = [p.top_k if 0 < p.top_k < vocab_size else vocab_size for p in ps]
    params[:, [TEMPERATURE, TOP_P, MIN_P]] = np.array([(p.temperature, p.top_p, p.min_p) for p in ps],
                                                      np.float32).reshape(S, 3).view(np.int32)
    params[:, KEY_LO: STEP + 1] = np.array([(*r.key, *r.stream, len(r.output_ids) & 0xFFFFFFFF) for r in rows],
                                           np.uint32).reshape(S, 5).view(np.int32)
    edits, ends = [], np.zeros(S, np.int64)
    for i, r in enumerate(rows):
        e = logit_edits(r.params, r.prompt_ids, r.output_ids, r.blocked)
        if e is not None:
            edits.append(e)
        ends[i] = len(e) if e is not None else 0
    ends = np.cumsum(ends)
    params[:, EDIT_END] = ends
    params[:, EDIT_BEGIN] = ends - np.diff(ends, prepend=0)
    top_k = max((p.logprobs or 0 for p in ps), default=0)
    return SamplingBatch(params, np.concatenate(edits) if edits else np.zeros((0, 4), np.int32), top_k,
                         np.arange(S) if sampled is None else np.asarray(sampled, np.int64))


def to_results(batch: SamplingBatch, tokens: np.ndarray, logprobs: np.ndarray, top_values: np.ndarray | None,
               top_ids: np.ndarray | None) -> list[SampleResult]:
    """Per row: the token, and the chosen logprob and top alternatives where the row asked."""
    out = []
    for i, k in enumerate(batch.params[:, LOGPROBS]):
        tok = int(tokens[i])
        if k < 0:
            out.append(SampleResult(tok))
            continue
        top = [(int(t), float(v)) for t, v in zip(top_ids[i, :k], top_values[i, :k])] if k > 0 else None
        out.append(SampleResult(tok, float(logprobs[i]), top))
    return out
