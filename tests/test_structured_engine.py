"""Structured outputs through the engine (the built-in demo model: tiny random Qwen3, real tokenizer):
outputs parse and satisfy the schema, greedy and seeded; unconstrained rows beside a constrained one
are untouched; on a device-sampling backend constrained rows go to the host; reasoning stays free;
a failing matcher fails its request only."""
from __future__ import annotations

import json

import numpy as np
import pytest

from openinfer.sampling import reference as ref
from openinfer.engine.engine import Engine, EngineArgs, build_engine
from openinfer.engine.request import Failed
from openinfer.sampling.sampler import SamplingParams
from openinfer.sampling.batch import ROW, to_results
from openinfer.sampling.structured import Constraint, OutputGrammar, ReasoningGate, compile_grammar
from openinfer.testing.engine import collect, generate, greedy, run_to_completion
from openinfer.testing.structured import PERSON, check_person

PROMPT = [9707, 11, 1879, 0, 358, 1079]
OTHER = [3838, 374, 279, 6722, 315, 9625, 30]


@pytest.fixture(scope="module")
def engine() -> Engine:
    return build_engine(None, EngineArgs(max_model_len=512, kv_cache_memory_gib=0.05))


def constrained(engine: Engine, params: SamplingParams, schema: dict = PERSON, prompt: list[int] = PROMPT,
                gate: ReasoningGate | None = None) -> tuple[list[int], str]:
    """(tokens, finish reason) of one constrained request."""
    [c] = compile_grammar(engine, OutputGrammar("json", schema), 1, gate)
    stream = engine.submit(prompt, params, constraint=c)
    run_to_completion(engine, [stream])
    tokens, fin, _ = collect(stream)
    return tokens, fin.reason


@pytest.mark.parametrize("params", [SamplingParams(max_tokens=200, temperature=0.0),
                                    SamplingParams(max_tokens=200, temperature=1.0, top_p=0.9, seed=7)])
def test_output_satisfies_the_schema(engine: Engine, params: SamplingParams) -> None:
    tokens, reason = constrained(engine, params)
    assert reason == "stop" and tokens[-1] not in engine.eos_token_ids   # ended by the grammar, not eos
    check_person(json.loads(engine.tokenizer.decode(tokens)))
    assert constrained(engine, params) == (tokens, reason)   # greedy or seeded: reproducible


def test_json_object(engine: Engine) -> None:
    tok = engine.tokenizer
    # a random model writes strings forever; leaning on closing tokens lets it finish (the grammar
    # still decides where they may go)
    bias = {tok.encode(t)[0]: 30.0 for t in ['}', '"', '":', '"}', ',"']}
    tokens, reason = constrained(engine, SamplingParams(max_tokens=100, temperature=1.0, seed=3, logit_bias=bias),
                                 {"type": "object"})
    assert reason == "stop" and isinstance(json.loads(tok.decode(tokens)), dict)


def test_unconstrained_rows_are_untouched(engine: Engine) -> None:
    [(alone, _, _)] = generate(engine, [OTHER], greedy(12))
    [c] = compile_grammar(engine, OutputGrammar("json", PERSON), 1)
    beside = engine.submit(PROMPT, SamplingParams(max_tokens=200, temperature=0.0), constraint=c)
    [(batched, _, _)] = generate(engine, [OTHER], greedy(12))
    run_to_completion(engine, [beside])
    check_person(json.loads(engine.tokenizer.decode(collect(beside)[0])))
    assert batched == alone


def test_device_sampling_backend_samples_constrained_rows_on_the_host(engine: Engine, monkeypatch) -> None:
    want, _ = constrained(engine, SamplingParams(max_tokens=200, temperature=0.0))
    be = engine.runner.backend
    device_rows: list[int] = []

    def sample(logits, batch):
        device_rows.extend(batch.params[:, ROW].tolist())
        return to_results(batch, *ref.sample(np.asarray(logits)[batch.params[:, ROW]], batch))
    monkeypatch.setattr(be, "samples_on_device", True, raising=False)
    monkeypatch.setattr(be, "sample", sample, raising=False)
    [c] = compile_grammar(engine, OutputGrammar("json", PERSON), 1)
    streams = [engine.submit(PROMPT, SamplingParams(max_tokens=200, temperature=0.0), constraint=c),
               engine.submit(OTHER, SamplingParams(max_tokens=8, temperature=1.0, seed=1, ignore_eos=True))]
    run_to_completion(engine, streams)
    got, fin, _ = collect(streams[0])
    assert fin.reason == "stop" and got == want   # the host sampled it, with the same mask, as on the CPU
    assert len(collect(streams[1])[0]) == 8 and len(device_rows) == 8   # every draw of the other on the device
    assert device_rows == [1] * 8   # row 0 (the constrained request) never went to the device


def test_reasoning_is_free_and_the_answer_constrained(engine: Engine) -> None:
    [(free, _, _)] = generate(engine, [PROMPT], greedy(30))
    k = next(i for i in range(3, 30) if free[i] not in free[:i])   # a token that first appears at step k
    tokens, reason = constrained(engine, SamplingParams(max_tokens=230, temperature=0.0),
                                 gate=ReasoningGate((free[k],)))
    assert tokens[:k + 1] == free[:k + 1]   # the reasoning, up to its end marker, is what the model wrote
    assert reason == "stop"
    check_person(json.loads(engine.tokenizer.decode(tokens[k + 1:])))


class BrokenMatcher:
    def compute_bitmask(self) -> bytes:
        raise RuntimeError("matcher exploded")


def test_failing_matcher_fails_only_its_request(engine: Engine) -> None:
    broken = engine.submit(PROMPT, SamplingParams(max_tokens=20), constraint=Constraint(BrokenMatcher(), 10))
    [(tokens, fin, _)] = generate(engine, [OTHER], greedy(6))
    run_to_completion(engine, [broken])
    events = list(broken)
    assert isinstance(events[-1], Failed) and "matcher exploded" in events[-1].message
    assert len(tokens) == 6 and fin.reason == "length" and engine.is_alive()
