"""The device sampler's inputs, packed on the host: one int32 row of parameters per sampled row
and a ragged list of logit edits, so a step uploads two arrays and reads back token ids.

Edits fold every sparse change of the host sampler (sampling.py) into one formula per token:
x -> (x > 0 ? x / rep : x * rep) - sub + bias, with rep the repetition penalty of a seen token
(prompt or output), sub = frequency * count + presence for an output token, bias the logit_bias,
and -inf for a blocked token (eos and stop ids while min_tokens is unmet).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .sampling import SampleResult, SamplingParams

# columns of SamplingBatch.params (floats stored as their bits)
(ROW, LOGPROBS, TEMPERATURE, TOP_P, MIN_P, TOP_K, KEY_LO, KEY_HI, STREAM_LO, STREAM_HI, STEP,
 EDIT_BEGIN, EDIT_END) = range(13)
NUM_FIELDS = 16
FLOAT_FIELDS = (TEMPERATURE, TOP_P, MIN_P)


@dataclass
class SampleRow:
    """One row to sample: its request's parameters and history, and its Philox key and stream."""
    params: SamplingParams
    prompt_ids: list[int]
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


def logit_edits(p: SamplingParams, prompt_ids: list[int], output_ids: list[int],
                blocked: frozenset[int] | set[int]) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(ids, rep, sub, bias): the row's edited tokens, sorted and unique, and their edit terms."""
    empty = np.zeros(0, np.int64)
    seen = (np.unique(np.asarray(prompt_ids + output_ids, np.int64)) if p.repetition_penalty != 1.0 else empty)
    counted, counts = ((np.unique(np.asarray(output_ids, np.int64), return_counts=True))
                       if (p.presence_penalty or p.frequency_penalty) and output_ids else (empty, empty))
    biased = np.fromiter(p.logit_bias, np.int64, len(p.logit_bias))
    blocked_ids = np.fromiter(blocked, np.int64, len(blocked))
    ids = np.unique(np.concatenate([seen, counted, biased, blocked_ids]))
    rep = np.ones(len(ids), np.float32)
    rep[np.searchsorted(ids, seen)] = p.repetition_penalty
    sub = np.zeros(len(ids), np.float64)
    sub[np.searchsorted(ids, counted)] = p.frequency_penalty * counts + p.presence_penalty
    bias = np.zeros(len(ids), np.float32)
    bias[np.searchsorted(ids, biased)] = np.fromiter(p.logit_bias.values(), np.float32, len(biased))
    bias[np.searchsorted(ids, blocked_ids)] = -np.inf
    return ids.astype(np.int32), rep, sub.astype(np.float32), bias


def build_batch(rows: list[SampleRow], vocab_size: int, sampled: list[int] | None = None) -> SamplingBatch:
    """`sampled`: each row's position among the step's sampled rows (default: 0..S-1)."""
    params = np.zeros((len(rows), NUM_FIELDS), np.int32)
    fparams = params.view(np.float32)
    edits, begin = [], 0
    for i, r in enumerate(rows):
        p = r.params
        params[i, LOGPROBS] = -1 if p.logprobs is None else p.logprobs
        fparams[i, TEMPERATURE], fparams[i, TOP_P], fparams[i, MIN_P] = p.temperature, p.top_p, p.min_p
        params[i, TOP_K] = p.top_k if 0 < p.top_k < vocab_size else vocab_size
        u = np.array([*r.key, *r.stream, len(r.output_ids) & 0xFFFFFFFF], np.uint32).view(np.int32)
        params[i, KEY_LO: STEP + 1] = u
        ids, rep, sub, bias = logit_edits(p, r.prompt_ids, r.output_ids, r.blocked)
        edits.append(np.stack([ids, rep.view(np.int32), sub.view(np.int32), bias.view(np.int32)], axis=1))
        params[i, EDIT_BEGIN], params[i, EDIT_END] = begin, begin + len(ids)
        begin += len(ids)
    top_k = max((r.params.logprobs or 0 for r in rows), default=0)
    return SamplingBatch(params, np.concatenate(edits) if edits else np.zeros((0, 4), np.int32), top_k,
                         np.arange(len(rows)) if sampled is None else np.asarray(sampled, np.int64))


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
