"""Prompt logprobs in the engine (the demo model on the CPU): every prompt token after the first scored
against the logits of the full forward, whatever the chunking; scored prompts bypass the prefix cache; a
step scores at most max_num_seqs rows; the generated tokens do not change."""
from __future__ import annotations

import numpy as np
import pytest

from openinfer.engine.engine import EngineArgs, build_engine
from openinfer.engine.request import EventOrderError, PromptLogprobs, RequestStream, Scheduled, Tokens
from openinfer.sampling.sampler import SampleResult, score_rows
from openinfer.testing.engine import greedy, log_softmax, prompt_logits, run_to_completion, score_prompt

PROMPT = [(7 * i + 3) % 5000 + 100 for i in range(45)]
TIE = 1e-4   # logits this close may order either way across GEMM shapes


@pytest.fixture(scope="module")
def engine():
    # 16-token steps and 4 scored rows a step (max_num_seqs): the prompt is scored over many steps and chunks
    return build_engine(None, EngineArgs(max_model_len=256, max_num_seqs=4, max_num_batched_tokens=16,
                                         kv_cache_memory_gib=0.02))


def reference(engine, prompt, k):
    """float64 log-softmax of the full forward's logits: (logprob, rank range, top-k ids) of each next prompt token.
    The rank is a range: logits within TIE of the token's count as ties either way, since the chunks' GEMMs have other
    shapes than the full forward's and BLAS rounds each shape its own way (AVX-512 and AVX2 kernels differ)."""
    x = prompt_logits(engine, prompt)[:-1]
    logp = log_softmax(x)
    rows = np.arange(len(x))
    target = np.array(prompt[1:])
    own = x[rows, target][:, None]
    ranks = (1 + (x > own + TIE).sum(1), 1 + (x > own - TIE).sum(1))
    return logp[rows, target], ranks, np.argsort(-logp, axis=1, kind="stable")[:, :k], logp


def test_prompt_logprobs_match_the_full_forward(engine) -> None:
    lps, tokens, _ = score_prompt(engine, PROMPT, 3)
    chosen, (lo, hi), top, logp = reference(engine, PROMPT, 3)
    assert [s.token for s in lps] == PROMPT[1:]
    np.testing.assert_allclose([s.logprob for s in lps], chosen, atol=1e-4)
    ids, values = np.array([[t for t, _ in s.top] for s in lps]), np.array([[v for _, v in s.top] for s in lps])
    np.testing.assert_allclose(values, np.take_along_axis(logp, top, 1), atol=1e-4)
    np.testing.assert_allclose(np.take_along_axis(logp, ids, 1), values, atol=1e-4)   # near-ties may swap ids
    rank = np.array([s.rank for s in lps])
    assert (lo <= rank).all() and (rank <= hi).all(), (rank, lo, hi)
    _, plain, _ = score_prompt(engine, PROMPT, None)
    assert tokens == plain   # scoring the prompt leaves the generation as it was


def test_only_the_token_itself_at_zero(engine) -> None:
    lps, _, _ = score_prompt(engine, PROMPT[:20], 0)
    assert len(lps) == 19 and all(s.top is None and s.rank >= 1 for s in lps)
    assert score_prompt(engine, PROMPT[:1], 0)[0] == []   # a one-token prompt has nothing to score


def test_scored_prompts_skip_the_prefix_cache(engine) -> None:
    prompt = PROMPT[:40]
    score_prompt(engine, prompt, None)                     # fills the cache
    lps, _, cached = score_prompt(engine, prompt, 1)
    assert cached == 0 and len(lps) == 39
    again, _, _ = score_prompt(engine, prompt, 1)
    assert [(s.logprob, s.rank) for s in again] == [(s.logprob, s.rank) for s in lps]
    assert score_prompt(engine, prompt, None)[2] > 0       # and the cache still serves the others


def test_a_step_scores_at_most_max_num_seqs_rows(engine, monkeypatch) -> None:
    rows: list[int] = []
    prepare = engine.runner.prepare_host

    def counting(plan):
        h = prepare(plan)
        rows.append(0 if h.scored is None else len(h.scored.rows))
        return h
    monkeypatch.setattr(engine.runner, "prepare_host", counting)
    prompts = [PROMPT[:30], PROMPT[5:35], PROMPT[10:22]]
    streams = [engine.submit(list(prompts[0]), greedy(6)),
               engine.submit(list(prompts[1]), greedy(6, prompt_logprobs=2)),
               engine.submit(list(prompts[2]), greedy(6, prompt_logprobs=1))]
    run_to_completion(engine, streams)
    assert sum(rows) == 29 + 11 and max(rows) == min(engine.scheduler.max_score_rows, 40)
    monkeypatch.undo()
    together = [[t for ev in s.drain() if isinstance(ev, Tokens) for t in ev.token_ids] for s in streams]
    assert together == [score_prompt(engine, p, None)[1] for p in prompts]   # batching changed no token


def test_max_tokens_0_scores_and_generates_nothing(engine) -> None:
    lps, tokens, _ = score_prompt(engine, PROMPT[:30], 1, max_tokens=0)
    assert len(lps) == 29 and tokens == []
    assert engine.blocks.usage() == 0.0 and not engine.has_unfinished()


def test_abort_while_scoring(engine) -> None:
    stream = engine.submit(list(PROMPT), greedy(6, prompt_logprobs=2))
    engine.step()
    engine.step()   # a few of its 44 rows scored
    engine.abort(stream.request_id)
    run_to_completion(engine, [stream])
    events = stream.drain()
    assert [type(ev).__name__ for ev in events] == ["Scheduled", "Finished"] and events[-1].reason == "abort"
    assert engine.blocks.usage() == 0.0


def test_score_rows_ties() -> None:
    x = np.array([[0.0, 2.0, 2.0, 1.0, 2.0]], np.float32)
    logprob, rank, top_v, top_i = score_rows(x, np.array([2]), 2)
    assert rank.tolist() == [1] and top_i.tolist() == [[1, 2]]      # ties rank by value alone; top-k by lower id
    assert logprob[0] == pytest.approx(top_v[0, 1]) == pytest.approx(2 - np.log(np.exp(x[0]).sum()), abs=1e-6)
    assert score_rows(x, np.array([0]), 0)[1].tolist() == [5]


def test_prompt_logprobs_come_before_the_tokens() -> None:
    s = RequestStream("r")
    s.put(Scheduled(0))
    s.put(PromptLogprobs([SampleResult(1, -0.5, None, 1)]))
    s.put(Tokens([2], [SampleResult(2)]))
    with pytest.raises(EventOrderError):
        s.put(PromptLogprobs([]))
    with pytest.raises(EventOrderError):
        RequestStream("q").put(PromptLogprobs([]))
