"""Turns a StepPlan into a ForwardBatch, runs the model, returns what the sampler needs.

Greedy tokens are taken on the device (one int per sampled row crosses to the host). Other rows
are sampled on the device where the backend can (CUDA: only ids and asked-for logprobs cross);
elsewhere their float32 logits rows go to the host sampler.
Prompt rows of requests that score their prompt (prompt logprobs) get their logits too, after the
sampled rows', and are scored on the device against the prompt's next token.
Decode-only steps replay a captured CUDA graph when the backend has them; a mixed step whose decode rows
read enough KV cache (BESIDE_READ_RATIO) replays their graph beside its prompt runs' eager forward (cuda_graphs.py,
`replay_beside`). A step is launched and collected apart, so a pipelined engine can queue the next decode step in
between (pipeline.py).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from ..backends.numpy_backend import Backend
from .batch import ForwardBatch, leading_one_token_runs
from ..kv.block_tables import BlockTables
from ..kv.pool import StatePools
from ..contract.model_line import Model
from .request import Request
from ..sampling.sampler import SampleResult
from ..sampling.batch import ROW, SamplingBatch
from .scheduler import StepPlan


# A mixed step replays its decode rows' graph beside the prompts' eager forward when the rows read at least this many
# times the model's weight bytes of KV cache and state: the graph reads the weights a second time, which one eager
# forward shares with the prompts. On an H100 (Qwen3-4B, 8 GB of weights, 1k contexts): 248 rows (40 GB of KV)
# beside one 1k prompt took 32.6 ms against 38.6 as one eager forward, beside seven 116.7 against 118.3; 72 rows
# (12 GB) took 22.2 against 21.8 and 106.2 against 103.5. A MoE model's weights are all its experts, so its decode rows
# run beside only where their KV dwarfs them.
BESIDE_READ_RATIO = 2.0


@dataclass
class HostBatch:
    """A step's inputs in host memory, before upload."""
    token_ids: np.ndarray     # [T] int32
    positions: np.ndarray     # [T] int32
    slot_mapping: np.ndarray  # [T] int64
    block_tables: np.ndarray  # [B, width] int32
    query_start: np.ndarray   # [B + 1] int32
    context_lens: np.ndarray  # [B] int32
    sample_rows: np.ndarray   # [S] int32
    state_slots: np.ndarray | None = None   # [B] int32, rows of the "slots" state groups (hybrid models)
    checkpoints: np.ndarray | None = None   # [2, B] int32, ForwardBatch.checkpoint_lens and _rows
    scored: Scored | None = None            # prompt rows to score, their logits after the sampled rows'

    @property
    def is_decode(self) -> bool:
        return len(self.token_ids) == len(self.context_lens)

    def split(self, n: int) -> tuple[HostBatch, HostBatch]:
        """The first n runs, each one token long (a decode step's inputs), and the rest as a batch of its own. The
        rest keeps the checkpoints (a save lies strictly inside a run longer than one token); neither part scores."""
        s = int(np.searchsorted(self.sample_rows, n))
        slots = self.state_slots
        head = HostBatch(self.token_ids[:n], self.positions[:n], self.slot_mapping[:n], self.block_tables[:n],
                         self.query_start[: n + 1], self.context_lens[:n], self.sample_rows[:s],
                         None if slots is None else slots[:n])
        tail = HostBatch(self.token_ids[n:], self.positions[n:], self.slot_mapping[n:], self.block_tables[n:],
                         self.query_start[n:] - n, self.context_lens[n:], self.sample_rows[s:] - n,
                         None if slots is None else slots[n:],
                         None if self.checkpoints is None else self.checkpoints[:, n:])
        return head, tail


@dataclass
class Scored:
    """A step's prompt rows to score: every prompt token but the last of the runs that score theirs."""
    rows: np.ndarray                   # [R] int32 token rows
    targets: np.ndarray                # [R] int32 the prompt token each row predicts
    runs: list[tuple[int, int, int, int]]   # (run index, its first row among the R, its rows, its top k)
    top_k: int                         # the most alternatives any run asks for

    @staticmethod
    def of(scoring: list[tuple[int, Request, int, int]], qstart: np.ndarray) -> Scored:
        """scoring: (run index, request, first position, run length) of each run that has prompt rows to score."""
        rows, targets, runs, k, at = [], [], [], 0, 0
        for i, req, start, length in scoring:
            n = min(start + length, len(req.prompt_ids) - 1) - start
            rows.append(np.arange(qstart[i], qstart[i] + n, dtype=np.int32))
            targets += req.prompt_ids[start + 1: start + 1 + n]
            runs.append((i, at, n, req.params.prompt_logprobs))
            at += n
            k = max(k, req.params.prompt_logprobs)
        return Scored(np.concatenate(rows), np.array(targets, np.int32), runs, k)


@dataclass
class StepOutput:
    tokens: np.ndarray                 # [S] argmax of each sampled row's logits
    logits: dict[int, np.ndarray]      # sampled row index -> float32 logits, for the rows asked for
    samples: dict[int, SampleResult] = field(default_factory=dict)   # sampled row index -> device draw
    scored: dict[int, list[SampleResult]] = field(default_factory=dict)   # run index -> its prompt tokens scored


@dataclass
class Step:
    """A step's device work as every rank runs it: the state copies and copy-on-write block copies
    it needs first, then a forward of `host`. `follows`: a pipelined decode step whose token ids are
    the previous step's greedy tokens, on the device (pipeline.py)."""
    host: HostBatch
    state_copies: list[tuple[int, int]] = field(default_factory=list)
    block_copies: list[tuple[int, int]] = field(default_factory=list)
    follows: bool = False


@dataclass
class Launched:
    """A step queued on the device, not yet collected."""
    host: HostBatch
    logits: Any                        # device [rows, V]
    tokens: Any                        # device greedy tokens, one per computed row
    rows: np.ndarray                   # the rows of `tokens` that are sampled, in order
    samples: dict[int, SampleResult]   # the device sampler's draws
    graph: bool                        # replayed a decode graph
    fetch: Callable[[], np.ndarray] | None = None   # waits for its tokens' host copy, once queued
    scores: tuple[Any, ...] | None = None   # the scored prompt rows (Backend.score_rows), on the device


def slot_mapping(table: np.ndarray, rows: np.ndarray, pos: np.ndarray, block_size: int) -> np.ndarray:
    """The KV slot of each token: position `pos` of the sequence whose block-table row is `rows`."""
    return table[rows, pos // block_size].astype(np.int64) * block_size + pos % block_size


@dataclass(frozen=True)
class ReadBytes:
    """What a decode step reads: the weights once, each context token's KV, each row's bounded state."""
    weights: int = 0
    per_token: int = 0
    per_row: int = 0


class ModelRunner:
    def __init__(self, model: Model, backend: Backend, pools: StatePools, block_size: int,
                 reads: ReadBytes = ReadBytes()) -> None:
        self.model, self.backend, self.pools = model, backend, pools
        self.block_size, self.reads = block_size, reads
        self.graphs: Any = None
        self.tables = BlockTables()

    def capture_graphs(self, max_num_seqs: int, max_model_len: int) -> None:
        self.graphs = self.backend.decode_graphs(self._forward, max_num_seqs, max_model_len, self.block_size,
                                                 state_slots=bool(self.pools.slots),
                                                 pdl_rows=self.model.pdl_decode_rows)

    def _forward(self, batch: ForwardBatch) -> tuple[Any, Any]:
        logits = self.model.forward(batch, self.pools)
        return logits, self.backend.argmax(logits)

    def prepare_host(self, plan: StepPlan) -> HostBatch:
        """The step's inputs, built with numpy over all runs at once (block tables kept from step to
        step): at batch 128 a per-run Python loop of small arrays cost ~3 ms a step."""
        bs, runs = self.block_size, plan.runs
        B = len(runs)
        # comprehensions, the only per-run Python of the step's inputs, but for the token ids: a decode row's (a run
        # of one token that is sampled) is its sequence's last, without a call
        reqs = [run.req for run in runs]
        lengths, samples = [run.length for run in runs], [run.samples for run in runs]
        token_ids: list[int] = []
        for run in runs:
            r = run.req
            if run.samples and run.length == 1:
                token_ids.append((r.output_ids or r.prompt_ids)[-1])
            else:
                token_ids += r.token_slice(run.start, run.start + run.length)
        saves = [(i, r.state_checkpoint) for i, r in enumerate(reqs) if r.state_checkpoint is not None]
        scoring = [(i, run.req, run.start, run.length) for i, run in enumerate(runs)
                   if run.req.prompt_logprobs is not None and run.start < len(run.req.prompt_ids) - 1]
        starts, lengths = np.array([run.start for run in runs], np.int64), np.array(lengths, np.int64)
        qstart = np.zeros(B + 1, np.int32)
        np.cumsum(lengths, out=qstart[1:])
        T = int(qstart[-1])
        # token t of run i sits at position starts[i] + t - qstart[i]
        pos = np.arange(T, dtype=np.int64) - np.repeat(qstart[:-1] - starts, lengths)
        ids = np.array(token_ids, np.int32)
        table = self.tables.gather(reqs)
        slots = slot_mapping(table, np.repeat(np.arange(B), lengths), pos, bs)
        sampled = np.array(samples, bool)
        state_slots = checkpoints = None
        if reqs[0].state_slot is not None:
            state_slots = np.array([r.state_slot for r in reqs], np.int32)
            if saves:   # prefill runs crossing their prompt's last full block (kv/hybrid.py)
                checkpoints = np.zeros((2, B), np.int32)
                for i, (position, row) in saves:
                    checkpoints[:, i] = position - starts[i], row
        scored = Scored.of(scoring, qstart) if scoring else None
        return HostBatch(ids, pos.astype(np.int32), slots, table, qstart, (starts + lengths).astype(np.int32),
                         qstart[1:][sampled] - 1, state_slots, checkpoints, scored)

    def dummy_batch(self, num_seqs: int, tokens_each: int) -> HostBatch:
        """Sequences of `tokens_each` prefill tokens in consecutive blocks from block 1 (profiling)."""
        bs, per = self.block_size, -(-tokens_each // self.block_size)
        tables = 1 + np.arange(num_seqs * per, dtype=np.int32).reshape(num_seqs, per)
        pos = np.tile(np.arange(tokens_each, dtype=np.int32), num_seqs)
        slots = (tables[:, :, None] * bs + np.arange(bs)).reshape(num_seqs, -1)[:, :tokens_each].reshape(-1)
        qs = np.arange(num_seqs + 1, dtype=np.int32) * tokens_each
        state_slots = 1 + np.arange(num_seqs, dtype=np.int32) if self.pools.slots else None
        return HostBatch(np.zeros(len(pos), np.int32), pos, slots.astype(np.int64), tables, qs,
                         np.full(num_seqs, tokens_each, np.int32), qs[1:] - 1, state_slots)

    def profile(self, h: HostBatch) -> None:
        """One forward of a made-up batch (its K/V is garbage: profile on throw-away pools)."""
        with self.backend.current():
            self._forward(self.upload(h))
        self.backend.synchronize()

    def upload(self, h: HostBatch) -> ForwardBatch:
        to = self.backend.asarray
        return ForwardBatch(
            token_ids=to(h.token_ids), positions=to(h.positions), slot_mapping=to(h.slot_mapping),
            block_tables=to(h.block_tables), query_start=to(h.query_start), context_lens=to(h.context_lens),
            sample_rows=to(h.sample_rows if h.scored is None else np.concatenate([h.sample_rows, h.scored.rows])),
            query_start_host=h.query_start, context_lens_host=h.context_lens,
            block_size=self.block_size, max_query_len=int(np.diff(h.query_start).max()),
            max_context_len=int(h.context_lens.max()),
            state_slots=None if h.state_slots is None else to(h.state_slots),
            checkpoint_lens=None if h.checkpoints is None else to(h.checkpoints[0]),
            checkpoint_rows=None if h.checkpoints is None else to(h.checkpoints[1]))

    def prepare(self, plan: StepPlan) -> ForwardBatch:
        return self.upload(self.prepare_host(plan))

    def run(self, plan: StepPlan, logits_rows: list[int] | tuple[int, ...] = (),
            sampling: SamplingBatch | None = None) -> StepOutput:
        """Greedy tokens of every sampled row, float32 logits of the sampled rows listed, and the
        device sampler's results for the rows of `sampling` (backends with samples_on_device)."""
        return self.collect(self.launch(plan, sampling), logits_rows)

    def step(self, plan: StepPlan) -> Step:
        return Step(self.prepare_host(plan), list(plan.state_copies), list(plan.block_copies))

    def launch(self, plan: StepPlan, sampling: SamplingBatch | None = None) -> Launched:
        """Queue the step on the device; `collect` waits for its results."""
        return self.execute(self.step(plan), sampling)

    def launch_next(self, plan: StepPlan, prev: Launched) -> Launched:
        """Queue the decode step that follows `prev` (pipeline.py: the same requests, one token on,
        every row plain greedy) before `prev` is collected."""
        return self.execute(Step(self.next_host(plan, prev.host), follows=True), prev=prev)

    def execute(self, step: Step, sampling: SamplingBatch | None = None, prev: Launched | None = None) -> Launched:
        """Queue a step's copies and forward (a graph replay for a decode batch that fits one), and the
        device sampler's draws for the rows of `sampling`, on this runner's device and stream whatever the
        calling thread's are (Backend.current). `prev`: the step a `follows` step comes after."""
        with self.backend.current():
            return self._execute(step, sampling, prev)

    def _execute(self, step: Step, sampling: SamplingBatch | None, prev: Launched | None) -> Launched:
        if step.follows:
            return self._replay_next(step.host, prev)
        self.pools.copy_state_rows(step.state_copies)
        self.pools.copy_blocks(step.block_copies)
        h = step.host
        B, be = len(h.context_lens), self.backend
        graph = self.graphs is not None and h.is_decode and self.graphs.bucket(B) is not None
        if graph:
            logits, tokens = self.graphs.replay(h)
            tokens = tokens[:B]
            rows = h.sample_rows      # a graph computes every row: pick the sampled ones
        else:
            if n := self._beside_rows(h):
                head, rest = h.split(n)
                logits, tokens = self.graphs.replay_beside(head, lambda: self._forward(self.upload(rest)))
            else:
                logits, tokens = self._forward(self.upload(h))
            rows = np.arange(len(h.sample_rows), dtype=np.int32)
        scores = None
        if h.scored is not None:   # never in a graph: only prefill runs score
            scores = be.score_rows(logits[len(rows):], h.scored.targets, h.scored.top_k)
        samples = {}
        if sampling is not None and len(sampling):   # launched before the host waits for the greedy tokens
            sampling.params[:, ROW] = rows[sampling.sampled]
            samples = dict(zip(sampling.sampled.tolist(), be.sample(logits, sampling)))
        return Launched(h, logits, tokens, rows, samples, graph, scores=scores)

    def _beside_rows(self, h: HostBatch) -> int:
        """The leading decode rows of a mixed step to replay on their graph beside the rest, or 0: none, too little KV
        read (BESIDE_READ_RATIO), no graph for them, a step that scores prompt rows, or expert-parallel ranks (their
        collectives pair up in order, so a rank runs one forward at a time)."""
        if self.graphs is None or h.scored is not None or self.backend.comm is not None:
            return 0
        n = leading_one_token_runs(h.query_start)
        if not 0 < n < len(h.context_lens) or self.graphs.bucket(n) is None:
            return 0
        r = self.reads
        read = int(h.context_lens[:n].sum()) * r.per_token + n * r.per_row
        return n if read >= BESIDE_READ_RATIO * r.weights else 0

    def _replay_next(self, h: HostBatch, prev: Launched) -> Launched:
        """Its input ids are prev's greedy tokens (rank 0's, on every rank), copied on the device; prev's
        tokens are first queued to the host, since this replay overwrites the graph's output buffer and
        prev's collect must not wait for this step."""
        prev.fetch = self.graphs.fetch(prev.tokens)
        ids = prev.tokens
        if self.backend.comm is not None:   # every rank feeds rank 0's tokens: a replicated layer tuned
            ids = self.backend.comm.broadcast(ids)   # to another GEMM algorithm may round a near-tie otherwise
        logits, tokens = self.graphs.replay(h, ids=ids)
        return Launched(h, logits, tokens[: len(h.context_lens)], h.sample_rows, {}, True)

    def next_host(self, plan: StepPlan, prev: HostBatch) -> HostBatch:
        """The inputs of a decode step one token after `prev` for the same rows (blocks allocated):
        token ids are left 0 for the device to fill."""
        table = self.tables.gather([run.req for run in plan.runs])
        pos = prev.positions.astype(np.int64) + 1
        slots = slot_mapping(table, np.arange(len(pos)), pos, self.block_size)
        return HostBatch(np.zeros_like(prev.token_ids), pos.astype(np.int32), slots, table, prev.query_start,
                         prev.context_lens + 1, prev.sample_rows, prev.state_slots)

    def collect(self, step: Launched, logits_rows: list[int] | tuple[int, ...] = ()) -> StepOutput:
        """Wait for a launched step's greedy tokens (and the listed sampled rows' float32 logits)."""
        be, rows = self.backend, step.rows
        host_tokens = (be.to_host(step.tokens) if step.fetch is None else step.fetch())[rows]
        picked = {}
        if logits_rows:
            wanted = list(logits_rows)
            got = be.to_host(step.logits[be.asarray(rows[wanted])])
            picked = dict(zip(wanted, np.asarray(got, dtype=np.float32)))
        scored = {} if step.scores is None else self._scored(step.host.scored, [be.to_host(a) for a in step.scores])
        return StepOutput(host_tokens.astype(np.int64), picked, step.samples, scored)

    @staticmethod
    def _scored(scored: Scored, arrays: list[np.ndarray]) -> dict[int, list[SampleResult]]:
        """Each scoring run's prompt tokens as SampleResults, with the top alternatives its request asks for."""
        logprob, rank, top_v, top_i = (a.tolist() for a in arrays)
        out = {}
        for run, first, n, k in scored.runs:
            out[run] = [SampleResult(t, logprob[r], [*zip(top_i[r][:k], top_v[r][:k])] if k else None, rank[r])
                        for r, t in zip(range(first, first + n), scored.targets[first:first + n].tolist())]
        return out
