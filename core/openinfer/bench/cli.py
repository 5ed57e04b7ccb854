"""`openinfer bench serve | latency | startup | prefix | compare`: argument parsing only; each command lives in
its module."""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import Any

from ..engine.engine_args import add_hf_overrides_option, add_kernel_option, add_kv_cache_dtype_option


def _floats(text: str) -> list[float]:
    return [float(x) for x in text.split(",") if x.strip()]


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


def _points(text: str) -> list[tuple[int, int]]:
    """`1x8192,32x8192`: (batch, input length) pairs."""
    points = []
    for item in (x.strip() for x in text.split(",") if x.strip()):
        batch, sep, length = item.partition("x")
        if not (sep and batch.isdigit() and length.isdigit() and int(batch) > 0 and int(length) > 0):
            raise argparse.ArgumentTypeError(f"{item!r} is not BATCHxINPUT (two positive integers, e.g. 1x8192)")
        points.append((int(batch), int(length)))
    if not points:
        raise argparse.ArgumentTypeError("no BATCHxINPUT pair given")
    return points


def resolve_model(base_url: str, model: str | None) -> str:
    """--model defaults to the first id the server lists, as vLLM's client does."""
    import httpx
    if model:
        return model
    resp = httpx.get(base_url.rstrip("/") + "/v1/models", timeout=30.0)
    resp.raise_for_status()
    return resp.json()["data"][0]["id"]


def _endpoint_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--base-url", default="http://127.0.0.1:8000", help="server root (the /v1 paths are added)")
    p.add_argument("--model", default=None, help="model name to request (default: first of GET /v1/models)")
    p.add_argument("--vocab-size", type=int, default=32000, help="token ids are drawn below this")
    p.add_argument("--seed", type=int, default=0)


def _serve_args(p: argparse.ArgumentParser) -> None:
    _endpoint_args(p)
    p.add_argument("--backend", choices=("openai", "openai-chat"), default="openai",
                   help="openai: /v1/completions; openai-chat: /v1/chat/completions")
    p.add_argument("--dataset", "--dataset-name", dest="dataset", choices=("random", "multi-turn"), default="random")
    p.add_argument("--num-prompts", type=int, default=1000)
    p.add_argument("--random-input-len", "--input-len", dest="random_input_len", type=int, default=1024)
    p.add_argument("--random-output-len", "--output-len", dest="random_output_len", type=int, default=128)
    p.add_argument("--random-range-ratio", type=float, default=0.0)
    p.add_argument("--random-prefix-len", type=int, default=0, help="shared prefix tokens prepended to every prompt")
    p.add_argument("--prompt-format", choices=("ids", "text"), default="ids",
                   help="completions prompt as a token-id list, or as text (needs --tokenizer)")
    p.add_argument("--tokenizer", default=None, help="model dir or tokenizer.json (text prompts, token counting)")
    p.add_argument("--multi-turn-conversations", type=int, default=16)
    p.add_argument("--multi-turn-turns", type=int, default=5)
    p.add_argument("--multi-turn-system-len", type=int, default=0, help="system prefix shared by all conversations")
    p.add_argument("--multi-turn-user-len", type=int, default=128, help="new user tokens per turn")
    p.add_argument("--request-rate", type=float, default=math.inf,
                   help="req/s (conversations/s for multi-turn); inf sends all at once")
    p.add_argument("--burstiness", type=float, default=1.0, help="gamma shape: 1 Poisson, <1 burstier, inf uniform")
    p.add_argument("--max-concurrency", type=int, default=None)
    p.add_argument("--num-warmups", type=int, default=0)
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--ignore-eos", action=argparse.BooleanOptionalAction, default=True,
                   help="send ignore_eos so outputs have exactly --output-len tokens; --no-ignore-eos for servers "
                        "that reject the field (transformers serve), whose outputs may then end early at EOS")
    p.add_argument("--extra-body", type=json.loads, default={}, help="JSON object merged into every request")
    p.add_argument("--goodput", nargs="+", default=None, help="SLOs in ms, e.g. ttft:500 tpot:50 e2el:10000")
    p.add_argument("--metric-percentiles", type=_floats, default=[99.0], help="e.g. 50,90,99")
    p.add_argument("--percentile-metrics", default="ttft,tpot,itl,e2el")
    p.add_argument("--ready-check-timeout-sec", type=float, default=600.0)
    p.add_argument("--disable-tqdm", action="store_true", help="no progress bar")
    p.add_argument("--label", default=None)
    p.add_argument("--metadata", nargs="*", default=[], help="KEY=VALUE pairs added to the result JSON")
    p.add_argument("--save-result", action="store_true")
    p.add_argument("--save-detailed", action="store_true", help="also save per-request lists")
    p.add_argument("--result-dir", type=Path, default=Path("."))
    p.add_argument("--result-filename", default=None)
    p.add_argument("--sweep", type=_floats, default=None, help="request rates, e.g. 1,2,4,8,16,32,inf")
    p.add_argument("--sweep-concurrency", type=_ints, default=None,
                   help="max concurrencies, e.g. 64,128,256, one point each at --request-rate (default inf): "
                        "a saturation sweep")
    p.set_defaults(func=_run_serve)


def _run_serve(args: argparse.Namespace) -> int:
    import httpx

    from openinfer.bench.serve import ServeConfig, run
    from openinfer.bench.stats import parse_goodput

    try:
        cfg = ServeConfig(
            base_url=args.base_url, model=resolve_model(args.base_url, args.model), backend=args.backend,
            dataset=args.dataset, num_prompts=args.num_prompts, random_input_len=args.random_input_len,
            random_output_len=args.random_output_len, random_range_ratio=args.random_range_ratio,
            random_prefix_len=args.random_prefix_len, prompt_format=args.prompt_format, tokenizer=args.tokenizer,
            vocab_size=args.vocab_size, multi_turn_conversations=args.multi_turn_conversations,
            multi_turn_turns=args.multi_turn_turns, multi_turn_system_len=args.multi_turn_system_len,
            multi_turn_user_len=args.multi_turn_user_len, request_rate=args.request_rate,
            burstiness=args.burstiness, max_concurrency=args.max_concurrency, seed=args.seed,
            num_warmups=args.num_warmups, temperature=args.temperature, ignore_eos=args.ignore_eos,
            extra_body=args.extra_body,
            goodput=parse_goodput(args.goodput), metric_percentiles=args.metric_percentiles,
            percentile_metrics=[m for m in args.percentile_metrics.split(",") if m],
            ready_check_timeout_sec=args.ready_check_timeout_sec, disable_tqdm=args.disable_tqdm,
            label=args.label, metadata=dict(kv.split("=", 1) for kv in args.metadata),
        )
        if args.sweep and args.sweep_concurrency:
            raise ValueError("--sweep and --sweep-concurrency cannot be combined: sweep the rate or the concurrency")
        points = ([(args.request_rate, c) for c in args.sweep_concurrency] if args.sweep_concurrency else
                  [(r, args.max_concurrency) for r in args.sweep or [args.request_rate]])
        return run(cfg, points, args.result_dir, args.save_result, args.save_detailed, args.result_filename)
    except (ValueError, RuntimeError, OSError, httpx.HTTPError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1


def _latency_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default=None,
                   help="checkpoint dir, or a preset name (e.g. qwen3.5-4b) with --load-format dummy "
                        "(omit for the built-in demo model)")
    p.add_argument("--device", default="cpu")
    p.add_argument("--load-format", default="auto", choices=["auto", "dummy"])
    p.add_argument("--num-layers", type=int, default=None, metavar="N",
                   help="with --load-format dummy: only the first N decoder layers, at the real width")
    p.add_argument("--max-model-len", type=int, default=None)
    p.add_argument("--kv-cache-memory-gib", type=float, default=None)
    p.add_argument("--enforce-eager", action="store_true", help="CUDA: no graph capture")
    p.add_argument("--pipelined-decode", action=argparse.BooleanOptionalAction, default=True,
                   help="queue each graph decode step before the previous step's host bookkeeping (default: on)")
    p.add_argument("--batch-sizes", type=_ints, default=[1, 4])
    p.add_argument("--input-lens", type=_ints, default=[128, 512])
    p.add_argument("--output-lens", type=_ints, default=[32])
    p.add_argument("--points", type=_points, default=None, metavar="BxI,...",
                   help="(batch, input length) pairs measured in this order, e.g. 1x8192,32x8192,1x131072, instead "
                        "of every --batch-sizes x --input-lens pair")
    p.add_argument("--max-num-batched-tokens", type=int, default=None,
                   help="per-step token budget (default: the largest batch x input up to 65,536 tokens, so prefill "
                        "is one step where that fits)")
    add_kernel_option(p)
    add_hf_overrides_option(p)
    add_kv_cache_dtype_option(p)
    p.add_argument("--num-iters-warmup", type=int, default=1)
    p.add_argument("--num-iters", type=int, default=3)
    p.add_argument("--vocab-size", type=int, default=None, help="token ids are drawn below this (default: the model's vocabulary)")
    p.add_argument("--tokenizer", default=None, metavar="DIR",
                   help="a tokenizer folder, for a preset of a line that ships none (token ids are random either way)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--temperature", type=float, default=0.0, help="0: greedy; above: sampled decoding")
    p.add_argument("--output-json", type=Path, default=None)
    p.set_defaults(func=_run_latency)


def _run_latency(args: argparse.Namespace) -> int:
    from openinfer.bench.latency import run_latency

    try:
        return run_latency(args)
    except ImportError as e:
        print(f"error: bench latency needs the in-process engine (openinfer.engine.engine): {e}", file=sys.stderr)
        return 1


def _startup_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--base-url", default="http://127.0.0.1:8000", help="where the launched server listens")
    p.add_argument("--timeout", type=float, default=600.0, help="seconds to wait for GET /v1/models")
    p.add_argument("--idle-wait", type=float, default=2.0, help="seconds idle before the idle RSS sample")
    p.add_argument("--burst", type=int, default=8, help="concurrent completions in the load burst (0: none)")
    p.add_argument("--burst-input-len", type=int, default=128)
    p.add_argument("--burst-output-len", type=int, default=16)
    p.add_argument("--vocab-size", type=int, default=1000, help="burst prompt ids are drawn below this")
    p.add_argument("--output-json", type=Path, default=None)
    p.add_argument("--server-log", type=Path, default=None,
                   help="save the server's output here (openinfer serve logs one line per start-up phase)")
    p.add_argument("cmd", nargs=argparse.REMAINDER, help="-- the server command line")
    p.set_defaults(func=_run_startup)


def _run_startup(args: argparse.Namespace) -> int:
    from openinfer.bench.startup import run_startup

    cmd = args.cmd[1:] if args.cmd[:1] == ["--"] else args.cmd
    if not cmd:
        print("error: give the server command after --, e.g. bench startup -- openinfer serve MODEL", file=sys.stderr)
        return 2
    return run_startup(args, cmd)


def _prefix_args(p: argparse.ArgumentParser) -> None:
    _endpoint_args(p)
    p.add_argument("--lengths", type=_ints, default=[1024, 4096, 16384], help="prompt lengths in tokens")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--output-len", type=int, default=1)
    p.add_argument("--host-restore", action="store_true",
                   help="also measure restore from the host offload tier (evict with filler prompts first)")
    p.add_argument("--evict-tokens", type=int, default=0,
                   help="filler tokens sent to evict the device cache (default: the device pool the server "
                        "reports on /metrics, plus one prompt)")
    p.add_argument("--evict-concurrency", type=int, default=8)
    p.add_argument("--output-json", type=Path, default=None)
    p.set_defaults(func=_run_prefix)


def _run_prefix(args: argparse.Namespace) -> int:
    import httpx

    from openinfer.bench.prefix import run_prefix

    try:
        return run_prefix(args, resolve_model(args.base_url, args.model))
    except (ValueError, RuntimeError, OSError, httpx.HTTPError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1


def _compare_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("sides", nargs=2, metavar="NAME=DIR", help="two servers' sweep result directories")
    p.add_argument("--md", type=Path, default=None, help="write the table here (Markdown)")
    p.add_argument("--png", type=Path, default=None, help="write the side-by-side plot here")
    p.add_argument("--percentile", type=float, default=99.0, help="the tail percentile shown next to the mean")
    p.add_argument("--short", action="store_true", help="print only output tok/s, mean TTFT and mean TPOT")
    p.set_defaults(func=_run_compare)


def _run_compare(args: argparse.Namespace) -> int:
    from openinfer.bench.compare import run_compare

    try:
        return run_compare(args.sides, args.md, args.png, args.percentile, args.short)
    except (ValueError, RuntimeError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1


def add_parser(subparsers: Any) -> None:
    """Adds `bench` (serve | latency | startup | prefix) to the main CLI's subparsers; each sets func(args) -> int."""
    bench = subparsers.add_parser("bench", help="benchmarks: serving, in-process latency, start-up, prefix cache")
    sub = bench.add_subparsers(dest="bench_command", metavar="{serve,latency,startup,prefix,compare}")
    sub.required = True
    for name, helptext, add in (
        ("serve", "vLLM-compatible serving benchmark (one rate or a --sweep)", _serve_args),
        ("latency", "in-process batch x input x output sweep: prefill and per-step decode time", _latency_args),
        ("startup", "time to ready and process-tree RSS of a server command", _startup_args),
        ("prefix", "TTFT ladder: cold prefill, warm device hit, host restore", _prefix_args),
        ("compare", "two servers' serve sweeps side by side: table with ratios, plot", _compare_args),
    ):
        add(sub.add_parser(name, help=helptext, description=helptext))
