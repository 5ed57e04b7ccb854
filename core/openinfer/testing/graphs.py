"""CUDA-graph decode emulated on the CPU, so a model line's graph plumbing is tested without a GPU.

A captured graph replays the same kernels on the same addresses: the batch it was captured with,
whose arrays are views of the static input buffers refilled before each replay, and whose host
fields are frozen placeholders. `EmulatedGraphs` does exactly that with numpy buffers: `replay`
stages the step through the real GraphInputs, copies the mirrors into the "device" buffers and
runs the forward on the bucket's captured batch, its outputs copied into the bucket's own buffers
(overwritten by the next replay, as a graph's are). An op that reads a decode batch's host fields, or
a model that keeps per-step Python state, gives different tokens here than eagerly — the bugs a
real graph would bake in.
"""
from __future__ import annotations

from contextlib import contextmanager
from typing import Any, Callable, Iterator

import numpy as np

from ..backends.cuda_graphs import DecodeGraphs, Forward, buckets
from ..backends.graph_inputs import GraphInputs
from ..engine import model_runner
from ..engine.engine import Engine
from ..engine.model_runner import HostBatch


class EmulatedGraphs:
    def __init__(self, forward: Forward, max_num_seqs: int, max_model_len: int, block_size: int,
                 state_slots: bool) -> None:
        self.forward, self.sizes = forward, buckets(max_num_seqs)
        self.inputs = GraphInputs(np, self.sizes[-1], -(-max_model_len // block_size))
        self.batches = {b: self.inputs.batch(b, block_size, max_model_len, state_slots) for b in self.sizes}
        self.replays: list[int] = []    # the bucket of every replay, for tests to check the path ran
        self.beside: list[int] = []     # the decode rows of every replay beside a mixed step's eager part
        self.outputs: dict[int, tuple[np.ndarray, np.ndarray]] = {}   # bucket -> (logits, tokens)

    bucket = DecodeGraphs.bucket   # the real graphs' choice (it reads only self.sizes)

    @staticmethod
    def fetch(tokens: Any) -> Callable[[], np.ndarray]:
        host = tokens.copy()   # now: the next replay overwrites the bucket's buffers
        return lambda: host

    def replay(self, h: HostBatch, ids: Any = None) -> tuple[Any, Any]:
        b = self.bucket(len(h.token_ids))
        width = self.inputs.stage(h)
        self.inputs.meta[:] = self.inputs.host
        self.inputs.tables[:, :width] = self.inputs.host_tables[:, :width]
        if ids is not None:
            self.inputs.ids(len(ids))[...] = ids
        self.replays.append(b)
        logits, tokens = self.forward(self.batches[b])
        # a graph writes its outputs to the same buffers every replay: so does the emulation
        if b not in self.outputs:
            self.outputs[b] = np.empty_like(logits), np.empty_like(tokens)
        self.outputs[b][0][...], self.outputs[b][1][...] = logits, tokens
        return self.outputs[b]

    def replay_beside(self, h: HostBatch, rest: Callable[[], tuple[Any, Any]]) -> tuple[Any, Any]:
        """The real graphs' result: the sampled rows of h's replay, then rest()'s."""
        logits, tokens = self.replay(h)
        self.beside.append(len(h.token_ids))
        rest_logits, rest_tokens = rest()
        rows = h.sample_rows
        return np.concatenate([logits[rows], rest_logits]), np.concatenate([tokens[rows], rest_tokens])


def emulate_graphs(engine: Engine) -> EmulatedGraphs:
    """Give a CPU engine emulated decode graphs (sized like `capture_graphs` would)."""
    runner = engine.runner
    graphs = EmulatedGraphs(runner._forward, engine.args.max_num_seqs, engine.max_model_len, runner.block_size,
                            bool(runner.pools.slots))
    runner.graphs = graphs
    return graphs


@contextmanager
def beside_read_ratio(ratio: float) -> Iterator[None]:
    """Inside the block, a mixed step's decode rows replay beside its prompts when they read `ratio` times the
    weights (model_runner.BESIDE_READ_RATIO): 0 whenever there are any, inf never."""
    before, model_runner.BESIDE_READ_RATIO = model_runner.BESIDE_READ_RATIO, ratio
    try:
        yield
    finally:
        model_runner.BESIDE_READ_RATIO = before
