"""Prometheus text exposition (format 0.0.4) at /metrics, with vLLM's metric names.

Written by hand (no prometheus_client): latency histograms are observed here by the server,
per served model name; gauges and token / prefix-cache counters come from engine.stats().
Everything runs on the event loop thread, so there are no locks.
"""
from __future__ import annotations

import bisect
import math
from collections import Counter
from dataclasses import dataclass, field
from typing import Iterable

# vLLM's bucket boundaries, so dashboards built for vLLM read ours unchanged
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
                20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
ITL_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
               40.0, 80.0)
E2E_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0,
               480.0, 960.0, 1920.0, 7680.0)


@dataclass
class Histogram:
    buckets: tuple[float, ...]
    counts: list[int] = field(default_factory=list)   # per bucket, not cumulative; last is +Inf
    sum: float = 0.0
    count: int = 0

    def __post_init__(self) -> None:
        self.counts = [0] * (len(self.buckets) + 1)

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.buckets, value)] += 1
        self.sum += value
        self.count += 1


@dataclass
class ModelMetrics:
    """What the server observes for one served model name."""
    ttft: Histogram = field(default_factory=lambda: Histogram(TTFT_BUCKETS))
    itl: Histogram = field(default_factory=lambda: Histogram(ITL_BUCKETS))
    e2e: Histogram = field(default_factory=lambda: Histogram(E2E_BUCKETS))
    success: Counter[str] = field(default_factory=Counter)   # finished requests by finish_reason


def _num(v: float) -> str:
    if math.isinf(v):
        return "+Inf" if v > 0 else "-Inf"
    return repr(float(v))


def _labels(**labels: str) -> str:
    def esc(v: str) -> str:
        return v.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')
    return "{" + ",".join(f'{k}="{esc(v)}"' for k, v in labels.items()) + "}"


def _family(out: list[str], name: str, kind: str, help: str, samples: Iterable[tuple[str, str, float]]) -> None:
    out += [f"# HELP {name} {help}", f"# TYPE {name} {kind}"]
    out += [f"{metric}{labels} {_num(value)}" for metric, labels, value in samples]


def _histogram(name: str, items: list[tuple[str, Histogram]]) -> Iterable[tuple[str, str, float]]:
    for model, h in items:
        cumulative = 0
        for le, c in zip([*h.buckets, math.inf], h.counts):
            cumulative += c
            yield f"{name}_bucket", _labels(le=_num(le), model_name=model), cumulative
        yield f"{name}_sum", _labels(model_name=model), h.sum
        yield f"{name}_count", _labels(model_name=model), h.count


def render(models: list[tuple[str, ModelMetrics, object]]) -> str:
    """models: (served name, its metrics, engine.stats() of its engine)."""
    out: list[str] = []

    def gauge_or_counter(name: str, kind: str, help: str, attr: str) -> None:
        _family(out, name, kind, help, ((name, _labels(model_name=m), getattr(s, attr)) for m, _, s in models))

    gauge_or_counter("vllm:num_requests_running", "gauge", "Number of requests in model execution batches.",
                     "num_running")
    gauge_or_counter("vllm:num_requests_waiting", "gauge", "Number of requests waiting to be processed.",
                     "num_waiting")
    gauge_or_counter("vllm:kv_cache_usage_perc", "gauge", "KV-cache usage. 1 means 100 percent usage.", "kv_usage")
    gauge_or_counter("vllm:prefix_cache_queries_total", "counter",
                     "Prefix cache queries, in terms of number of queried tokens.", "prefix_queries")
    gauge_or_counter("vllm:prefix_cache_hits_total", "counter",
                     "Prefix cache hits, in terms of number of cached tokens.", "prefix_hits")
    gauge_or_counter("vllm:prompt_tokens_total", "counter", "Number of prefill tokens processed.", "prompt_tokens")
    gauge_or_counter("vllm:generation_tokens_total", "counter", "Number of generation tokens processed.",
                     "generation_tokens")
    _family(out, "vllm:cache_config_info", "gauge", "Information of the LLMEngine CacheConfig",
            (("vllm:cache_config_info", _cache_labels(m, s), 1) for m, _, s in models
             if getattr(s, "num_blocks", None) is not None))
    _offload_families(out, [(m, s.offload) for m, _, s in models if getattr(s, "offload", None) is not None])
    _family(out, "vllm:request_success_total", "counter", "Count of successfully processed requests.",
            (("vllm:request_success_total", _labels(finished_reason=r, model_name=m), n)
             for m, mm, _ in models for r, n in sorted(mm.success.items())))
    for name, attr, help in (
            ("vllm:time_to_first_token_seconds", "ttft", "Histogram of time to first token in seconds."),
            ("vllm:inter_token_latency_seconds", "itl", "Histogram of inter-token latency in seconds."),
            ("vllm:e2e_request_latency_seconds", "e2e", "Histogram of end to end request latency in seconds.")):
        _family(out, name, "histogram", help, _histogram(name, [(m, getattr(mm, attr)) for m, mm, _ in models]))
    return "\n".join(out) + "\n"


def _cache_labels(model: str, s: object) -> str:
    """vLLM's cache_config_info labels that apply here; clients size workloads from them (bench prefix)."""
    offload = getattr(s, "offload", None)
    cpu = {} if offload is None else {"num_cpu_blocks": str(offload.capacity_blocks)}
    return _labels(block_size=str(s.block_size), model_name=model, num_gpu_blocks=str(s.num_blocks), **cpu)


def _offload_families(out: list[str], models: list[tuple[str, object]]) -> None:
    """The host offload tier (--kv-offload), for the models that run one; no vLLM names exist for it."""
    if not models:
        return
    for name, kind, help, attr in (
            ("openinfer:kv_offload_saved_blocks_total", "counter", "KV blocks copied from device to host memory.",
             "saved_blocks"),
            ("openinfer:kv_offload_saved_ahead_blocks_total", "counter",
             "Of the saved KV blocks, those saved ahead of eviction (in the background, to keep clean blocks ready).",
             "saved_ahead_blocks"),
            ("openinfer:kv_offload_restored_blocks_total", "counter",
             "KV blocks copied from host memory back to the device.", "restored_blocks"),
            ("openinfer:kv_offload_dropped_blocks_total", "counter",
             "Evicted KV blocks not saved because every host slot was being restored.", "dropped_blocks"),
            ("openinfer:kv_offload_host_usage_perc", "gauge", "Host offload tier usage. 1 means 100 percent usage.",
             "usage"),
            ("openinfer:kv_offload_host_capacity_blocks", "gauge", "Blocks the host offload tier holds.",
             "capacity_blocks"),
            ("openinfer:kv_offload_queries_total", "counter",
             "Prompt tokens looked up in the host tier (past the device prefix-cache hits).", "queries"),
            ("openinfer:kv_offload_hits_total", "counter", "Prompt tokens restored from the host tier.", "hits"),
            ("openinfer:kv_offload_hit_rate", "gauge",
             "Host tier hits / queries since start (rate() of the two counters gives it per interval).", "hit_rate")):
        _family(out, name, kind, help, ((name, _labels(model_name=m), getattr(o, attr)) for m, o in models))
