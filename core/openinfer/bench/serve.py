"""`openinfer bench serve`: one run or a request-rate sweep against an OpenAI-compatible server."""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import sys
import time
import uuid
from dataclasses import dataclass, field, replace
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from openinfer.bench import datasets as ds
from openinfer.bench.client import CHAT, COMPLETIONS, RequestOutput, client_group, send_request
from openinfer.bench.multiturn import estimator, first_turn, make_tokenize, run_conversation
from openinfer.bench.progress import Progress
from openinfer.bench.server_metrics import prefix_cache_report, scrape_prefix_counters
from openinfer.bench.stats import compute_metrics, format_table, percentile_key, result_dict
from openinfer.bench.traffic import arrival_offsets, paced


@dataclass
class ServeConfig:
    base_url: str
    model: str
    backend: str = "openai"  # "openai" -> /v1/completions, "openai-chat" -> /v1/chat/completions
    dataset: str = "random"  # "random" | "multi-turn"
    num_prompts: int = 1000
    random_input_len: int = 1024
    random_output_len: int = 128
    random_range_ratio: float = 0.0
    random_prefix_len: int = 0
    prompt_format: str = "ids"  # completions prompt as token ids or as text (needs a tokenizer)
    tokenizer: str | None = None
    vocab_size: int = 32000
    multi_turn_conversations: int = 16
    multi_turn_turns: int = 5
    multi_turn_system_len: int = 0
    multi_turn_user_len: int = 128
    request_rate: float = math.inf
    burstiness: float = 1.0
    max_concurrency: int | None = None
    seed: int = 0
    num_warmups: int = 0
    temperature: float = 0.0
    ignore_eos: bool = True
    extra_body: dict[str, Any] = field(default_factory=dict)
    goodput: dict[str, float] = field(default_factory=dict)
    metric_percentiles: list[float] = field(default_factory=lambda: [99.0])
    percentile_metrics: list[str] = field(default_factory=lambda: ["ttft", "tpot", "itl", "e2el"])
    ready_check_timeout_sec: float = 600.0
    disable_tqdm: bool = False
    label: str | None = None
    metadata: dict[str, str] = field(default_factory=dict)

    @property
    def endpoint(self) -> str:
        return CHAT if self.backend == "openai-chat" else COMPLETIONS

    @property
    def sampling(self) -> dict[str, Any]:
        # ignore_eos: synthetic prompts must produce exactly the requested output length (vLLM forces it too).
        eos = {"ignore_eos": True} if self.ignore_eos else {}
        return {"temperature": self.temperature, **eos, **self.extra_body}


@dataclass
class Workload:
    requests: list[ds.BenchRequest] | None  # random dataset
    conversations: list[ds.Conversation] | None  # multi-turn dataset
    probes: list[ds.BenchRequest]  # ready check + warm-ups: fresh prompts, so they warm no measured prefix

    @property
    def num_requests(self) -> int:
        if self.requests is not None:
            return len(self.requests)
        return sum(len(c.user_turns) for c in self.conversations or [])


def build_workload(cfg: ServeConfig, seed: int, tokenizer: Any) -> Workload:
    chat = cfg.endpoint == CHAT
    n_probe = 1 + cfg.num_warmups
    main, side = (ds.PromptMaker(np.random.default_rng(s), cfg.vocab_size, tokenizer) for s in (seed, seed + 10**6))
    if cfg.dataset == "multi-turn":
        def convs(maker: ds.PromptMaker, n: int, turns: int) -> list[ds.Conversation]:
            return ds.multi_turn_conversations(maker, n, turns, cfg.multi_turn_system_len, cfg.multi_turn_user_len,
                                               cfg.random_output_len, as_text=chat)
        est = estimator(tokenizer)
        probes = [first_turn(c, chat, est) for c in convs(side, n_probe, 1)]
        return Workload(None, convs(main, cfg.multi_turn_conversations, cfg.multi_turn_turns), probes)
    fmt = "chat" if chat else cfg.prompt_format
    if fmt != "ids" and tokenizer is None:
        raise ValueError("text prompts (--prompt-format text or --backend openai-chat) need --tokenizer DIR "
                         "to reach exact token lengths")
    make = lambda maker, n: ds.random_requests(maker, n, cfg.random_input_len, cfg.random_output_len,  # noqa: E731
                                               cfg.random_range_ratio, cfg.random_prefix_len, fmt)
    return Workload(make(main, cfg.num_prompts), None, make(side, n_probe))


async def ready_check(client: httpx.AsyncClient, cfg: ServeConfig, probe: ds.BenchRequest) -> RequestOutput:
    """Retries one request until it succeeds or the timeout passes (the server may still be loading)."""
    deadline = time.monotonic() + cfg.ready_check_timeout_sec
    while True:
        out = await send_request(client, cfg.endpoint, cfg.model, probe, cfg.sampling, "bench-ready")
        if out.success or time.monotonic() >= deadline:
            return out
        await asyncio.sleep(1.0)


async def _measure(clients: list[httpx.AsyncClient], cfg: ServeConfig, wl: Workload, rate: float,
                   rng: np.random.Generator, tokenizer: Any) -> list[RequestOutput]:
    limiter = asyncio.Semaphore(cfg.max_concurrency) if cfg.max_concurrency else None
    progress = Progress(wl.num_requests, desc=f"rate {rate}", disable=cfg.disable_tqdm)
    rid = f"bench-{uuid.uuid4().hex[:8]}-"

    async def one(i: int) -> list[RequestOutput]:
        assert wl.requests is not None
        async with limiter or contextlib.nullcontext():
            out = await send_request(clients[i % len(clients)], cfg.endpoint, cfg.model, wl.requests[i], cfg.sampling,
                                     f"{rid}{i}")
        progress.update()
        return [out]

    async def conversation(i: int) -> list[RequestOutput]:
        assert wl.conversations is not None
        return await run_conversation(clients[i % len(clients)], cfg.endpoint, cfg.model, wl.conversations[i],
                                      cfg.sampling, tokenize, est, f"{rid}{i}", limiter, progress.update)

    tokenize, est = make_tokenize(clients[0], cfg.model, tokenizer), estimator(tokenizer)
    # Multi-turn: the arrival process paces conversation starts; turns within one follow back to back.
    job, n = (one, len(wl.requests)) if wl.requests is not None else (conversation, len(wl.conversations or []))
    tasks = [asyncio.create_task(job(i)) async for i in paced(arrival_offsets(n, rate, cfg.burstiness, rng))]
    results = await asyncio.gather(*tasks)
    progress.close()
    return [o for group in results for o in group]


async def run_point(cfg: ServeConfig, rate: float, seed: int, tokenizer: Any = None) -> dict[str, Any]:
    """One benchmark point: ready check, warm-ups, timed run, metrics. Returns vLLM's result dict."""
    wl = build_workload(cfg, seed, tokenizer)
    async with client_group(cfg.base_url, cfg.max_concurrency or wl.num_requests) as clients:
        client = clients[0]
        ready = await ready_check(client, cfg, wl.probes[0])
        if not ready.success:
            raise RuntimeError(f"server not ready after {cfg.ready_check_timeout_sec:g}s: {ready.error}")
        if cfg.num_warmups:
            await asyncio.gather(*(send_request(client, cfg.endpoint, cfg.model, p, cfg.sampling, f"bench-warmup-{i}")
                                   for i, p in enumerate(wl.probes[1:])))
        before = await scrape_prefix_counters(client)
        t0 = time.perf_counter()
        outputs = await _measure(clients, cfg, wl, rate, np.random.default_rng(seed), tokenizer)
        duration = time.perf_counter() - t0
        after = await scrape_prefix_counters(client)
    count = (lambda text: ds.count_tokens(tokenizer, text)) if tokenizer is not None else None
    m = compute_metrics(outputs, duration, cfg.metric_percentiles, cfg.percentile_metrics, cfg.goodput or None, count)
    res: dict[str, Any] = {
        "date": datetime.now().strftime("%Y%m%d-%H%M%S"),
        "endpoint_type": cfg.backend,
        "backend": cfg.backend,
        "label": cfg.label,
        "model_id": cfg.model,
        "tokenizer_id": cfg.tokenizer or cfg.model,
        "num_prompts": len(outputs),
        "request_rate": "inf" if math.isinf(rate) else rate,
        "burstiness": cfg.burstiness,
        "max_concurrency": cfg.max_concurrency,
        "dataset_name": cfg.dataset,
        "seed": seed,
        **cfg.metadata,
    }
    res.update(result_dict(m, duration, outputs, detailed=True))
    res.update(prefix_cache_report(before, after, [o.cached_tokens for o in outputs if o.success], m.total_input))
    return res


DETAILED_KEYS = ("input_lens", "output_lens", "ttfts", "itls", "generated_texts", "errors")


def result_filename(res: dict[str, Any]) -> str:
    """vLLM's name: {label}-{rate}qps[-concurrency{c}]-{model}-{date}.json."""
    rate = res["request_rate"]
    conc = f"-concurrency{res['max_concurrency']}" if res.get("max_concurrency") else ""
    label = res.get("label") or res["endpoint_type"]
    return f"{label}-{float(rate)}qps{conc}-{res['model_id'].split('/')[-1]}-{res['date']}.json"


def save_result(res: dict[str, Any], directory: Path, name: str | None, detailed: bool) -> Path:
    data = res if detailed else {k: v for k, v in res.items() if k not in DETAILED_KEYS}
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / (name or result_filename(res))
    path.write_text(json.dumps(data, indent=2))
    return path


def sweep_table(results: list[dict[str, Any]], tail: str) -> str:
    head = f"{'rate':>8} {'conc':>6} {'ok':>6} {'fail':>5} {'req/s':>8} {'out tok/s':>10} {'TTFT ms':>9} " \
           f"{tail + ' TTFT':>9} {'TPOT ms':>9} {tail + ' TPOT':>9}"
    rows = [head, "-" * len(head)]
    for r in results:
        rows.append(f"{r['request_rate']!s:>8} {r['max_concurrency'] or '-'!s:>6} {r['completed']:>6} {r['failed']:>5} "
                    f"{r['request_throughput']:>8.2f} "
                    f"{r['output_throughput']:>10.1f} {r.get('mean_ttft_ms', 0):>9.2f} "
                    f"{r.get(f'{tail}_ttft_ms', 0):>9.2f} {r.get('mean_tpot_ms', 0):>9.2f} "
                    f"{r.get(f'{tail}_tpot_ms', 0):>9.2f}")
    return "\n".join(rows)


def run(cfg: ServeConfig, points: list[tuple[float, int | None]], result_dir: Path, save: bool, detailed: bool,
        filename: str | None) -> int:
    """One point, or a sweep of (request rate, max concurrency) points: a fresh seed per point, a JSON per point
    and a PNG."""
    tokenizer = ds.load_tokenizer(cfg.tokenizer)
    results: list[dict[str, Any]] = []
    for i, (rate, concurrency) in enumerate(points):
        res = asyncio.run(run_point(replace(cfg, max_concurrency=concurrency), rate, cfg.seed + i, tokenizer))
        results.append(res)
        print(format_table(res), flush=True)
        if save or len(points) > 1:
            path = save_result(res, result_dir, filename if len(points) == 1 else None, detailed)
            print(f"result saved to {path}", file=sys.stderr)
    if len(points) == 1:
        return 0
    tail = percentile_key(max(cfg.metric_percentiles))
    print(sweep_table(results, tail))
    from openinfer.bench.plot import plot_sweep

    label = cfg.label or cfg.backend
    png = result_dir / f"{label}-sweep-{cfg.model.split('/')[-1]}-{results[0]['date']}.png"
    by = "max_concurrency" if len({c for _, c in points}) > 1 else "request_rate"
    try:
        print(f"plot saved to {plot_sweep(results, png, tail, by)}", file=sys.stderr)
    except RuntimeError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0
