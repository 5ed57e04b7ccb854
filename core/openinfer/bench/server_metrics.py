"""Prefix-cache hit rate from the server's Prometheus `/metrics` (vLLM-compatible counter names)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Sequence

import httpx

QUERIES = "vllm:prefix_cache_queries"
HITS = "vllm:prefix_cache_hits"


@dataclass(frozen=True)
class PrefixCounters:
    queries: float
    hits: float


def parse_counter(text: str, name: str) -> float | None:
    """Sum of a counter over all label sets; accepts the `_total` suffix Prometheus clients add."""
    total, seen = 0.0, False
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        if "{" in line.split(" ", 1)[0]:
            metric, _, labelled = line.partition("{")
            rest = labelled.rsplit("}", 1)[-1]  # label values may contain spaces
        else:
            metric, _, rest = line.partition(" ")
        if metric in (name, name + "_total"):
            try:
                value = float(rest.split()[0])
            except (ValueError, IndexError):
                continue
            if not math.isnan(value):
                total += value
                seen = True
    return total if seen else None


def parse_prefix_counters(text: str) -> PrefixCounters | None:
    q, h = parse_counter(text, QUERIES), parse_counter(text, HITS)
    return PrefixCounters(q, h) if q is not None and h is not None else None


async def scrape_prefix_counters(client: httpx.AsyncClient) -> PrefixCounters | None:
    """None when the server has no /metrics or does not export the counters (not an error)."""
    try:
        resp = await client.get("/metrics")
    except httpx.HTTPError:
        return None
    return parse_prefix_counters(resp.text) if resp.status_code == 200 else None


def prefix_cache_report(
    before: PrefixCounters | None,
    after: PrefixCounters | None,
    cached_tokens: Sequence[int | None],
    total_input_tokens: int,
) -> dict[str, Any]:
    """Two figures: the server's counter deltas, and usage.cached_tokens summed over requests."""
    rep: dict[str, Any] = {"prefix_cache_queries": None, "prefix_cache_hits": None, "prefix_cache_hit_rate": None}
    if before is not None and after is not None:
        dq, dh = after.queries - before.queries, after.hits - before.hits
        rep.update(prefix_cache_queries=dq, prefix_cache_hits=dh, prefix_cache_hit_rate=dh / dq if dq > 0 else None)
    known = [c for c in cached_tokens if c is not None]
    rep["cached_tokens"] = sum(known) if known else None
    rep["cached_token_ratio"] = sum(known) / total_input_tokens if known and total_input_tokens else None
    return rep
