"""`openinfer bench latency`: in-process batch x input x output sweep of one engine, stepped synchronously —
prefill time (until every prompt token is computed) and per-step decode time, no HTTP in the way."""

from __future__ import annotations

import argparse
import itertools
import json
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Callable

import numpy as np

from ..engine.request import Scheduled


@dataclass
class PointTiming:
    """One (batch, input, output) point over `iters` timed runs; times in seconds."""

    batch_size: int
    input_len: int
    output_len: int
    prefill_s: list[float] = field(default_factory=list)
    decode_step_s: list[float] = field(default_factory=list)
    total_s: list[float] = field(default_factory=list)

    def summary(self) -> dict[str, Any]:
        def ms(xs: list[float], q: float) -> float:
            return float(np.percentile(np.array(xs) * 1000.0, q)) if xs else 0.0

        mean_step = float(np.mean(self.decode_step_s)) if self.decode_step_s else 0.0
        return {
            "batch_size": self.batch_size, "input_len": self.input_len, "output_len": self.output_len,
            "median_prefill_ms": ms(self.prefill_s, 50),
            "mean_decode_step_ms": mean_step * 1000.0,
            "median_decode_step_ms": ms(self.decode_step_s, 50),
            "p99_decode_step_ms": ms(self.decode_step_s, 99),
            "decode_tokens_per_s": self.batch_size / mean_step if mean_step else 0.0,
            "median_total_ms": ms(self.total_s, 50),
            "prefill_tokens_per_s": self.batch_size * self.input_len / float(np.median(self.prefill_s))
            if self.prefill_s else 0.0,
        }


def run_once(engine: Any, prompts: list[list[int]], params: Any, point: PointTiming,
             clock: Callable[[], float] = time.perf_counter) -> None:
    """Adds the batch, steps until done. The prefill phase ends at the step after which every request
    has its first token (or has ended): a request samples its first token in the step that computes
    its prompt's last token. With a token budget smaller than the batch's prompts some rows decode
    while others still prefill, and those mixed steps count as prefill. (Counting the steps' tokens
    up to the prompt total would not do: the decoding rows' tokens count too, so the last mixed
    step, with its hundreds of prompt tokens, would be taken for the first decode step.) The streams
    are read after each step, outside its time, as a server's readers do: events left to pile up
    would make the steps pay for collecting garbage a server does not have."""
    t0 = clock()
    streams = [engine.add_request(p, params) for p in prompts]
    prefilling, steps = set(range(len(streams))), []
    while engine.has_unfinished():
        ts = clock()
        engine.step()
        te = clock()
        in_prefill = bool(prefilling)
        for i, s in enumerate(streams):
            if any(not isinstance(ev, Scheduled) for ev in s.drain()):
                prefilling.discard(i)   # its first token, or its end
        if not in_prefill:
            steps.append(te - ts)
        elif not prefilling:
            point.prefill_s.append(te - t0)
    point.total_s.append(clock() - t0)
    point.decode_step_s.extend(steps)


def sweep(engine: Any, make_params: Callable[[int], Any], shapes: list[tuple[int, int]], output_lens: list[int],
          vocab: int, warmup: int, iters: int, seed: int,
          measured: Callable[[list[PointTiming]], None] | None = None) -> list[PointTiming]:
    """Each (batch, input) of `shapes` at each output length, in order; `measured(points so far)` after each point."""
    rng = np.random.default_rng(seed)
    points: list[PointTiming] = []
    for (b, i), o in itertools.product(shapes, output_lens):
        point = PointTiming(b, i, o)
        for k in range(warmup + iters):
            # Fresh prompts every run: a prefix-cache hit would make prefill look free.
            prompts = [rng.integers(0, vocab, i).tolist() for _ in range(b)]
            target = point if k >= warmup else PointTiming(b, i, o)
            run_once(engine, prompts, make_params(o), target)
        points.append(point)
        if measured is not None:
            measured(points)
    return points


def shapes_of(args: argparse.Namespace) -> list[tuple[int, int]]:
    """--points as given, or every --batch-sizes x --input-lens pair."""
    return args.points or list(itertools.product(args.batch_sizes, args.input_lens))


_HEAD = f"{'batch':>5} {'in':>6} {'out':>5} {'prefill ms':>11} {'step ms':>9} {'p99 step':>9} " \
        f"{'dec tok/s':>10} {'total ms':>10}"


def format_row(r: dict[str, Any]) -> str:
    return (f"{r['batch_size']:>5} {r['input_len']:>6} {r['output_len']:>5} {r['median_prefill_ms']:>11.2f} "
            f"{r['median_decode_step_ms']:>9.2f} {r['p99_decode_step_ms']:>9.2f} "
            f"{r['decode_tokens_per_s']:>10.1f} {r['median_total_ms']:>10.2f}")


DEFAULT_BUDGET_CAP = 65536   # tokens a step when --max-num-batched-tokens is not given


def run_latency(args: argparse.Namespace) -> int:
    # Imported here: the engine pulls in the model runtime, which the HTTP benchmarks never need.
    from openinfer.engine.engine import EngineArgs, build_engine
    from openinfer.kernels.registry import parse_kernel_overrides
    from openinfer.sampling.sampler import SamplingParams

    shapes = shapes_of(args)
    # one prefill step for the largest batch, up to a budget whose activations and profile fit beside the weights
    budget = args.max_num_batched_tokens or min(max(b * i for b, i in shapes), DEFAULT_BUDGET_CAP)
    engine = build_engine(args.model, EngineArgs(
        device=args.device, load_format=args.load_format, num_layers=args.num_layers, max_model_len=args.max_model_len,
        kv_cache_memory_gib=args.kv_cache_memory_gib, enforce_eager=args.enforce_eager,
        pipelined_decode=args.pipelined_decode, max_num_batched_tokens=budget,
        max_num_seqs=max(b for b, _ in shapes), tokenizer=args.tokenizer, kernels=parse_kernel_overrides(args.kernel),
        hf_overrides=args.hf_overrides, kv_cache_dtype=args.kv_cache_dtype))

    def make_params(max_tokens: int) -> Any:
        return SamplingParams(max_tokens=max_tokens, temperature=args.temperature, ignore_eos=True, seed=args.seed)

    def measured(points: list[PointTiming]) -> None:
        """A row printed and the JSON written after every point, so a run stopped part way (a timeout) keeps the
        points it finished."""
        rows = [p.summary() for p in points]
        print(format_row(rows[-1]), flush=True)
        if args.output_json:
            detail = [{**r, **{k: v for k, v in asdict(p).items() if k.endswith("_s")}} for r, p in zip(rows, points)]
            args.output_json.write_text(json.dumps({"model": args.model, "device": args.device,
                                                    "max_num_batched_tokens": budget, "points": detail}, indent=2))

    print(_HEAD + "\n" + "-" * len(_HEAD), flush=True)
    try:
        sweep(engine, make_params, shapes, args.output_lens, args.vocab_size or engine.vocab_size,
              args.num_iters_warmup, args.num_iters, args.seed, measured)
    finally:   # its expert-parallel workers and threads stop here, not in the interpreter's teardown
        engine.shutdown()
    return 0
