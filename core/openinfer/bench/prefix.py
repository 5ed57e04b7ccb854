"""`openinfer bench prefix`: the TTFT ladder for an N-token prompt — cold prefill, warm hit in device memory
and (with --host-restore) restore from the host offload tier after filler prompts evicted it."""

from __future__ import annotations

import argparse
import asyncio
import json
import math
from dataclasses import asdict, dataclass
from typing import Any, Sequence

import httpx
import numpy as np

from openinfer.bench.client import COMPLETIONS, make_client, send_request
from openinfer.bench.datasets import BenchRequest, PromptMaker


@dataclass
class Sample:
    length: int
    tier: str
    ttft_s: float
    cached_tokens: int | None


@dataclass
class TierSummary:
    length: int
    tier: str
    n: int
    mean_ttft_ms: float
    p50_ttft_ms: float
    p99_ttft_ms: float
    median_cached_tokens: float | None
    ttfts_ms: list[float]


def summarize_ladder(samples: Sequence[Sample]) -> list[TierSummary]:
    """One row per (length, tier) in the order measured; np.percentile with linear interpolation."""
    keys = list(dict.fromkeys((s.length, s.tier) for s in samples))
    rows = []
    for length, tier in keys:
        group = [s for s in samples if s.length == length and s.tier == tier]
        ms = np.array([s.ttft_s for s in group]) * 1000.0
        cached = [s.cached_tokens for s in group if s.cached_tokens is not None]
        rows.append(TierSummary(length, tier, len(group), float(ms.mean()), float(np.percentile(ms, 50)),
                                float(np.percentile(ms, 99)), float(np.median(cached)) if cached else None,
                                ms.tolist()))
    return rows


class _Runner:
    def __init__(self, client: httpx.AsyncClient, model: str, output_len: int) -> None:
        self.client, self.model, self.output_len = client, model, output_len
        self.sampling = {"temperature": 0.0, "ignore_eos": True}

    async def ttft(self, ids: list[int], length: int, tier: str) -> Sample:
        out = await send_request(self.client, COMPLETIONS, self.model, BenchRequest(ids, length, self.output_len),
                                 self.sampling, f"bench-prefix-{tier}-{length}")
        if not out.success:
            raise RuntimeError(f"{tier} request of {length} tokens failed: {out.error}")
        return Sample(length, tier, out.ttft, out.cached_tokens)

    async def evict(self, maker: PromptMaker, length: int, total_tokens: int, concurrency: int) -> None:
        """Fresh filler prompts until `total_tokens` went through the cache, a few at a time."""
        limiter = asyncio.Semaphore(concurrency)

        async def one(i: int) -> None:
            async with limiter:
                await self.ttft(maker.ids(length), length, f"evict{i}")

        await asyncio.gather(*(one(i) for i in range(math.ceil(total_tokens / length))))


async def ladder(base_url: str, model: str, lengths: Sequence[int], repeats: int, output_len: int, vocab: int,
                 seed: int, host_restore: bool = False, evict_tokens: int = 0,
                 evict_concurrency: int = 8) -> list[Sample]:
    """Per rep: a fresh prompt (cold), the same again (warm: all but the last token should be cached), then
    optionally fillers to push it out of device memory and the same prompt once more (host restore)."""
    maker = PromptMaker(np.random.default_rng(seed), vocab)
    samples: list[Sample] = []
    async with make_client(base_url, max(evict_concurrency, 1)) as client:
        run = _Runner(client, model, output_len)
        # One unmeasured request first: the first request on a fresh client pays one-time costs (~40 ms
        # of connection and import set-up) that would otherwise land in the first cold sample.
        await run.ttft(maker.ids(min(lengths)), min(lengths), "ready")
        for length in lengths:
            for _ in range(repeats):
                ids = maker.ids(length)
                samples.append(await run.ttft(ids, length, "cold"))
                samples.append(await run.ttft(ids, length, "warm"))
                if host_restore:
                    await run.evict(maker, length, evict_tokens, evict_concurrency)
                    samples.append(await run.ttft(ids, length, "host"))
    return samples


def format_ladder(rows: Sequence[TierSummary]) -> str:
    head = f"{'tokens':>8} {'tier':<6} {'n':>3} {'mean ms':>10} {'p50 ms':>10} {'p99 ms':>10} {'cached':>8}"
    lines = [head, "-" * len(head)]
    for r in rows:
        cached = "-" if r.median_cached_tokens is None else f"{r.median_cached_tokens:.0f}"
        lines.append(f"{r.length:>8} {r.tier:<6} {r.n:>3} {r.mean_ttft_ms:>10.2f} {r.p50_ttft_ms:>10.2f} "
                     f"{r.p99_ttft_ms:>10.2f} {cached:>8}")
    return "\n".join(lines)


def run_prefix(args: argparse.Namespace, model: str) -> int:
    if args.repeats < 1 or any(n < 2 for n in args.lengths):
        raise ValueError("--repeats must be >= 1 and every length >= 2 tokens")
    samples = asyncio.run(ladder(args.base_url, model, args.lengths, args.repeats, args.output_len, args.vocab_size,
                                 args.seed, args.host_restore, args.evict_tokens, args.evict_concurrency))
    rows = summarize_ladder(samples)
    print(format_ladder(rows))
    if args.output_json:
        result: dict[str, Any] = {"model_id": model, "lengths": args.lengths, "repeats": args.repeats,
                                  "output_len": args.output_len, "host_restore": args.host_restore,
                                  "evict_tokens": args.evict_tokens, "results": [asdict(r) for r in rows]}
        args.output_json.write_text(json.dumps(result, indent=2))
    return 0
