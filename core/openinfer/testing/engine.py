"""Driving an Engine synchronously in tests: generate, and logits of every prompt position."""
from __future__ import annotations

from typing import Sequence

import numpy as np

from ..engine import Engine
from ..request import Finished, Request, RequestStream, Scheduled, Tokens
from ..sampling import SamplingParams
from ..scheduler import ScheduledRun, StepPlan


def greedy(max_tokens: int, **kw) -> SamplingParams:
    return SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True, **kw)


def run_to_completion(engine: Engine, streams: Sequence[RequestStream]) -> None:
    while engine.has_unfinished():
        engine.step()
    assert all(s.done for s in streams), "the engine went idle with unfinished streams"


def collect(stream: RequestStream) -> tuple[list[int], Finished, int]:
    """(token ids, the Finished event, cached tokens reported at scheduling)."""
    tokens, cached, fin = [], -1, None
    for ev in stream:
        if isinstance(ev, Scheduled):
            cached = ev.cached_tokens
        elif isinstance(ev, Tokens):
            tokens += ev.token_ids
        elif isinstance(ev, Finished):
            fin = ev
        else:
            raise AssertionError(f"unexpected event {ev}")
    assert fin is not None
    return tokens, fin, cached


def generate(engine: Engine, prompts: Sequence[list[int]], params: SamplingParams | Sequence[SamplingParams]
             ) -> list[tuple[list[int], Finished, int]]:
    """Submit all prompts at once (so they batch together) and step until all finish."""
    plist = list(params) if isinstance(params, (list, tuple)) else [params] * len(prompts)
    streams = [engine.submit(list(p), sp) for p, sp in zip(prompts, plist)]
    run_to_completion(engine, streams)
    return [collect(s) for s in streams]


def prompt_logits(engine: Engine, ids: list[int]) -> np.ndarray:
    """Logits [T, vocab] at every position of one prompt, through the engine's own runner and KV."""
    req = Request("logits-probe", list(ids), SamplingParams(max_tokens=1), RequestStream("logits-probe"), 0.0)
    blocks = engine.blocks
    if not blocks.try_admit(req):
        raise RuntimeError("the KV pool cannot hold the probe prompt")
    try:
        engine.runner.pools.copy_blocks(blocks.take_block_copies())   # a copy-on-write the hit asked for
        req.num_computed = 0  # recompute everything, even a cached prefix
        blocks.allocate(req, len(ids))
        plan = StepPlan([ScheduledRun(req, 0, len(ids), True)])
        batch = engine.runner.prepare(plan)
        batch.sample_rows = engine.runner.backend.asarray(np.arange(len(ids), dtype=np.int32))
        logits = engine.runner.model.forward(batch, engine.runner.pools)
        return np.asarray(engine.runner.backend.to_host(logits), dtype=np.float32)
    finally:
        blocks.release(req)


def demo_kv_gib(blocks: int, itemsize: int = 4, block_size: int = 16) -> float:
    """--kv-cache-memory-gib (or --kv-offload-host-gib) that holds exactly `blocks` KV blocks of the
    built-in demo model (itemsize 4: float32, the CPU; 2: bfloat16), so tests can size pools in blocks."""
    from ..kv.pool import bytes_per_block
    from ..loader import _demo
    from ..plugins import get_plugins
    line, config, _ = _demo(get_plugins())
    groups = line.state_spec(line.parse_config(config))
    return blocks * bytes_per_block(groups, block_size, {g.name: itemsize for g in groups}) / 2**30
