"""`openinfer serve | generate | plugins | synth | bench`."""
from __future__ import annotations

import argparse
import logging
import os
import sys
from pathlib import Path

from .engine.engine_args import (EngineArgs, add_hf_overrides_option, add_kernel_option,
                                 add_kv_cache_dtype_option)
from .kernels.registry import parse_kernel_overrides
from .kv.block_manager import BLOCK_HASHES


def _engine_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N")
    p.add_argument("--dtype", default=None, help="compute dtype (CPU: float32; CUDA: bfloat16 or float32)")
    p.add_argument("--load-format", default="auto", choices=["auto", "dummy"])
    p.add_argument("--max-model-len", type=int, default=None)
    p.add_argument("--max-num-batched-tokens", type=int, default=None,
                   help="per-step token budget; a longer prompt is prefilled in chunks (default: 8192 on CUDA, "
                        "1024 on the CPU)")
    p.add_argument("--max-num-seqs", type=int, default=None,
                   help="most sequences running at once (default: 64 on the CPU; on CUDA as many as the KV pool "
                        "holds at 1k tokens each, up to 256, rounded down to a decode-graph size)")
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--kv-cache-memory-gib", type=float, default=None)
    p.add_argument("--gpu-memory-utilization", type=float, default=0.90)
    p.add_argument("--no-prefix-caching", action="store_true")
    p.add_argument("--prefix-cache-hash", default="builtin", choices=BLOCK_HASHES,
                   help="prefix-cache block keys: Python's hash (fast), or sha256, which no crafted prompt can "
                        "collide with another's (a multi-tenant server)")
    p.add_argument("--num-state-checkpoints", type=int, default=None,
                   help="hybrid models: prefix checkpoints of the recurrent state kept (default: --max-num-seqs)")
    p.add_argument("--enforce-eager", action="store_true", help="CUDA: no graph capture")
    p.add_argument("--pipelined-decode", action=argparse.BooleanOptionalAction, default=True,
                   help="queue each graph decode step before the previous step's host bookkeeping (default: on)")
    p.add_argument("--seed", type=int, default=0, help="seed of dummy weights")
    p.add_argument("--num-layers", type=int, default=None, metavar="N",
                   help="with --load-format dummy: only the first N decoder layers, at the real width (benchmarks of "
                        "a model too large for the device at full depth)")
    p.add_argument("--tokenizer", default=None, metavar="DIR",
                   help="a folder with tokenizer.json (+ tokenizer_config.json) used instead of the checkpoint's, or for "
                        "a preset of a line that ships no tokenizer (e.g. --model deepseek-v2-lite --load-format dummy)")
    p.add_argument("--kv-offload", action="store_true",
                   help="save KV blocks evicted from the device to host memory and restore them at admission")
    p.add_argument("--generation-config", default="auto", choices=["auto", "none"],
                   help="auto: the checkpoint's generation_config.json gives the sampling defaults (temperature, "
                        "top_p, top_k, min_p, repetition_penalty) for the fields a request leaves out; none: OpenAI's")
    p.add_argument("--scheduling-policy", default="fcfs", choices=["fcfs", "priority"],
                   help="priority: waiting requests are admitted by their `priority` (lower first, then arrival), as "
                        "vLLM's; a running request is never preempted (its KV was reserved at admission)")
    p.add_argument("--kv-offload-host-gib", type=float, default=8.0,
                   help="host memory for --kv-offload (pinned on CUDA)")
    add_kv_cache_dtype_option(p)
    p.add_argument("--ep", type=int, default=1, metavar="N",
                   help="expert parallelism: shard a MoE model's routed experts over N processes, one per GPU "
                        "(--device cuda:i uses GPUs i..i+N-1; on the CPU, N processes); N must divide the expert count")
    add_kernel_option(p)
    add_hf_overrides_option(p)


def _engine_args(a: argparse.Namespace, name: str | None = None) -> EngineArgs:
    return EngineArgs(device=a.device, dtype=a.dtype, load_format=a.load_format, max_model_len=a.max_model_len,
                      max_num_batched_tokens=a.max_num_batched_tokens, max_num_seqs=a.max_num_seqs,
                      block_size=a.block_size, kv_cache_memory_gib=a.kv_cache_memory_gib,
                      gpu_memory_utilization=a.gpu_memory_utilization, enable_prefix_caching=not a.no_prefix_caching,
                      prefix_cache_hash=a.prefix_cache_hash,
                      num_state_checkpoints=a.num_state_checkpoints, served_model_name=name, seed=a.seed, num_layers=a.num_layers,
                      enforce_eager=a.enforce_eager, pipelined_decode=a.pipelined_decode, kv_offload=a.kv_offload,
                      kv_offload_host_gib=a.kv_offload_host_gib, kv_cache_dtype=a.kv_cache_dtype,
                      generation_config=a.generation_config,
                      scheduling_policy=a.scheduling_policy, ep=a.ep, tokenizer=a.tokenizer,
                      kernels=parse_kernel_overrides(a.kernel), hf_overrides=a.hf_overrides)


def _parse_model(spec: str) -> tuple[str | None, str]:
    """NAME=PATH or PATH."""
    name, sep, path = spec.partition("=")
    return (name, path) if sep and not Path(spec).exists() else (None, spec)


def cmd_serve(a: argparse.Namespace) -> int:
    from .loading.cuda_context import create_context_early
    create_context_early(a.device)   # on a thread, while the imports below and the tokenizer run
    from .engine.engine import build_engine
    from .server import ModelHost, serve
    from .server.limits import MIB, ServerLimits
    keys = a.api_key + ([k] if (k := os.environ.get("OPENINFER_API_KEY")) else [])
    if "" in keys:
        raise ValueError("--api-key needs a non-empty key")
    # the limits are checked before any model loads
    limits = ServerLimits(int(a.max_request_body_mib * MIB), a.request_read_timeout,
                          int(a.max_stored_response_mib * MIB), a.public_metrics, a.shared_prefix_cache)
    host = ModelHost(max_waiting_requests=a.max_waiting_requests, max_sequences_per_request=a.max_sequences_per_request)
    specs = [_parse_model(m) for m in a.model] or [(None, None)]
    for name, path in specs:
        host.add(build_engine(path, _engine_args(a, name)))
    origins = [] if a.allowed_origins == ["none"] else a.allowed_origins or ["*"]
    return serve(host, a.host, a.port, a.log_level, api_keys=keys, shutdown_timeout=a.shutdown_timeout,
                 allowed_origins=origins, log_stats=not a.disable_log_stats, limits=limits)


def cmd_generate(a: argparse.Namespace) -> int:
    from .loading.cuda_context import create_context_early
    create_context_early(a.device)
    from .text.detokenize import IncrementalDetokenizer, StopStringMatcher
    from .engine.engine import build_engine
    from .engine.request import Failed, Finished, Rejected, Tokens
    from .sampling.sampler import SamplingParams
    eng = build_engine(a.model, _engine_args(a)).start()
    tok = eng.tokenizer
    text = a.prompt
    if a.chat:
        text = tok.apply_chat_template([{"role": "user", "content": a.prompt}], add_generation_prompt=True)
    params = SamplingParams(max_tokens=a.max_tokens, temperature=a.temperature, top_p=a.top_p,
                            seed=a.sampling_seed).validate(eng.vocab_size)
    stream = eng.submit(tok.encode(text), params)
    detok, stops = IncrementalDetokenizer(tok), StopStringMatcher(a.stop or [])
    try:
        for ev in stream:
            if isinstance(ev, Tokens):
                out, matched = stops.feed(detok.add(ev.token_ids))
                sys.stdout.write(out)
                sys.stdout.flush()
                if matched:
                    eng.abort(stream.request_id)
                    break
            elif isinstance(ev, (Failed, Rejected)):
                print(f"\nerror: {getattr(ev, 'message', None) or ev.reason}", file=sys.stderr)
                return 1
            elif isinstance(ev, Finished):
                sys.stdout.write(stops.feed(detok.flush())[0] + stops.flush())
        print()
        return 0
    finally:
        eng.shutdown()


def cmd_plugins(a: argparse.Namespace) -> int:
    from .contract.plugins import get_plugins
    plugins = get_plugins()
    print("plugins:")
    for info in plugins.infos:
        lines = f" model lines: {', '.join(info.model_lines)}" if info.model_lines else ""
        print(f"  {info.name} ({info.distribution} {info.version}){lines}")
        for name in info.model_lines:   # what `openinfer synth --preset` and `--load-format dummy` take
            line = plugins.lines[name]
            presets = ", ".join(line.presets) if line.presets else "none"
            untokenized = " (the line ships no tokenizer: serve them with --tokenizer DIR)" if \
                line.presets and line.tokenizer_dir() is None else ""
            print(f"    {name} presets: {presets}{untokenized}")
    if plugins.errors:
        print("failed to load:")
        for err in plugins.errors:
            print(f"  {err.plugin} ({err.distribution}): {err.error}")
    if a.plan:
        from .backends import get_backend
        from .loading.config import read_model_config
        from .contract.detect import detect_line
        line = detect_line(read_model_config(a.plan), plugins, f"{a.plan}/config.json")
        backend = get_backend(a.device)
        ops = plugins.kernels.resolve(line.kernel_plan(line.parse_config(read_model_config(a.plan))),
                                      backend.name, backend.dtype, backend.compute_capability,
                                      parse_kernel_overrides(a.kernel))
        print(f"kernel plan of {a.plan} ({line.name} line, {backend.name}/{backend.dtype}):")
        plan = ops.describe()
        width = max(map(len, plan))
        for op, impl in plan.items():
            print(f"  {op:{width}s} {impl}")
    return 1 if plugins.errors and a.strict else 0


def cmd_synth(a: argparse.Namespace) -> int:
    from .loading.synth import synthesize
    synthesize(a.preset, Path(a.out), seed=a.seed, dtype=a.dtype, device=a.device, num_layers=a.num_layers)
    print(f"wrote {a.preset} checkpoint to {a.out}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="openinfer", description="A framework-free LLM inference engine.")
    sub = parser.add_subparsers(dest="command", required=True)
    s = sub.add_parser("serve", help="serve models over an OpenAI-compatible HTTP API")
    s.add_argument("--model", action="append", default=[], metavar="[NAME=]PATH",
                   help="a checkpoint folder, optionally named, or a preset name (e.g. qwen3.5-4b) with --load-format "
                        "dummy; repeat to host several (none: the demo model)")
    s.add_argument("--host", default="127.0.0.1")
    s.add_argument("--port", type=int, default=8000)
    s.add_argument("--log-level", default="info")
    s.add_argument("--api-key", action="append", default=[], metavar="KEY",
                   help="require 'Authorization: Bearer KEY' on every route but /health, /live, /ping and /version; "
                        "repeat for several keys (also read from OPENINFER_API_KEY); each key is a tenant: its stored "
                        "responses and its part of the prefix cache are its own")
    s.add_argument("--public-metrics", action="store_true", help="with --api-key: /metrics answers without a key")
    s.add_argument("--shared-prefix-cache", action="store_true",
                   help="with --api-key: every key's requests share one prefix cache (a single-tenant deployment; "
                        "by default each key hits only its own cached prompts)")
    s.add_argument("--max-request-body-mib", type=float, default=32.0, metavar="MIB",
                   help="a larger request body is a 413, refused before it is read")
    s.add_argument("--request-read-timeout", type=float, default=30.0, metavar="S",
                   help="a request body not received within S seconds is a 408")
    s.add_argument("--max-sequences-per-request", type=int, default=None, metavar="N",
                   help="sequences (prompts × n) one request may ask for (default: --max-num-seqs, what runs at once)")
    s.add_argument("--max-stored-response-mib", type=float, default=256.0, metavar="MIB",
                   help="memory the stored responses (/v1/responses, store) may take; the oldest go first")
    s.add_argument("--max-waiting-requests", type=int, default=None, metavar="N",
                   help="answer 503 with Retry-After to a generation request while N requests wait in its "
                        "model's queue (default: no limit)")
    s.add_argument("--allowed-origins", action="append", default=[], metavar="ORIGIN",
                   help="origins browsers may call the API from (CORS), e.g. https://app.example; repeat for several "
                        "(default: every origin, without credentials; 'none': no CORS)")
    s.add_argument("--disable-log-stats", action="store_true",
                   help="no periodic stats line (throughput, running / waiting requests, KV cache, prefix hits)")
    s.add_argument("--shutdown-timeout", type=float, default=5.0, metavar="S",
                   help="on SIGTERM / SIGINT, seconds that in-flight requests get to finish; those still running are "
                        "then ended with a 503 (an error event in a stream) and the process exits 0")
    _engine_flags(s)
    s.set_defaults(func=cmd_serve)
    g = sub.add_parser("generate", help="one prompt in, text out (streamed to the terminal)")
    g.add_argument("prompt")
    g.add_argument("--model", default=None,
                   help="checkpoint folder, or a preset name with --load-format dummy (none: the demo model)")
    g.add_argument("--chat", action="store_true", help="wrap the prompt in the chat template")
    g.add_argument("--max-tokens", type=int, default=64)
    g.add_argument("--temperature", type=float, default=0.0)
    g.add_argument("--top-p", type=float, default=1.0)
    g.add_argument("--sampling-seed", type=int, default=None)
    g.add_argument("--stop", action="append", default=None)
    _engine_flags(g)
    g.set_defaults(func=cmd_generate)
    p = sub.add_parser("plugins", help="installed plugins, their model lines and load errors")
    p.add_argument("--plan", metavar="MODEL_DIR", help="also print which implementation each op of this model gets")
    p.add_argument("--device", default="cpu")
    add_kernel_option(p)
    p.add_argument("--strict", action="store_true", help="exit 1 when a plugin failed to load")
    p.set_defaults(func=cmd_plugins)
    y = sub.add_parser("synth", help="write a random-weight checkpoint with a preset's real shapes")
    y.add_argument("--preset", required=True, help="e.g. qwen3-4b, qwen3-8b, qwen3-tiny")
    y.add_argument("--out", required=True)
    y.add_argument("--seed", type=int, default=0)
    y.add_argument("--dtype", default="BF16", choices=["BF16", "F16", "F32"])
    y.add_argument("--device", default="cpu", help="cuda: draw the random weights on the GPU (much faster)")
    y.add_argument("--num-layers", type=int, default=None, metavar="N",
                   help="write only the first N decoder layers at the real width (a reduced-depth checkpoint)")
    y.set_defaults(func=cmd_synth)
    from .bench.cli import add_parser as add_bench
    add_bench(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except KeyboardInterrupt:
        return 130
    except (ValueError, RuntimeError, FileNotFoundError) as e:
        print(f"openinfer: error: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
