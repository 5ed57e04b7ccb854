"""SamplingParams (honour-or-reject validation) and the numpy sampler.

Every field is honoured by the engine or rejected at validation with the parameter's name, so a
client is never silently ignored. The sampler runs per step over the rows that sample.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


class ParamError(ValueError):
    """A request parameter that cannot be honoured; `param` names it for the 400 response."""

    def __init__(self, param: str, message: str) -> None:
        super().__init__(message)
        self.param = param


@dataclass
class SamplingParams:
    max_tokens: int = 16
    min_tokens: int = 0
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1                  # -1 or 0: disabled
    min_p: float = 0.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    logit_bias: dict[int, float] = field(default_factory=dict)
    seed: int | None = None          # reproduces per backend: the numpy and CUDA samplers draw differently
    stop_token_ids: list[int] = field(default_factory=list)
    ignore_eos: bool = False
    logprobs: int | None = None      # None: none; k >= 0: the chosen token's logprob + top-k alternatives
    prompt_logprobs: int | None = None   # the same for every prompt token after the first (prefill computes them)
    allowed_token_ids: list[int] | None = None   # sample only among these ids (vLLM's); None: the whole vocabulary
    bad_words_ids: list[list[int]] = field(default_factory=list)   # token sequences whose last token is banned
                                                                      # after the rest of it (vLLM's bad_words)

    def validate(self, vocab_size: int | None = None) -> SamplingParams:
        def check(ok: bool, param: str, message: str) -> None:
            if not ok:
                raise ParamError(param, message)

        check(isinstance(self.max_tokens, int) and (self.max_tokens >= 1 or self.max_tokens == 0 and self.scores_only),
              "max_tokens", "max_tokens must be an integer >= 1 (0 only to score the prompt: with prompt logprobs)")
        check(isinstance(self.min_tokens, int) and 0 <= self.min_tokens <= self.max_tokens, "min_tokens",
              "min_tokens must be an integer between 0 and max_tokens")
        check(0.0 <= self.temperature <= 2.0, "temperature", "temperature must be between 0 and 2")
        check(0.0 < self.top_p <= 1.0, "top_p", "top_p must be in (0, 1]")
        check(isinstance(self.top_k, int) and (self.top_k == -1 or self.top_k >= 0), "top_k",
              "top_k must be -1 (disabled), 0 (disabled) or a positive integer")
        check(0.0 <= self.min_p <= 1.0, "min_p", "min_p must be between 0 and 1")
        check(-2.0 <= self.presence_penalty <= 2.0, "presence_penalty", "presence_penalty must be between -2 and 2")
        check(-2.0 <= self.frequency_penalty <= 2.0, "frequency_penalty", "frequency_penalty must be between -2 and 2")
        check(0.0 < self.repetition_penalty <= 2.0, "repetition_penalty", "repetition_penalty must be in (0, 2]")
        check(self.logprobs is None or (isinstance(self.logprobs, int) and 0 <= self.logprobs <= 20), "logprobs",
              "logprobs must be between 0 and 20")
        check(self.prompt_logprobs is None
              or (isinstance(self.prompt_logprobs, int) and 0 <= self.prompt_logprobs <= 20),
              "prompt_logprobs", "prompt_logprobs must be between 0 and 20")
        check(self.seed is None or (isinstance(self.seed, int) and -2**63 <= self.seed < 2**63), "seed",
              "seed must be a 64-bit signed integer")
        for tid, bias in self.logit_bias.items():
            check(isinstance(tid, int) and (vocab_size is None or 0 <= tid < vocab_size), "logit_bias",
                  f"logit_bias token id {tid} is outside the vocabulary")
            check(-100.0 <= bias <= 100.0, "logit_bias", "logit_bias values must be between -100 and 100")
        if self.allowed_token_ids is not None:
            check(len(self.allowed_token_ids) > 0, "allowed_token_ids", "allowed_token_ids must not be empty")
            for tid in self.allowed_token_ids:
                check(isinstance(tid, int) and (vocab_size is None or 0 <= tid < vocab_size), "allowed_token_ids",
                      f"allowed token id {tid} is outside the vocabulary")
        for seq in self.bad_words_ids:
            check(len(seq) > 0 and all(isinstance(t, int) and (vocab_size is None or 0 <= t < vocab_size) for t in seq),
                  "bad_words", "bad_words must tokenize to ids in the vocabulary")
        for tid in self.stop_token_ids:
            check(isinstance(tid, int) and (vocab_size is None or 0 <= tid < vocab_size), "stop_token_ids",
                  f"stop token id {tid} is outside the vocabulary")
        return self

    @property
    def scores_only(self) -> bool:
        """max_tokens 0 with prompt logprobs: the request scores its prompt and generates nothing."""
        return self.max_tokens == 0 and self.prompt_logprobs is not None

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    def is_plain_greedy(self) -> bool:
        """The token is the argmax of the raw logits: nothing reshapes them and no logprobs are asked."""
        return (self.greedy and self.logprobs is None and not self.logit_bias and self.repetition_penalty == 1.0
                and self.presence_penalty == 0.0 and self.frequency_penalty == 0.0 and self.allowed_token_ids is None
                and not self.bad_words_ids)


# The fields of a checkpoint's generation_config.json that become a model's sampling defaults, as vLLM reads them
# (`--generation-config auto`): a request's own value of a field still wins, field by field.
GENERATION_CONFIG_FIELDS = {"temperature": float, "top_p": float, "top_k": int, "min_p": float,
                            "repetition_penalty": float}


def defaults_from_generation_config(config: dict) -> tuple[dict[str, float | int], list[str]]:
    """(the sampling defaults generation_config.json recommends, why any of its values was left out). A value that
    SamplingParams would refuse is left out: it must never become a 400 for a client that did not send it."""
    defaults: dict[str, float | int] = {}
    skipped: list[str] = []
    for name, kind in GENERATION_CONFIG_FIELDS.items():
        value = config.get(name)
        if value is None:
            continue
        wrong_type = isinstance(value, bool) or not isinstance(value, (int, float))
        if wrong_type or (kind is int and not isinstance(value, int)):
            skipped.append(f"{name}={value!r} is not {'an integer' if kind is int else 'a number'}")
            continue
        try:
            SamplingParams(**{name: kind(value)}).validate()
        except ParamError as e:
            skipped.append(f"{name}={value!r}: {e}")
            continue
        defaults[name] = kind(value)
    return defaults, skipped


@dataclass(slots=True)   # slots: one is made per sampled row and step
class SampleResult:
    token: int
    logprob: float | None = None                     # of the chosen token, when logprobs was asked
    top: list[tuple[int, float]] | None = None       # top-k (token, logprob), best first
    rank: int | None = None                          # of the token among all (1: the most likely); prompt tokens


def _log_softmax(x: np.ndarray) -> np.ndarray:
    """Over the last axis (one row, or each row of a matrix)."""
    m = x.max(axis=-1, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(axis=-1, keepdims=True))


def score_rows(logits: np.ndarray, targets: np.ndarray, k: int
               ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Each row's target token scored against the row's raw logits (prompt logprobs): (float32 logprob [R],
    int32 rank [R] (1 + how many logits are larger), top max(k, 1) float32 logprobs [R, k] and their int32
    ids, best first, ties to the lower id)."""
    x = np.asarray(logits, np.float32)
    logp = _log_softmax(x)
    rows = np.arange(len(x))
    chosen = logp[rows, targets]
    rank = 1 + (x > x[rows, targets][:, None]).sum(axis=1)
    kk = max(k, 1)
    part = np.argpartition(-logp, kk - 1, axis=1)[:, :kk]
    order = np.lexsort((part, -np.take_along_axis(logp, part, axis=1)), axis=1)
    ids = np.take_along_axis(part, order, axis=1)
    return (chosen.astype(np.float32), rank.astype(np.int32),
            np.take_along_axis(logp, ids, axis=1).astype(np.float32), ids.astype(np.int32))


def apply_penalties(logits: np.ndarray, p: SamplingParams, prompt_ids: list[int], output_ids: list[int]) -> np.ndarray:
    """vLLM semantics: repetition over prompt+output, presence/frequency over the output only."""
    if p.repetition_penalty != 1.0:
        seen = np.unique(np.asarray(prompt_ids + output_ids, dtype=np.int64))
        vals = logits[seen]
        logits[seen] = np.where(vals > 0, vals / p.repetition_penalty, vals * p.repetition_penalty)
    if (p.presence_penalty or p.frequency_penalty) and output_ids:
        ids, counts = np.unique(np.asarray(output_ids, dtype=np.int64), return_counts=True)
        logits[ids] -= p.frequency_penalty * counts + p.presence_penalty
    return logits


def processed_logits(logits: np.ndarray, p: SamplingParams, prompt_ids: list[int], output_ids: list[int],
                     blocked: frozenset[int] | set[int] = frozenset(), allowed: np.ndarray | None = None) -> np.ndarray:
    """One row of float32 logits as the sampler and the logprobs see it (a copy). `allowed` (a structured output's
    grammar mask, bool per id), the params' allowed_token_ids and bad words, and `blocked` (eos while min_tokens is
    unmet) are masked before anything else; then the penalties and logit_bias apply."""
    x = logits.astype(np.float32, copy=True) if allowed is None else np.where(allowed, logits, np.float32(-np.inf))
    if p.allowed_token_ids is not None:
        kept = np.full_like(x, -np.inf)
        kept[p.allowed_token_ids] = x[p.allowed_token_ids]
        x = kept
    for seq in p.bad_words_ids:   # its last token, where the output ends with the rest of it
        rest = len(seq) - 1
        if rest == 0 or (len(output_ids) >= rest and output_ids[len(output_ids) - rest:] == seq[:-1]):
            x[seq[-1]] = -np.inf
    x = apply_penalties(x, p, prompt_ids, output_ids)
    for tid, bias in p.logit_bias.items():
        x[tid] += bias
    if blocked:
        x[list(blocked)] = -np.inf
    return x


def sample_row(logits: np.ndarray, p: SamplingParams, rng: np.random.Generator, prompt_ids: list[int],
               output_ids: list[int], blocked: frozenset[int] | set[int] = frozenset(),
               allowed: np.ndarray | None = None) -> SampleResult:
    """Sample one token from one row of float32 logits, processed (processed_logits), so greedy is the argmax over
    the allowed ids. Logprobs are those of the processed distribution before the temperature/top-k/top-p/min-p
    filters (mask, penalties and biases included), as vLLM reports them."""
    x = processed_logits(logits, p, prompt_ids, output_ids, blocked, allowed)
    logp = _log_softmax(x) if p.logprobs is not None else None
    if p.greedy:
        token = int(np.argmax(x))
    else:
        ids, weights = kept_distribution(x / p.temperature, p)
        i = draw(weights, rng.random())
        token = i if ids is None else int(ids[i])
    if logp is None:
        return SampleResult(token)
    top = None
    if p.logprobs:
        idx = np.argpartition(-logp, p.logprobs - 1)[: p.logprobs]
        idx = idx[np.argsort(-logp[idx], kind="stable")]
        top = [(int(i), float(logp[i])) for i in idx]
    return SampleResult(token, float(logp[token]), top)


def kept_distribution(x: np.ndarray, p: SamplingParams) -> tuple[np.ndarray | None, np.ndarray]:
    """softmax(x) as top_k, top_p and min_p leave it: (the kept ids, None for every id; their weights, exp(x - max),
    unnormalised). Each filter is measured on the whole distribution and keeps a prefix of the tokens by falling
    probability (ties: the lower id first), so only top_k and top_p need that order, and only over the top tokens
    that hold their share: the vocabulary is not sorted (~12 ms at 152k ids, ten times a demo-model step)."""
    weights = np.exp(x - x.max())   # the top token's is 1
    n = len(weights)
    k = p.top_k if 0 < p.top_k < n else n
    ids = None
    if k < n or p.top_p < 1.0:
        mass = p.top_p * float(weights.sum(dtype=np.float64)) if p.top_p < 1.0 else None
        ids = _top_prefix(weights, k, mass)
        weights = weights[ids]
    if p.min_p > 0.0:   # of the top token's probability
        weights = np.where(weights >= np.float32(p.min_p), weights, np.float32(0.0))
    return ids, weights


def _top_prefix(weights: np.ndarray, k: int, mass: float | None) -> np.ndarray:
    """The ids top_k (`k`) and top_p keep, by falling weight (ties by id): top_p keeps a token while the weight
    ranked before it is under `mass` (None: no limit). The top is partitioned off, growing until it holds `mass`,
    and only it is sorted."""
    n = len(weights)
    m = k if mass is None else min(k, 64)
    while True:
        part = np.argpartition(-weights, m - 1)[:m] if m < n else np.arange(n)
        if mass is None or m >= k or weights[part].sum(dtype=np.float64) >= mass:
            break
        m = min(8 * m, k)
    ids = part[np.lexsort((part, -weights[part]))]
    if mass is not None:
        w = weights[ids].astype(np.float64)
        ids = ids[np.cumsum(w) - w < mass]
    return ids


_DRAW_BLOCK = 1024


def draw(weights: np.ndarray, u: float) -> int:
    """The index i of the inverse CDF at `u` in [0, 1): weights[:i].sum() <= u * weights.sum() < weights[:i+1].sum(),
    an index of positive weight. Two levels (block sums, then one block's running sum) cost a pass over the weights
    instead of a float64 running sum of them all (~1 ms at 152k ids)."""
    starts = np.arange(0, len(weights), _DRAW_BLOCK)
    ends = np.cumsum(np.add.reduceat(weights, starts, dtype=np.float64))
    target = u * ends[-1]
    b = min(int(np.searchsorted(ends, target, side="right")), len(starts) - 1)
    block = weights[starts[b]:starts[b] + _DRAW_BLOCK]
    inner = np.cumsum(block, dtype=np.float64)
    j = min(int(np.searchsorted(inner, target - (ends[b - 1] if b else 0.0), side="right")), len(block) - 1)
    i = int(starts[b]) + j
    if weights[i] > 0:
        return i
    positive = np.flatnonzero(weights > 0)   # rounding at an edge landed on a zero weight: the nearest kept id
    return int(positive[max(int(np.searchsorted(positive, i)) - 1, 0)])
