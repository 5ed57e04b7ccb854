"""Driving an Engine synchronously in tests: generate, score a prompt, logits of every prompt position, and a
float32 engine that rounds like a bf16 one."""
from __future__ import annotations

from contextlib import contextmanager
from typing import Any, Callable, Iterator, Sequence

import numpy as np

from ..engine.engine import Engine
from ..engine.request import Finished, PromptLogprobs, Request, RequestStream, Scheduled, Tokens
from ..sampling.sampler import SampleResult, SamplingParams
from ..engine.scheduler import ScheduledRun, StepPlan


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


def score_prompt(engine: Engine, ids: Sequence[int], k: int | None, max_tokens: int = 6
                 ) -> tuple[list[SampleResult] | None, list[int], int]:
    """One greedy request run alone, scoring its prompt with k alternatives (None: not scoring): (its prompt
    logprobs, its tokens, the cached tokens reported at scheduling)."""
    stream = engine.submit(list(ids), greedy(max_tokens, prompt_logprobs=k))
    run_to_completion(engine, [stream])
    events = stream.drain()
    scored = [ev.samples for ev in events if isinstance(ev, PromptLogprobs)]
    tokens = [t for ev in events if isinstance(ev, Tokens) for t in ev.token_ids]
    return (scored[0] if scored else None), tokens, events[0].cached_tokens


def log_softmax(logits: np.ndarray) -> np.ndarray:
    """float64 log-softmax of each row (the reference prompt logprobs are checked against)."""
    x = np.asarray(logits, np.float64)
    x = x - x.max(axis=-1, keepdims=True)
    return x - np.log(np.exp(x).sum(axis=-1, keepdims=True))


def assert_scores_match(scored: list[SampleResult], ids: Sequence[int], logits: np.ndarray, k: int,
                        atol: float = 1e-4) -> None:
    """Prompt logprobs against reference logits [T, vocab] of the same prompt: each token's logprob, and its k
    alternatives' logprobs, best first, within atol (near-ties may order the ids differently)."""
    logp = log_softmax(np.asarray(logits)[:-1])
    rows = np.arange(len(logp))
    assert [s.token for s in scored] == list(ids[1:])
    np.testing.assert_allclose([s.logprob for s in scored], logp[rows, list(ids[1:])], atol=atol)
    top = np.sort(logp, axis=1)[:, ::-1][:, :k]
    np.testing.assert_allclose([[v for _, v in s.top] for s in scored], top, atol=atol)
    np.testing.assert_allclose([[logp[r, t] for t, _ in s.top] for r, s in enumerate(scored)], top, atol=atol)


def prompt_logits(engine: Engine, ids: list[int]) -> np.ndarray:
    """Logits [T, vocab] at every position of one prompt, through the engine's own runner and KV."""
    req = Request("logits-probe", list(ids), SamplingParams(max_tokens=1), RequestStream("logits-probe"), 0.0)
    blocks, backend = engine.blocks, engine.runner.backend
    if not blocks.try_admit(req):
        raise RuntimeError("the KV pool cannot hold the probe prompt")
    try:
        with backend.current():   # as a step runs (ModelRunner.execute), whichever engine was built last
            engine.runner.pools.copy_blocks(blocks.take_block_copies())   # a copy-on-write the hit asked for
            req.num_computed = 0  # recompute everything, even a cached prefix
            blocks.allocate(req, len(ids))
            plan = StepPlan([ScheduledRun(req, 0, len(ids), True)])
            batch = engine.runner.prepare(plan)
            batch.sample_rows = backend.asarray(np.arange(len(ids), dtype=np.int32))
            logits = engine.runner.model.forward(batch, engine.runner.pools)
            return np.asarray(backend.to_host(logits), dtype=np.float32)
    finally:
        blocks.release(req)


# ops whose outputs a bf16 CUDA engine keeps in float32 (the MoE router's logits, ids and weights)
FLOAT32_OUTPUTS = frozenset({"router_logits", "moe_route", "moe_router"})


@contextmanager
def bf16_activations(engine: Engine, keep: frozenset[str] = FLOAT32_OUTPUTS) -> Iterator[None]:
    """The float32 engine's ops with every float32 array they return rounded to bfloat16, as a bf16 GPU engine stores
    each op's output (on the same bf16 weights): the reference a GPU engine is held to where rounding, not a kernel,
    moves the logits (a tiny random MoE model amplifies it: a rounded router score changes an expert)."""
    import ml_dtypes

    bf16 = np.dtype(ml_dtypes.bfloat16)

    def rounded(v: Any) -> Any:
        if isinstance(v, np.ndarray) and v.dtype == np.float32:
            return v.astype(bf16).astype(np.float32)
        return tuple(rounded(x) for x in v) if isinstance(v, tuple) else v

    def wrap(fn):
        return lambda *a, **k: rounded(fn(*a, **k))

    ops = engine.runner.model.ops   # an Ops, or a wrapper of one (QuantOps) that delegates what it does not define
    inner = getattr(ops, "_ops", ops)
    names = {n for o in (ops, inner) for n in dir(o) if not n.startswith("_") and callable(getattr(o, n))}
    with wrapped_ops(ops, {n: wrap for n in sorted(names - keep - {"describe"})}):
        yield


@contextmanager
def wrapped_ops(ops: Any, wrappers: dict[str, Callable[[Callable], Callable]]) -> Iterator[None]:
    """Each op `name` of `ops` replaced by `wrappers[name](op)` inside the block, and put back after it."""
    own = {n: vars(ops)[n] for n in wrappers if n in vars(ops)}   # instance attributes to put back
    for n, wrap in wrappers.items():
        setattr(ops, n, wrap(getattr(ops, n)))
    try:
        yield
    finally:
        for n in wrappers:
            if n in own:
                setattr(ops, n, own[n])
            else:
                delattr(ops, n)


def logits_with_shared_choices(engine: Engine, reference: Engine, ids: list[int], ops: Sequence[str]
                               ) -> tuple[np.ndarray, np.ndarray, dict[str, float]]:
    """Prompt logits of `engine` and of `reference` where `reference` takes `engine`'s outputs of the discontinuous
    `ops` (an MoE router's experts and weights, a sparse indexer's top-k), and how far its own choices agreed: per op,
    the mean share of each row's chosen ids (negatives are padding) that the reference chose too. Rounding moves
    choices near a tie, and on a tiny random model one moved choice changes the logits by far more than the rounding
    itself; compared this way the logits show the kernels and the agreements show the choices."""
    taken: dict[str, list[Any]] = {op: [] for op in ops}
    overlaps: dict[str, list[float]] = {op: [] for op in ops}
    ref_backend = reference.runner.backend

    def host(v: Any, backend: Any) -> Any:
        return tuple(host(x, backend) for x in v) if isinstance(v, tuple) else np.asarray(backend.to_host(v))

    def on_reference(v: Any) -> Any:  # host arrays onto the reference's device, dtype kept
        if isinstance(v, tuple):
            return tuple(on_reference(x) for x in v)
        return v if ref_backend.xp is np else ref_backend.asarray(v, dtype=str(v.dtype))

    def record(op: str) -> Callable[[Callable], Callable]:
        def wrap(fn):
            def call(*a, **k):
                out = fn(*a, **k)
                taken[op].append(host(out, engine.runner.backend))
                return out
            return call
        return wrap

    def replay(op: str) -> Callable[[Callable], Callable]:
        def wrap(fn):
            def call(*a, **k):
                mine, theirs = taken[op].pop(0), host(fn(*a, **k), ref_backend)
                m, t = (mine[0], theirs[0]) if isinstance(mine, tuple) else (mine, theirs)
                for a_row, b_row in zip(np.asarray(m), np.asarray(t)):
                    a_row, b_row = a_row[a_row >= 0], b_row[b_row >= 0]
                    overlaps[op].append(len(np.intersect1d(a_row, b_row)) / max(len(a_row), 1))
                return on_reference(mine)
            return call
        return wrap

    with wrapped_ops(engine.runner.model.ops, {op: record(op) for op in ops}):
        ours = prompt_logits(engine, ids)
    with wrapped_ops(reference.runner.model.ops, {op: replay(op) for op in ops}):
        ref = prompt_logits(reference, ids)
    assert all(not left for left in taken.values()), "the two engines ran different calls of the shared ops"
    return ours, ref, {op: float(np.mean(v)) if v else 1.0 for op, v in overlaps.items()}


def demo_kv_gib(blocks: int, itemsize: int = 4, block_size: int = 16) -> float:
    """--kv-cache-memory-gib (or --kv-offload-host-gib) that holds exactly `blocks` KV blocks of the
    built-in demo model (itemsize 4: float32, the CPU; 2: bfloat16), so tests can size pools in blocks."""
    from ..kv.pool import bytes_per_block
    from ..loading.loader import _demo
    from ..contract.plugins import get_plugins
    line, config, _ = _demo(get_plugins())
    groups = line.state_spec(line.parse_config(config))
    return blocks * bytes_per_block(groups, block_size, {g.name: itemsize for g in groups}) / 2**30


def assert_prefix_hit(engine: Engine, ids: list[int], max_tokens: int) -> list[int]:
    """Greedy `ids` twice on an engine with prefix caching: the first run reports no cached tokens, the second
    every full block (a prompt of whole blocks recomputes its last token, copy-on-write), in its Scheduled and
    Finished events, and both give the same tokens, which are returned."""
    bs = engine.blocks.block_size
    [(first, _, cached0)] = generate(engine, [ids], greedy(max_tokens))
    [(again, fin, cached1)] = generate(engine, [ids], greedy(max_tokens))
    assert cached0 == 0
    assert cached1 == (len(ids) - 1 if len(ids) % bs == 0 else len(ids) // bs * bs) > 0
    assert fin.cached_tokens == cached1 and again == first
    return first


def assert_graphs_replay_eager(eager: Engine, graph: Engine, prompts: Sequence[list[int]], max_tokens: int) -> None:
    """Greedy runs of 1, 2, 4, 8, 16, 24 and 32 of `prompts` (at least 8; as many of those sizes as there are
    prompts; batch sizes that are graph buckets, so eager steps and replays run the same shapes) give the same
    tokens on an engine with CUDA graphs as on an eager one."""
    assert graph.runner.graphs is not None and eager.runner.graphs is None and len(prompts) >= 8
    for batch in [[prompts[3]]] + [prompts[:n] for n in (2, 4, 8, 16, 24, 32) if n <= len(prompts)]:
        want = [t for t, _, _ in generate(eager, batch, greedy(max_tokens))]
        got = [t for t, _, _ in generate(graph, batch, greedy(max_tokens))]
        assert got == want, f"batch of {len(batch)}"
