"""`bench serve` end to end against the stub server: counts and keys exact, timings only loosely."""

from __future__ import annotations

import json
import socket
from pathlib import Path

import pytest

from bench_stub import MODEL
from conftest import run_cli
from test_units import make_word_tokenizer

VLLM_KEYS = {
    "date", "endpoint_type", "backend", "label", "model_id", "tokenizer_id", "num_prompts", "request_rate",
    "burstiness", "max_concurrency", "duration", "completed", "failed", "total_input_tokens",
    "total_output_tokens", "request_throughput", "request_goodput", "output_throughput",
    "total_token_throughput", "max_output_tokens_per_s", "max_concurrent_requests",
}


def _serve(url: str, tmp: Path, *extra: str) -> int:
    return run_cli("bench", "serve", "--base-url", url, "--result-dir", str(tmp), "--disable-tqdm",
                   "--vocab-size", "1000", *extra)


def _only_json(tmp: Path) -> dict:
    files = list(tmp.glob("*.json"))
    assert len(files) == 1, files
    return json.loads(files[0].read_text())


def test_single_run_json_and_payloads(stub, tmp_path: Path) -> None:
    url, state = stub
    state.ttft_s, state.itl_s = 0.02, 0.005
    rc = _serve(url, tmp_path, "--num-prompts", "12", "--input-len", "24", "--output-len", "6", "--save-result",
                "--save-detailed", "--metric-percentiles", "50,90,99", "--max-concurrency", "4",
                "--num-warmups", "2", "--request-rate", "200", "--metadata", "gpu=none")
    assert rc == 0
    res = _only_json(tmp_path)
    assert VLLM_KEYS <= set(res)
    for m in ("ttft", "tpot", "itl", "e2el"):
        assert {f"mean_{m}_ms", f"median_{m}_ms", f"std_{m}_ms", f"p50_{m}_ms", f"p90_{m}_ms", f"p99_{m}_ms"} <= set(res)
    assert (res["completed"], res["failed"], res["num_prompts"]) == (12, 0, 12)
    assert (res["total_input_tokens"], res["total_output_tokens"]) == (12 * 24, 12 * 6)
    assert res["output_lens"] == [6] * 12 and res["input_lens"] == [24] * 12
    assert res["model_id"] == MODEL and res["request_rate"] == 200.0 and res["max_concurrency"] == 4
    assert res["gpu"] == "none" and res["request_goodput"] is None
    assert all(t >= 0.02 for t in res["ttfts"])  # the stub sleeps 20 ms before the first chunk
    assert res["mean_ttft_ms"] > 0 and res["mean_tpot_ms"] > 0  # peak concurrency is per 1-s bucket (vLLM): not bounded by 4
    assert res["generated_texts"][0] == "t0 t1 t2 t3 t4 t5 "
    assert res["cached_tokens"] == 0 and res["prefix_cache_hit_rate"] == 0.0
    # 1 ready check + 2 warm-ups + 12 measured requests, all with vLLM's payload shape
    assert len(state.bodies) == 15 and state.request_ids[:3] == ["bench-ready", "bench-warmup-0", "bench-warmup-1"]
    measured = state.bodies[3:]
    assert all(len(b["prompt"]) == 24 and b["max_tokens"] == 6 and b["ignore_eos"] is True
               and b["stream_options"] == {"include_usage": True} and b["temperature"] == 0.0 for b in measured)
    # warm-ups use their own prompts, so they cannot pre-warm the measured prefixes
    assert not {tuple(b["prompt"]) for b in state.bodies[:3]} & {tuple(b["prompt"]) for b in measured}
    assert f"-{res['request_rate']}qps-concurrency4-{MODEL}-" in next(tmp_path.glob("*.json")).name


def test_failed_requests_and_goodput(stub, tmp_path: Path) -> None:
    url, state = stub
    state.fail_keys = {"1", "4", "7"}
    rc = _serve(url, tmp_path, "--num-prompts", "10", "--input-len", "8", "--output-len", "3", "--save-result",
                "--save-detailed", "--goodput", "ttft:60000", "e2el:60000", "--result-filename", "r.json")
    assert rc == 0
    res = json.loads((tmp_path / "r.json").read_text())
    assert (res["completed"], res["failed"]) == (7, 3)
    assert [bool(e) for e in res["errors"]] == [i in (1, 4, 7) for i in range(10)]
    assert res["errors"][1] == "HTTP 500: injected failure"
    assert res["output_lens"][1] == 0 and res["total_output_tokens"] == 21 and res["total_input_tokens"] == 56
    assert res["request_goodput"] == pytest.approx(res["request_throughput"])  # generous SLOs: all good
    rc = _serve(url, tmp_path, "--num-prompts", "4", "--input-len", "8", "--output-len", "3", "--save-result",
                "--goodput", "tpot:0", "--result-filename", "s.json")
    assert rc == 0 and json.loads((tmp_path / "s.json").read_text())["request_goodput"] == 0.0


def test_sweep_writes_one_json_per_point_and_plot(stub, tmp_path: Path) -> None:
    url, state = stub
    rc = _serve(url, tmp_path, "--num-prompts", "6", "--input-len", "8", "--output-len", "4", "--sweep", "50,inf",
                "--label", "swp")
    pytest.importorskip("matplotlib")
    assert rc == 0
    results = sorted((json.loads(p.read_text()) for p in tmp_path.glob("swp-*.json")), key=lambda r: r["seed"])
    assert [r["request_rate"] for r in results] == [50.0, "inf"]
    assert [r["seed"] for r in results] == [0, 1]  # a fresh seed per point
    assert all(r["completed"] == 6 for r in results) and "ttfts" not in results[0]
    pngs = list(tmp_path.glob("swp-sweep-*.png"))
    assert len(pngs) == 1 and pngs[0].read_bytes()[:4] == b"\x89PNG"
    prompts = [tuple(b["prompt"]) for b in state.bodies if isinstance(b["prompt"], list)]
    assert len(set(prompts)) == len(prompts)  # the second point's seed gave new prompts


def test_concurrency_sweep_at_an_unbounded_rate(stub, tmp_path: Path, capsys) -> None:
    """--sweep-concurrency: one point per max concurrency at --request-rate (inf), a fresh seed each; it does not
    combine with a rate sweep."""
    url, _ = stub
    rc = _serve(url, tmp_path, "--num-prompts", "6", "--input-len", "8", "--output-len", "4",
                "--sweep-concurrency", "1,3", "--label", "conc")
    pytest.importorskip("matplotlib")
    assert rc == 0
    results = sorted((json.loads(p.read_text()) for p in tmp_path.glob("conc-*.json")), key=lambda r: r["seed"])
    assert [(r["request_rate"], r["max_concurrency"], r["seed"]) for r in results] == [("inf", 1, 0), ("inf", 3, 1)]
    assert all(r["completed"] == 6 for r in results)
    table = capsys.readouterr().out.split("    rate   conc")[-1].splitlines()   # the sweep table's concurrency column
    assert [row.split()[:2] for row in table[2:4]] == [["inf", "1"], ["inf", "3"]]
    assert _serve(url, tmp_path, "--sweep", "1,inf", "--sweep-concurrency", "1,3") == 1


def test_multi_turn_ids_prefix_hits(stub, tmp_path: Path) -> None:
    url, state = stub
    rc = _serve(url, tmp_path, "--dataset", "multi-turn", "--multi-turn-conversations", "3", "--multi-turn-turns",
                "3", "--multi-turn-system-len", "10", "--multi-turn-user-len", "5", "--output-len", "4",
                "--save-result", "--result-filename", "mt.json", "--max-concurrency", "1")
    assert rc == 0
    res = json.loads((tmp_path / "mt.json").read_text())
    # prompts per conversation: 15, 15+4+5=24, 24+4+5=33
    assert (res["completed"], res["total_input_tokens"]) == (9, 3 * (15 + 24 + 33))
    # stub cache: conversation 1 misses; later first turns hit the shared system prefix (10);
    # turn 2 hits turn 1's prompt (15), turn 3 hits turn 2's (24)
    assert res["cached_tokens"] == res["prefix_cache_hits"] == 0 + 10 + 10 + 3 * (15 + 24)
    assert res["prefix_cache_hit_rate"] == pytest.approx(137 / 216)
    by_len = sorted((b["prompt"] for b in state.bodies[1:]), key=len)
    t1, t2 = next(p for p in by_len if len(p) == 15), None
    t2 = next(p for p in by_len if len(p) == 24 and p[:15] == t1)
    assert t2[15:19] == [500, 501, 502, 503]  # turn 1's output "t0 t1 t2 t3", via POST /tokenize


def test_multi_turn_chat_and_failure(stub, tmp_path: Path) -> None:
    url, state = stub
    state.fail_keys = {"1-1"}  # conversation 1, turn 1: its turn 2 is never sent
    rc = _serve(url, tmp_path, "--backend", "openai-chat", "--dataset", "multi-turn", "--multi-turn-conversations",
                "2", "--multi-turn-turns", "3", "--multi-turn-user-len", "6", "--output-len", "2",
                "--save-result", "--save-detailed", "--result-filename", "c.json")
    assert rc == 0
    res = json.loads((tmp_path / "c.json").read_text())
    assert (res["completed"], res["failed"]) == (4, 2)
    assert sum("not sent" in e for e in res["errors"]) == 1
    sizes = sorted(len(b["messages"]) for b in state.bodies[1:])
    assert sizes == [1, 1, 3, 3, 5]  # user / user+assistant+user / ...
    ok_lens = [n for n, e in zip(res["input_lens"], res["errors"]) if not e]
    assert sorted(ok_lens) == [6, 6, 6 + 2 + 6, 6 + 2 + 6 + 2 + 6]  # from the server's usage


def test_random_chat_with_tokenizer_and_no_metrics(stub, tmp_path: Path) -> None:
    url, state = stub
    state.export_metrics = False
    tok = make_word_tokenizer(tmp_path / "tok")
    rc = _serve(url, tmp_path, "--backend", "openai-chat", "--tokenizer", str(tok), "--num-prompts", "4",
                "--input-len", "20", "--output-len", "3", "--save-result", "--result-filename", "t.json")
    assert rc == 0
    res = json.loads((tmp_path / "t.json").read_text())
    assert res["total_input_tokens"] == 80 and res["prefix_cache_hit_rate"] is None
    assert all(len(b["messages"][0]["content"].split()) == 20 for b in state.bodies)
    assert _serve(url, tmp_path, "--backend", "openai-chat", "--num-prompts", "2") == 1  # needs --tokenizer


def test_text_prompts_without_ignore_eos(stub, tmp_path: Path) -> None:
    """What a server that takes only text prompts and rejects ignore_eos (transformers serve) gets."""
    url, state = stub
    tok = make_word_tokenizer(tmp_path / "tok")
    rc = _serve(url, tmp_path, "--prompt-format", "text", "--tokenizer", str(tok), "--no-ignore-eos",
                "--num-prompts", "3", "--input-len", "10", "--output-len", "2", "--save-result",
                "--result-filename", "t.json")
    assert rc == 0
    assert json.loads((tmp_path / "t.json").read_text())["total_input_tokens"] == 30
    assert all(isinstance(b["prompt"], str) and len(b["prompt"].split()) == 10 and "ignore_eos" not in b
               for b in state.bodies)


def test_server_down_fails_cleanly(tmp_path: Path) -> None:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    assert _serve(f"http://127.0.0.1:{port}", tmp_path, "--model", "m", "--num-prompts", "2",
                  "--ready-check-timeout-sec", "0") == 1
