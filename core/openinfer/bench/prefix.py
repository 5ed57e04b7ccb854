"""`openinfer bench prefix`: the TTFT ladder for an N-token prompt — cold prefill, warm hit in device memory
and (with --host-restore) restore from the host offload tier after filler prompts evicted it.

The host rung needs the prompt pushed out of device memory: fillers of fresh tokens, as many as the device
pool holds plus one prompt (read from the server's `vllm:cache_config_info`, or --evict-tokens). Each host
sample also records how many blocks the server restored from host memory during it
(`openinfer:kv_offload_restored_blocks_total`), so a sample that was not a restore shows as one."""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import re
import sys
from dataclasses import asdict, dataclass
from typing import Any, Sequence

import httpx
import numpy as np

from openinfer.bench.client import COMPLETIONS, make_client, send_request
from openinfer.bench.datasets import BenchRequest, PromptMaker
from openinfer.bench.server_metrics import parse_counter

RESTORED = "openinfer:kv_offload_restored_blocks"


@dataclass
class Sample:
    length: int
    tier: str
    ttft_s: float
    cached_tokens: int | None
    restored_blocks: float | None = None   # host tier restores during this request (host rung only)


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
    median_restored_blocks: float | None = None


def summarize_ladder(samples: Sequence[Sample]) -> list[TierSummary]:
    """One row per (length, tier) in the order measured; np.percentile with linear interpolation."""
    keys = list(dict.fromkeys((s.length, s.tier) for s in samples))
    rows = []
    for length, tier in keys:
        group = [s for s in samples if s.length == length and s.tier == tier]
        ms = np.array([s.ttft_s for s in group]) * 1000.0
        cached = [s.cached_tokens for s in group if s.cached_tokens is not None]
        restored = [s.restored_blocks for s in group if s.restored_blocks is not None]
        rows.append(TierSummary(length, tier, len(group), float(ms.mean()), float(np.percentile(ms, 50)),
                                float(np.percentile(ms, 99)), float(np.median(cached)) if cached else None,
                                ms.tolist(), float(np.median(restored)) if restored else None))
    return rows


def parse_device_pool_tokens(text: str, model: str) -> int | None:
    """num_gpu_blocks * block_size from `vllm:cache_config_info` (the model's line, else the first)."""
    found = []
    for line in text.splitlines():
        if line.startswith("vllm:cache_config_info{"):
            labels = dict(re.findall(r'(\w+)="([^"]*)"', line.partition("{")[2].rpartition("}")[0]))
            if "num_gpu_blocks" in labels and "block_size" in labels:
                found.append((labels.get("model_name") == model, int(labels["num_gpu_blocks"]) * int(labels["block_size"])))
    return max(found)[1] if found else None


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

    async def metrics(self) -> str | None:
        try:
            resp = await self.client.get("/metrics")
        except httpx.HTTPError:
            return None
        return resp.text if resp.status_code == 200 else None

    async def restored(self) -> float | None:
        text = await self.metrics()
        return None if text is None else parse_counter(text, RESTORED)

    async def host_ttft(self, ids: list[int], length: int) -> Sample:
        before = await self.restored()
        sample = await self.ttft(ids, length, "host")
        after = await self.restored()
        if before is not None and after is not None:
            sample.restored_blocks = after - before
        return sample

    async def evict_tokens(self, length: int, given: int) -> int:
        if given > 0:
            return given
        text = await self.metrics()
        pool = None if text is None else parse_device_pool_tokens(text, self.model)
        if pool is None:
            raise RuntimeError("--host-restore: the server reports no device pool size (vllm:cache_config_info "
                               "on /metrics); pass --evict-tokens N, more than its device prefix cache holds")
        return pool + length

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
                    await run.evict(maker, length, await run.evict_tokens(length, evict_tokens), evict_concurrency)
                    samples.append(await run.host_ttft(ids, length))
    return samples


def format_ladder(rows: Sequence[TierSummary]) -> str:
    head = (f"{'tokens':>8} {'tier':<6} {'n':>3} {'mean ms':>10} {'p50 ms':>10} {'p99 ms':>10} {'cached':>8} "
            f"{'restored':>8}")
    lines = [head, "-" * len(head)]
    for r in rows:
        cached = "-" if r.median_cached_tokens is None else f"{r.median_cached_tokens:.0f}"
        restored = "-" if r.median_restored_blocks is None else f"{r.median_restored_blocks:.0f}"
        lines.append(f"{r.length:>8} {r.tier:<6} {r.n:>3} {r.mean_ttft_ms:>10.2f} {r.p50_ttft_ms:>10.2f} "
                     f"{r.p99_ttft_ms:>10.2f} {cached:>8} {restored:>8}")
    return "\n".join(lines)


def not_restored(samples: Sequence[Sample]) -> list[Sample]:
    """Host samples the server's counter says restored nothing (the prompt was still on the device, or gone)."""
    return [s for s in samples if s.tier == "host" and s.restored_blocks == 0]


def run_prefix(args: argparse.Namespace, model: str) -> int:
    if args.repeats < 1 or any(n < 2 for n in args.lengths):
        raise ValueError("--repeats must be >= 1 and every length >= 2 tokens")
    samples = asyncio.run(ladder(args.base_url, model, args.lengths, args.repeats, args.output_len, args.vocab_size,
                                 args.seed, args.host_restore, args.evict_tokens, args.evict_concurrency))
    rows = summarize_ladder(samples)
    print(format_ladder(rows))
    if args.host_restore and all(s.restored_blocks is None for s in samples if s.tier == "host"):
        print(f"warning: the server exports no {RESTORED} counter (is it serving with --kv-offload?); "
              "host samples cannot be told from device hits or cold prefills", file=sys.stderr)
    for s in not_restored(samples):
        print(f"warning: a host sample of {s.length} tokens restored no block from the host tier "
              f"(cached {s.cached_tokens}); raise --evict-tokens or the server's --kv-offload-host-gib",
              file=sys.stderr)
    if args.output_json:
        result: dict[str, Any] = {"model_id": model, "lengths": args.lengths, "repeats": args.repeats,
                                  "output_len": args.output_len, "host_restore": args.host_restore,
                                  "evict_tokens": args.evict_tokens, "results": [asdict(r) for r in rows]}
        args.output_json.write_text(json.dumps(result, indent=2))
    return 0
