"""SSE parsing, arrival schedules, /metrics parsing, datasets and the progress bar."""

from __future__ import annotations

import io
import json
import math
from pathlib import Path

import numpy as np
import pytest

from openinfer.bench import datasets as ds
from openinfer.bench.client import SSEParser, build_payload, error_message
from openinfer.bench.progress import Progress
from openinfer.bench.server_metrics import PrefixCounters, parse_prefix_counters, prefix_cache_report
from openinfer.bench.traffic import arrival_offsets


def test_sse_parser_splits_and_variants() -> None:
    p = SSEParser()
    assert p.feed('data: {"a": 1}\n\nda') == ['{"a": 1}']
    assert p.feed('ta:{"b": 2}\r\n\r\n: keep-alive\n\nevent: x\ndata: [DONE]\n\n') == ['{"b": 2}', "[DONE]"]
    assert p.feed('data: {"c": 3}') == []
    assert p.flush() == ['{"c": 3}']  # a complete JSON at the end of the body counts
    p.feed('data: {"trunc')
    assert p.flush() == []


def test_payloads() -> None:
    req = ds.BenchRequest([1, 2], 2, 7, messages=[{"role": "user", "content": "hi"}])
    c = build_payload("/v1/completions", "m", req, {"ignore_eos": True, "temperature": 0.0})
    assert c == {"model": "m", "stream": True, "stream_options": {"include_usage": True}, "prompt": [1, 2],
                 "max_tokens": 7, "ignore_eos": True, "temperature": 0.0}
    chat = build_payload("/v1/chat/completions", "m", req, {})
    assert chat["messages"] == req.messages and chat["max_completion_tokens"] == 7 and "prompt" not in chat
    body = json.dumps({"error": {"message": "too long", "type": "x", "param": None, "code": None}}).encode()
    assert error_message(400, body) == "HTTP 400: too long"
    assert error_message(502, b"bad gateway") == "HTTP 502: bad gateway"


def test_arrivals() -> None:
    rng = np.random.default_rng(0)
    assert np.all(arrival_offsets(5, math.inf, 1.0, rng) == 0)
    assert np.allclose(arrival_offsets(4, 2.0, math.inf, rng), [0.5, 1.0, 1.5, 2.0])
    for burstiness in (0.5, 1.0, 4.0):
        off = arrival_offsets(100, 8.0, burstiness, np.random.default_rng(1))
        assert off[-1] == pytest.approx(100 / 8.0)  # rescaled to end at N/rate
        assert np.all(np.diff(off) >= 0)
    a, b = (arrival_offsets(50, 3.0, 1.0, np.random.default_rng(s)) for s in (7, 7))
    assert np.array_equal(a, b)
    with pytest.raises(ValueError):
        arrival_offsets(3, 0.0, 1.0, rng)


def test_metrics_parsing_and_report() -> None:
    text = ('# HELP vllm:prefix_cache_queries_total x\n'
            'vllm:prefix_cache_queries_total{model_name="a b",engine="0"} 100.0\n'
            'vllm:prefix_cache_queries_total{model_name="c",engine="1"} 50\n'
            'vllm:prefix_cache_hits_total{model_name="a b"} 30\n'
            'vllm:prefix_cache_hits_created{model_name="a b"} 1.7e9\n')
    assert parse_prefix_counters(text) == PrefixCounters(150.0, 30.0)
    assert parse_prefix_counters("vllm:num_requests_running 1\n") is None
    rep = prefix_cache_report(PrefixCounters(150, 30), PrefixCounters(350, 130), [10, None, 30], 80)
    assert rep == {"prefix_cache_queries": 200, "prefix_cache_hits": 100, "prefix_cache_hit_rate": 0.5,
                   "cached_tokens": 40, "cached_token_ratio": 0.5}
    assert prefix_cache_report(None, None, [None], 10)["prefix_cache_hit_rate"] is None


def test_random_ids_exact_lengths_and_shared_prefix() -> None:
    maker = ds.PromptMaker(np.random.default_rng(0), 1000)
    reqs = ds.random_requests(maker, 20, 64, 8, range_ratio=0.0, prefix_len=16)
    assert all(len(r.prompt) == r.prompt_len == 80 and r.output_len == 8 for r in reqs)
    assert all(r.prompt[:16] == reqs[0].prompt[:16] for r in reqs)
    assert len({tuple(r.prompt[16:]) for r in reqs}) == 20
    assert all(0 <= t < 1000 for r in reqs for t in r.prompt)
    ranged = ds.random_requests(maker, 200, 100, 10, range_ratio=0.5)
    assert min(r.prompt_len for r in ranged) >= 50 and max(r.prompt_len for r in ranged) <= 150
    assert len({r.prompt_len for r in ranged}) > 10


def make_word_tokenizer(path: Path) -> Path:
    """A WordLevel tokenizer (w0..w199 + one special token) saved as <path>/tokenizer.json."""
    from tokenizers import AddedToken, Tokenizer
    from tokenizers.models import WordLevel
    from tokenizers.pre_tokenizers import Whitespace

    tok = Tokenizer(WordLevel({f"w{i}": i for i in range(200)} | {"[UNK]": 200}, unk_token="[UNK]"))
    tok.pre_tokenizer = Whitespace()
    tok.add_special_tokens([AddedToken("[UNK]", special=True), AddedToken("<eos>", special=True)])
    path.mkdir(parents=True, exist_ok=True)
    tok.save(str(path / "tokenizer.json"))
    return path


def test_text_prompts_tokenize_to_length(tmp_path: Path) -> None:
    tok = ds.load_tokenizer(str(make_word_tokenizer(tmp_path / "tok")))
    maker = ds.PromptMaker(np.random.default_rng(0), 10, tok)
    assert maker.allowed.tolist() == list(range(200))  # special tokens are never drawn
    for fmt in ("text", "chat"):
        for r in ds.random_requests(maker, 5, 33, 4, prefix_len=7, prompt_format=fmt):
            text = r.prompt if fmt == "text" else r.messages[0]["content"]
            assert ds.count_tokens(tok, text) == r.prompt_len == 40
    with pytest.raises(ValueError):
        ds.PromptMaker(np.random.default_rng(0), 10).text(5)


def test_multi_turn_dataset_shares_system_prefix() -> None:
    maker = ds.PromptMaker(np.random.default_rng(0), 1000)
    convs = ds.multi_turn_conversations(maker, 3, 4, system_len=12, user_len=5, output_len=3, as_text=False)
    assert all(c.system == convs[0].system and len(c.system) == 12 for c in convs)
    assert all(len(c.user_turns) == 4 and all(len(u) == 5 for u in c.user_turns) for c in convs)
    words = ds.multi_turn_conversations(maker, 2, 2, 0, 6, 3, as_text=True)
    assert words[0].system == "" and len(words[0].user_turns[0].split()) == 6


def test_progress_bar() -> None:
    buf = io.StringIO()
    bar = Progress(4, desc="run", stream=buf, min_interval=0.0)
    for _ in range(4):
        bar.update()
    bar.close()
    out = buf.getvalue()
    assert "run: 100%|" in out and "4/4" in out and out.endswith("\n") and out.count("4/4") == 1
    silent = io.StringIO()
    Progress(2, stream=silent, disable=True).update(2)
    assert silent.getvalue() == ""


def test_plot_without_matplotlib_errors_clearly(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from openinfer.bench.plot import plot_sweep

    monkeypatch.setitem(__import__("sys").modules, "matplotlib", None)  # makes `import matplotlib` fail
    with pytest.raises(RuntimeError, match="needs matplotlib"):
        plot_sweep([{"request_rate": 1.0}], tmp_path / "x.png")


def test_client_group_keeps_each_pool_small() -> None:
    """Streams spread over clients of POOL_STREAMS connections each (httpcore's pool upkeep is quadratic in its
    connections); every client is closed with the group."""
    import asyncio

    from openinfer.bench.client import POOL_STREAMS, client_group

    async def sizes() -> list[tuple[int, bool]]:
        got = []
        for n in (1, POOL_STREAMS, POOL_STREAMS + 1, 8 * POOL_STREAMS):
            async with client_group("http://127.0.0.1:9", n) as clients:
                got.append(len(clients))
            got.append(all(c.is_closed for c in clients))
        return got
    assert asyncio.run(sizes()) == [1, True, 1, True, 2, True, 8, True]


def test_the_bench_client_drops_idle_connections_before_servers_close_them() -> None:
    """A request sent on a connection the server is closing fails with a reset: the client's pool lets idle
    connections go sooner than uvicorn's and vLLM's keep-alive (5 s) and openinfer's (KEEP_ALIVE_S)."""
    import asyncio

    from openinfer.bench.client import make_client
    from openinfer.server.run import KEEP_ALIVE_S

    async def expiry() -> float:
        async with make_client("http://127.0.0.1:9") as client:
            return client._transport._pool._keepalive_expiry
    assert asyncio.run(expiry()) < min(5.0, KEEP_ALIVE_S)
