"""Turns a StepPlan into a ForwardBatch, runs the model, returns the sampled rows' logits."""
from __future__ import annotations

import numpy as np

from .backends.numpy_backend import Backend
from .batch import ForwardBatch
from .kv.pool import StatePools
from .model_line import Model
from .scheduler import StepPlan


class ModelRunner:
    def __init__(self, model: Model, backend: Backend, pools: StatePools, block_size: int) -> None:
        self.model, self.backend, self.pools = model, backend, pools
        self.block_size = block_size

    def prepare(self, plan: StepPlan) -> ForwardBatch:
        bs = self.block_size
        ids, pos, slots, qstart, lens, rows = [], [], [], [0], [], []
        tables = []
        for run in plan.runs:
            r = run.req
            tokens = r.all_ids
            p = np.arange(run.start, run.start + run.length)
            ids.append(np.asarray(tokens[run.start: run.start + run.length], dtype=np.int32))
            pos.append(p)
            blocks = np.asarray(r.block_ids, dtype=np.int64)
            slots.append(blocks[p // bs] * bs + p % bs)
            qstart.append(qstart[-1] + run.length)
            lens.append(run.start + run.length)
            tables.append(r.block_ids)
            if run.samples:
                rows.append(qstart[-1] - 1)
        width = max(len(t) for t in tables)
        table = np.zeros((len(tables), width), dtype=np.int32)
        for i, t in enumerate(tables):
            table[i, : len(t)] = t
        qs, cl = np.asarray(qstart, dtype=np.int32), np.asarray(lens, dtype=np.int32)
        to = self.backend.asarray
        return ForwardBatch(
            token_ids=to(np.concatenate(ids)), positions=to(np.concatenate(pos).astype(np.int32)),
            slot_mapping=to(np.concatenate(slots).astype(np.int64)), block_tables=to(table),
            query_start=to(qs), context_lens=to(cl), sample_rows=to(np.asarray(rows, dtype=np.int32)),
            query_start_host=qs, context_lens_host=cl, block_size=bs,
            max_query_len=int(np.diff(qs).max()), max_context_len=int(cl.max()))

    def run(self, plan: StepPlan) -> np.ndarray:
        """Logits [S, vocab] as float32 host memory, one row per sampling run in plan order."""
        batch = self.prepare(plan)
        logits = self.model.forward(batch, self.pools)
        return np.asarray(self.backend.to_host(logits), dtype=np.float32)
