"""The engine's device-sampling path (what the CUDA backend runs), checked on the CPU with the
numpy reference standing in for the kernels: seeded requests reproduce whatever batch they are
in, top_k=1 is greedy, logprobs and min_tokens hold. test_cuda_sampling_engine.py runs the same
checks on the GPU."""
from __future__ import annotations

import numpy as np
import pytest

from openinfer.sampling import reference as ref
from openinfer.engine.engine import Engine, EngineArgs, build_engine
from openinfer.sampling.sampler import SamplingParams
from openinfer.sampling.batch import ROW, to_results
from openinfer.testing.engine import generate, greedy, prompt_logits

PROMPTS = [[9707, 11, 1879, 0, 358, 1079], [40, 1079, 264, 1614], [3838, 374, 279, 6722, 315, 9625, 30]]


@pytest.fixture(scope="module")
def engine():
    eng = build_engine(None, EngineArgs(max_model_len=256, kv_cache_memory_gib=0.01))
    be = eng.runner.backend
    be.samples_on_device = True
    be.sample = lambda logits, batch: to_results(batch, *ref.sample(np.asarray(logits)[batch.params[:, ROW]], batch))
    return eng


def sampled(max_tokens: int = 6, **kw) -> SamplingParams:
    return SamplingParams(max_tokens=max_tokens, ignore_eos=True, **{"temperature": 1.0, **kw})


def test_seeded_requests_reproduce_in_any_batch(engine: Engine) -> None:
    p = sampled(seed=1234, top_p=0.95, repetition_penalty=1.2)
    [(alone, _, _)] = generate(engine, [PROMPTS[0]], p)
    [(again, _, _)] = generate(engine, [PROMPTS[0]], p)
    mixed = generate(engine, [PROMPTS[1], PROMPTS[0], PROMPTS[2]],
                     [sampled(top_k=40), p, greedy(6, presence_penalty=0.5)])
    assert alone == again == mixed[1][0]
    [(other, _, _)] = generate(engine, [PROMPTS[0]], sampled(seed=99, top_p=0.95, repetition_penalty=1.2))
    assert other != alone


def test_unseeded_requests_differ(engine: Engine) -> None:
    a, b = generate(engine, [PROMPTS[2], PROMPTS[2]], sampled(8))
    assert a[0] != b[0]


def test_top_k_1_is_greedy(engine: Engine) -> None:
    want = generate(engine, PROMPTS, greedy(6))
    got = generate(engine, PROMPTS, [sampled(top_k=1, seed=s) for s in range(3)])
    assert [g[0] for g in got] == [w[0] for w in want]


def test_logprobs_and_min_tokens(engine: Engine) -> None:
    eos = min(engine.eos_token_ids)
    stream = engine.submit(PROMPTS[0], SamplingParams(max_tokens=8, temperature=0.7, min_tokens=3, logprobs=3,
                                                      logit_bias={eos: 100.0}, seed=5))
    [(tokens, fin, _)] = generate(engine, [PROMPTS[0]], SamplingParams(
        max_tokens=8, temperature=0.7, min_tokens=3, logit_bias={eos: 100.0}, seed=5))
    assert eos not in tokens[:3] and tokens[3] == eos and fin.reason == "stop" and len(tokens) == 4
    while engine.has_unfinished():
        engine.step()
    samples = [s for ev in stream if hasattr(ev, "samples") for s in ev.samples]
    assert [s.token for s in samples] == tokens
    for s in samples:
        assert len(s.top) == 3 and s.logprob <= s.top[0][1] + 1e-5
        assert [lp for _, lp in s.top] == sorted((lp for _, lp in s.top), reverse=True)
    assert samples[3].logprob > -1e-3   # a +100 bias: all the mass


def test_allowed_token_ids_are_masked_on_the_host(engine: Engine) -> None:
    """allowed_token_ids rows sample on the host beside the device-sampled ones: greedy is the argmax over the
    allowed ids, sampled tokens stay among them, and the other rows of the batch are what they are alone."""
    allowed = [13, 1079, 3838, 9625, 40000]
    x = prompt_logits(engine, PROMPTS[0])[-1]
    seeded = sampled(seed=7, top_k=40)
    mixed = generate(engine, [PROMPTS[0], PROMPTS[1], PROMPTS[2], PROMPTS[0]],
                     [greedy(6, allowed_token_ids=allowed), sampled(seed=3, allowed_token_ids=allowed, logprobs=2),
                      seeded, greedy(6)])
    assert mixed[0][0][0] == allowed[int(np.argmax(x[allowed]))]
    assert all(t in allowed for out, _, _ in mixed[:2] for t in out)
    assert mixed[2][0] == generate(engine, [PROMPTS[2]], seeded)[0][0]
    assert mixed[3][0] == generate(engine, [PROMPTS[0]], greedy(6))[0][0]
    assert mixed[3][0][0] != mixed[0][0][0]   # the mask changed the greedy token


def test_bad_words_mask_their_last_token(engine: Engine) -> None:
    """A one-token bad word never comes out; a two-token one only loses its second token after its first. Sampled
    on the host beside the device-sampled rows."""
    [(base, _, _)] = generate(engine, [PROMPTS[0]], greedy(6))
    one = generate(engine, [PROMPTS[0], PROMPTS[1]], [greedy(6, bad_words_ids=[[base[0]]]), greedy(6)])
    assert one[0][0][0] != base[0] and base[0] not in one[0][0]
    assert one[1][0] == generate(engine, [PROMPTS[1]], greedy(6))[0][0]
    [(two, _, _)] = generate(engine, [PROMPTS[0]], greedy(6, bad_words_ids=[[base[0], base[1]]]))
    assert two[0] == base[0] and two[1] != base[1]
