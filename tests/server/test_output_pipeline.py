"""ChoiceOutput (detokenize -> stop strings -> chat parser) without HTTP: token splits do not matter."""
from __future__ import annotations

from fake_engine import demo_tokenizer
from openinfer.sampling.sampler import SampleResult, SamplingParams
from openinfer.server.metrics import Histogram, ModelMetrics, render
from openinfer.server.output import ChoiceOutput
from openinfer.server.protocol import Generation
from openinfer_qwen3.chat import QWEN3_CHAT_FORMAT

TOK = demo_tokenizer()
EOS = min(TOK.eos_token_ids)


def run(text: str, chunk: int, stop: list[str] = (), chat: bool = False, **params: object) -> ChoiceOutput:
    ids = TOK.encode(text) + [EOS]
    p = SamplingParams(**params)
    parser = QWEN3_CHAT_FORMAT.stream_parser("", [{"type": "function", "function": {"name": "f"}}]) if chat else None
    out = ChoiceOutput(TOK, TOK.eos_token_ids, Generation("m", stop=list(stop)), p, parser)
    for i in range(0, len(ids), chunk):
        part = ids[i:i + chunk]
        out.add(part, [SampleResult(t) for t in part])
        if out.finish_reason:
            return out
    out.finish("stop")
    return out


def test_split_points_do_not_change_the_result() -> None:
    text = "Grüße 🌍 from <think>not reasoning</think> and a STOP word."
    for chunk in (1, 2, 3, 100):
        out = run(text, chunk, stop=["STOP"])
        assert (out.text, out.finish_reason) == ("Grüße 🌍 from <think>not reasoning</think> and a ", "stop")
        out = run("<think>\nhmm\n</think>\n\n" + text, chunk, chat=True)
        assert (out.parsed.reasoning, out.parsed.content, out.finish_reason) == ("hmm", text, "stop")
        out = run('ok <tool_call>\n{"name": "f", "arguments": {"a": 1}}\n</tool_call>', chunk, chat=True)
        assert out.parsed.content == "ok" and out.finish_reason == "tool_calls"
        assert [(d.index, d.arguments) for d in out.parsed.tool_calls] == [(0, '{"a": 1}')]


def test_stop_token_text_and_counts() -> None:
    out = run("Hi", 1)
    assert (out.text, out.num_tokens, out.finish_reason) == ("Hi", 2, "stop")  # eos counted, not shown


def test_histogram_buckets_are_cumulative() -> None:
    m = ModelMetrics()
    for v in (0.0005, 0.05, 0.05, 1e6):
        m.ttft.observe(v)
    stats = type("S", (), dict(num_running=1, num_waiting=2, kv_usage=0.5, prefix_queries=3, prefix_hits=1,
                               prompt_tokens=3, generation_tokens=4))()
    text = render([("m", m, stats)])
    assert 'vllm:time_to_first_token_seconds_bucket{le="0.001",model_name="m"} 1' in text
    assert 'vllm:time_to_first_token_seconds_bucket{le="0.06",model_name="m"} 3' in text
    assert 'vllm:time_to_first_token_seconds_bucket{le="+Inf",model_name="m"} 4' in text
    assert 'vllm:kv_cache_usage_perc{model_name="m"} 0.5' in text
    assert isinstance(m.itl, Histogram) and m.itl.count == 0
