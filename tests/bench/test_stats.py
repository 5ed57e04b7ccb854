"""Pure statistics on injected numbers (binary-exact times, so bucket edges are exact)."""

from __future__ import annotations

import numpy as np
import pytest

from openinfer.bench.client import RequestOutput
from openinfer.bench.stats import compute_metrics, format_table, parse_goodput, result_dict, summarize


def _outputs() -> list[RequestOutput]:
    return [
        # start 0, chunks at 0.25, 0.5, 0.75, 1.0 -> tpot (1.0 - 0.25) / 3 = 0.25
        RequestOutput(True, "", 10, 4, 0.25, [0.25] * 3, 1.0, 0.0, "abcd"),
        # start 0.5, chunks at 1.0 .. 1.5 -> tpot (1.5 - 0.5) / 4 = 0.25
        RequestOutput(True, "", 20, 5, 0.5, [0.125] * 4, 1.5, 0.5, "abcde"),
        RequestOutput(False, "HTTP 500: injected", 99),
        # one output token: no TPOT sample, but tpot 0 for goodput
        RequestOutput(True, "", 30, 1, 0.75, [], 0.75, 1.0, "a"),
    ]


def test_counts_and_throughput() -> None:
    m = compute_metrics(_outputs(), duration=2.0)
    assert (m.completed, m.failed) == (3, 1)
    assert (m.total_input, m.total_output) == (60, 10)
    assert m.output_lens == [4, 5, 0, 1]
    assert m.request_throughput == 1.5
    assert m.output_throughput == 5.0
    assert m.total_token_throughput == 35.0
    assert m.request_goodput is None


def test_latency_summaries_exact() -> None:
    m = compute_metrics(_outputs(), duration=2.0, percentiles=[50, 90, 99])
    ttft = m.summaries["ttft"]
    assert ttft["mean"] == pytest.approx(500.0)
    assert ttft["median"] == pytest.approx(500.0)
    assert ttft["p90"] == pytest.approx(700.0)  # linear interpolation: 0.5 + 0.8 * 0.25
    assert ttft["p99"] == pytest.approx(745.0)
    assert ttft["std"] == pytest.approx(np.std([250, 500, 750]))
    assert m.summaries["tpot"]["mean"] == pytest.approx(250.0)  # the 1-token request has no TPOT
    assert m.summaries["itl"]["mean"] == pytest.approx((0.75 + 0.5) / 7 * 1000)
    assert m.summaries["e2el"]["median"] == pytest.approx(1000.0)


def test_peaks() -> None:
    m = compute_metrics(_outputs(), duration=2.0)
    # second 0: 3 chunks of A; second 1: A's last, B's 5, D's 1
    assert m.max_output_tokens_per_s == 7.0
    assert m.max_concurrent_requests == 3


@pytest.mark.parametrize(("slo", "expected"), [
    (["ttft:600"], 1.0),  # A, B
    (["tpot:100"], 0.5),  # only D (tpot 0)
    (["ttft:600", "e2el:1000"], 0.5),  # A only: SLOs are ANDed
    (["ttft:1000", "tpot:300", "e2el:2000"], 1.5),
])
def test_goodput(slo: list[str], expected: float) -> None:
    m = compute_metrics(_outputs(), duration=2.0, goodput=parse_goodput(slo))
    assert m.request_goodput == pytest.approx(expected)


def test_parse_goodput_errors() -> None:
    assert parse_goodput(["ttft:1.5"]) == {"ttft": 1.5}
    for bad in (["itl:5"], ["ttft"], ["ttft:-1"]):
        with pytest.raises(ValueError):
            parse_goodput(bad)


def test_missing_usage_falls_back() -> None:
    o = RequestOutput(True, "", 5, None, 0.1, [0.1, 0.1], 0.3, 0.0, "hello world")
    assert compute_metrics([o], 1.0).total_output == 3  # chunks
    assert compute_metrics([o], 1.0, count_tokens=lambda t: len(t.split())).total_output == 2


def test_empty_lists_give_zero_like_vllm() -> None:
    m = compute_metrics([RequestOutput(False, "x")], 1.0)
    assert m.completed == 0 and m.summaries["ttft"] == {"mean": 0.0, "median": 0.0, "std": 0.0, "p99": 0.0}
    assert summarize([], [50, 99.9]) == {"mean": 0.0, "median": 0.0, "std": 0.0, "p50": 0.0, "p99.9": 0.0}


def test_result_keys_match_vllm() -> None:
    outs = _outputs()
    m = compute_metrics(outs, 2.0, percentiles=[50, 99.9], goodput={"ttft": 600})
    res = result_dict(m, 2.0, outs, detailed=True)
    expected = {"duration", "completed", "failed", "total_input_tokens", "total_output_tokens",
                "request_throughput", "request_goodput", "output_throughput", "total_token_throughput",
                "max_output_tokens_per_s", "max_concurrent_requests",
                "input_lens", "output_lens", "ttfts", "itls", "generated_texts", "errors"}
    for metric in ("ttft", "tpot", "itl", "e2el"):
        expected |= {f"{s}_{metric}_ms" for s in ("mean", "median", "std", "p50", "p99.9")}
    assert set(res) == expected
    assert res["errors"][2] == "HTTP 500: injected"
    assert "input_lens" not in result_dict(m, 2.0, outs, detailed=False)
    table = format_table(res)
    assert "Successful requests:                     3" in table
    assert "  1 x HTTP 500: injected" in table   # the failure's reason, not only the count
    assert "Request goodput (req/s):                 1.00" in table
    assert "P99.9 TTFT (ms):" in table and "Mean E2EL (ms):" in table
