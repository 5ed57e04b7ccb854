"""A checkpoint's generation_config.json gives the model's sampling defaults (as vLLM's --generation-config auto):
which fields are read, which values are refused, and the engine loading them (or not, with none)."""
from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from openinfer.engine.engine import EngineArgs, build_engine
from openinfer.sampling.sampler import defaults_from_generation_config
from openinfer.loading.loader import end_ids
from openinfer.loading.synth import synthesize

QWEN3_4B = {"bos_token_id": 151643, "do_sample": True, "eos_token_id": [151645, 151643], "pad_token_id": 151643,
            "temperature": 0.6, "top_k": 20, "top_p": 0.95, "transformers_version": "4.51.0"}   # Qwen/Qwen3-4B's


def test_the_sampling_fields_are_read_and_nothing_else() -> None:
    assert defaults_from_generation_config(QWEN3_4B) == ({"temperature": 0.6, "top_k": 20, "top_p": 0.95}, [])
    got, skipped = defaults_from_generation_config({"min_p": 0.05, "repetition_penalty": 1.05, "max_length": 10})
    assert got == {"min_p": 0.05, "repetition_penalty": 1.05} and skipped == []
    assert defaults_from_generation_config({}) == ({}, [])


@pytest.mark.parametrize("field, value, why", [
    ("temperature", 5.0, "temperature must be between 0 and 2"), ("top_p", 0.0, "top_p must be in (0, 1]"),
    ("top_k", 20.5, "is not an integer"), ("temperature", True, "is not a number"), ("top_p", "0.9", "is not a number"),
    ("repetition_penalty", 0, "repetition_penalty must be in (0, 2]")])
def test_a_value_the_engine_would_refuse_is_left_out(field: str, value: object, why: str) -> None:
    got, skipped = defaults_from_generation_config({field: value, "top_k": 20} if field != "top_k" else {field: value})
    assert field not in got and len(skipped) == 1 and why in skipped[0] and skipped[0].startswith(field)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("qwen3-tiny")
    synthesize("qwen3-tiny", path, dtype="F32")
    (path / "generation_config.json").write_text(json.dumps({**QWEN3_4B, "temperature": 9.0}))
    return path


@pytest.mark.parametrize("mode, want", [("auto", {"top_k": 20, "top_p": 0.95}), ("none", {})])
def test_the_engine_loads_them_unless_told_not_to(checkpoint: Path, mode: str, want: dict,
                                                  caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="openinfer"):
        engine = build_engine(str(checkpoint), EngineArgs(max_model_len=64, kv_cache_memory_gib=0.001,
                                                          generation_config=mode))
    assert engine.sampling_defaults == want
    warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert (["generation_config.json: temperature=9.0: temperature must be between 0 and 2; not a sampling default"]
            if mode == "auto" else []) == [w for w in warned if "generation_config" in w]


def test_an_unknown_mode_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown generation_config 'vllm': use auto or none"):
        EngineArgs(generation_config="vllm")


def test_end_ids_outside_the_vocabulary_are_dropped_with_a_warning(caplog: pytest.LogCaptureFixture) -> None:
    """A tokenizer borrowed from another model (--tokenizer) may end sequences at ids the model cannot emit: those
    are dropped (the grammar engine would refuse them) and named."""
    with caplog.at_level(logging.WARNING, logger="openinfer"):
        assert end_ids([151645, 151643], [100001], 102400) == {100001}
    assert "[151643, 151645] are outside the model's 102400-token vocabulary" in caplog.text
    assert "none is left" not in caplog.text
    assert end_ids([2], 3, 10) == {2, 3} and end_ids([2], None, 10) == {2}
    with caplog.at_level(logging.WARNING, logger="openinfer"):
        assert end_ids([151645], None, 512) == frozenset()
    assert "none is left, so sequences end at their length limit and structured outputs are refused" in caplog.text


def test_structured_output_with_a_borrowed_tokenizer(tmp_path: Path) -> None:
    """DeepSeek-V2's tiny model with the demo (Qwen) tokenizer, whose end ids lie past the model's vocabulary: the
    engine ends sequences at the config's id only, and a grammar request builds and runs (it failed on the foreign
    ids)."""
    from importlib.resources import files

    from openinfer.sampling.sampler import SamplingParams
    from openinfer.sampling.structured import OutputGrammar, compile_grammar
    from openinfer.testing.engine import collect, run_to_completion

    synthesize("deepseek-v2-lite-tiny", tmp_path, dtype="F32")
    engine = build_engine(str(tmp_path), EngineArgs(max_model_len=64, kv_cache_memory_gib=0.001,
                                                     tokenizer=str(files("openinfer_qwen3") / "demo_tokenizer")))
    assert engine.eos_token_ids == {100001}
    [c] = compile_grammar(engine, OutputGrammar("choice", ["yes", "no"]), 1)
    stream = engine.submit(engine.tokenizer.encode("Hello"), SamplingParams(max_tokens=4, temperature=0.0),
                           constraint=c)
    run_to_completion(engine, [stream])
    tokens, _, _ = collect(stream)
    assert engine.tokenizer.decode(tokens) in ("yes", "no")


def test_a_model_that_cannot_end_refuses_structured_outputs(tmp_path: Path) -> None:
    """GLM-5.2's tiny model (1,024 rows) with the demo tokenizer: neither its end ids nor the config's lie inside
    the vocabulary, so generation runs to its limit and a grammar request is refused with the reason (the server
    answers 400 naming the request field)."""
    from importlib.resources import files

    from openinfer.sampling.structured import GrammarError, OutputGrammar, compile_grammar

    synthesize("glm-5.2-tiny", tmp_path, dtype="F32")
    engine = build_engine(str(tmp_path), EngineArgs(max_model_len=64, kv_cache_memory_gib=0.001,
                                                     tokenizer=str(files("openinfer_qwen3") / "demo_tokenizer")))
    assert engine.vocab_size == 1024 and engine.eos_token_ids == frozenset()
    with pytest.raises(GrammarError, match="end-of-sequence token the model can emit"):
        compile_grammar(engine, OutputGrammar("choice", ["yes", "no"]), 1)
