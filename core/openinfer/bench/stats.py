"""Pure aggregation of request outputs into vLLM `bench serve` metrics, result JSON and the printed table."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import numpy as np

from openinfer.bench.client import RequestOutput

METRIC_NAMES = {"ttft": "Time to First Token", "tpot": "Time per Output Token (excl. 1st token)",
                "itl": "Inter-token Latency", "e2el": "End-to-end Latency"}
GOODPUT_METRICS = ("ttft", "tpot", "e2el")
FAILURE_REASONS = 3    # distinct errors of failed requests the table names


@dataclass
class Metrics:
    completed: int
    failed: int
    total_input: int
    total_output: int
    request_throughput: float
    request_goodput: float | None
    output_throughput: float
    total_token_throughput: float
    max_output_tokens_per_s: float
    max_concurrent_requests: int
    output_lens: list[int]
    # metric -> {"mean": ms, "median": ms, "std": ms, "p99": ms, ...}
    summaries: dict[str, dict[str, float]] = field(default_factory=dict)


def parse_goodput(items: Sequence[str] | None) -> dict[str, float]:
    """`["ttft:500", "tpot:50"]` -> {"ttft": 500.0, "tpot": 50.0} (milliseconds)."""
    slos: dict[str, float] = {}
    for item in items or ():
        name, sep, value = item.partition(":")
        if not sep or name not in GOODPUT_METRICS:
            raise ValueError(f"bad --goodput item {item!r}: expected NAME:MS with NAME in {', '.join(GOODPUT_METRICS)}")
        ms = float(value)
        if ms < 0:
            raise ValueError(f"bad --goodput item {item!r}: the SLO must be >= 0 ms")
        slos[name] = ms
    return slos


def percentile_key(p: float) -> str:
    return f"p{int(p) if float(p).is_integer() else p}"


def summarize(values_s: Sequence[float], percentiles: Sequence[float]) -> dict[str, float]:
    """mean/median/std and np.percentile (linear interpolation) in ms; an empty list gives zeros like vLLM."""
    arr = np.asarray(values_s if len(values_s) else [0.0], dtype=np.float64) * 1000.0
    out = {"mean": float(arr.mean()), "median": float(np.median(arr)), "std": float(arr.std())}
    for p in percentiles:
        out[percentile_key(p)] = float(np.percentile(arr, p))
    return out


def peaks(outputs: Sequence[RequestOutput]) -> tuple[float, int]:
    """Peak output chunks per 1-s bucket and peak concurrent requests, vLLM's definition."""
    ok = [o for o in outputs if o.success]
    if not ok:
        return 0.0, 0
    t_min = min(o.start_time for o in ok)
    n_buckets = int(np.ceil(max(o.start_time + o.latency for o in ok) - t_min)) + 1
    tokens = np.zeros(n_buckets)
    conc = np.zeros(n_buckets)
    for o in ok:
        times = o.start_time + o.ttft + np.concatenate([[0.0], np.cumsum(o.itl)])
        for b in (times - t_min).astype(int):
            if 0 <= b < n_buckets:
                tokens[b] += 1
        conc[int(o.start_time - t_min): int(o.start_time + o.latency - t_min) + 1] += 1
    return float(tokens.max()), int(conc.max())


def compute_metrics(
    outputs: Sequence[RequestOutput],
    duration: float,
    percentiles: Sequence[float] = (99,),
    selected: Sequence[str] = ("ttft", "tpot", "itl", "e2el"),
    goodput: dict[str, float] | None = None,
    count_tokens: Callable[[str], int] | None = None,
) -> Metrics:
    """`count_tokens` re-tokenizes generated text when a server sent no usage; without it, chunks are counted."""
    output_lens: list[int] = []
    ttfts: list[float] = []
    tpots: list[float] = []
    all_tpots: list[float] = []  # with 0 for 1-token outputs, so goodput sees every completed request
    itls: list[float] = []
    e2els: list[float] = []
    total_input = 0
    for o in outputs:
        if not o.success:
            output_lens.append(0)
            continue
        n = o.output_tokens
        if n is None:
            n = count_tokens(o.generated_text) if count_tokens else len(o.itl) + 1
        output_lens.append(n)
        total_input += o.prompt_len
        tpot = (o.latency - o.ttft) / (n - 1) if n > 1 else 0.0
        if n > 1:
            tpots.append(tpot)
        all_tpots.append(tpot)
        itls.extend(o.itl)
        ttfts.append(o.ttft)
        e2els.append(o.latency)
    completed = len(ttfts)
    good: float | None = None
    if goodput:
        per_metric = {"ttft": ttfts, "tpot": all_tpots, "e2el": e2els}
        limits = [(per_metric[k], v / 1000.0) for k, v in goodput.items()]
        n_good = sum(all(vals[i] <= slo for vals, slo in limits) for i in range(completed))
        good = n_good / duration
    total_output = sum(output_lens)
    peak_tok, peak_conc = peaks(outputs)
    series = {"ttft": ttfts, "tpot": tpots, "itl": itls, "e2el": e2els}
    return Metrics(
        completed=completed,
        failed=len(outputs) - completed,
        total_input=total_input,
        total_output=total_output,
        request_throughput=completed / duration,
        request_goodput=good,
        output_throughput=total_output / duration,
        total_token_throughput=(total_input + total_output) / duration,
        max_output_tokens_per_s=peak_tok,
        max_concurrent_requests=peak_conc,
        output_lens=output_lens,
        summaries={m: summarize(series[m], percentiles) for m in selected},
    )


def result_dict(m: Metrics, duration: float, outputs: Sequence[RequestOutput], detailed: bool) -> dict[str, Any]:
    """The benchmark part of vLLM's result JSON (the caller prepends date, model_id, request_rate, ...)."""
    res: dict[str, Any] = {
        "duration": duration,
        "completed": m.completed,
        "failed": m.failed,
        "total_input_tokens": m.total_input,
        "total_output_tokens": m.total_output,
        "request_throughput": m.request_throughput,
        "request_goodput": m.request_goodput,
        "output_throughput": m.output_throughput,
        "total_token_throughput": m.total_token_throughput,
        "max_output_tokens_per_s": m.max_output_tokens_per_s,
        "max_concurrent_requests": m.max_concurrent_requests,
    }
    if detailed:
        res.update(input_lens=[o.prompt_len for o in outputs], output_lens=m.output_lens,
                   ttfts=[o.ttft for o in outputs], itls=[o.itl for o in outputs],
                   generated_texts=[o.generated_text for o in outputs], errors=[o.error for o in outputs])
    for metric, summary in m.summaries.items():
        for stat, value in summary.items():
            res[f"{stat}_{metric}_ms"] = value
    return res


def format_table(res: dict[str, Any], title: str = "Serving Benchmark Result") -> str:
    """vLLM's end-of-run table, built from a result dict (so it also works on a loaded JSON file)."""
    lines = [f"{' ' + title + ' ':=^50}"]

    def row(label: str, value: Any) -> None:
        lines.append(f"{label:<40} {value:<10.2f}" if isinstance(value, float) else f"{label:<40} {value!s:<10}")

    row("Successful requests:", res["completed"])
    row("Failed requests:", res["failed"])
    reasons = Counter(e for e in res.get("errors", ()) if e)   # why they failed: a count is not a diagnosis
    for error, n in reasons.most_common(FAILURE_REASONS):
        lines.append(f"  {n} x {error[:200]}")
    if res.get("max_concurrency") is not None:
        row("Maximum request concurrency:", res["max_concurrency"])
    if "request_rate" in res:
        row("Request rate configured (RPS):", res["request_rate"])
    row("Benchmark duration (s):", res["duration"])
    row("Total input tokens:", res["total_input_tokens"])
    row("Total generated tokens:", res["total_output_tokens"])
    row("Request throughput (req/s):", res["request_throughput"])
    if res.get("request_goodput") is not None:
        row("Request goodput (req/s):", res["request_goodput"])
    row("Output token throughput (tok/s):", res["output_throughput"])
    row("Peak output token throughput (tok/s):", res["max_output_tokens_per_s"])
    row("Peak concurrent requests:", res["max_concurrent_requests"])
    row("Total token throughput (tok/s):", res["total_token_throughput"])
    if res.get("prefix_cache_hit_rate") is not None:
        row("Prefix cache hit rate (server):", res["prefix_cache_hit_rate"])
    if res.get("cached_token_ratio") is not None:
        row("Cached prompt tokens (usage):", res["cached_token_ratio"])
    for metric, name in METRIC_NAMES.items():
        keys = [k for k in res if k.endswith(f"_{metric}_ms") and not k.startswith("std_")]
        if not keys:
            continue
        lines.append(f"{name:-^50}")
        for k in keys:
            stat = k[: -len(f"_{metric}_ms")]
            row(f"{stat.capitalize() if stat in ('mean', 'median') else stat.upper()} {metric.upper()} (ms):", res[k])
    lines.append("=" * 50)
    return "\n".join(lines)
