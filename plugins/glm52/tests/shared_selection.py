"""Comparing two engines of a sparse model (e.g. bf16 on the GPU against the float32 CPU engine): the indexer's top-k
is discontinuous, so rounding moves keys near the cut in and out of a selection, and on a tiny random model one
moved key changes the logits by far more than the rounding itself (rounding only the indexer's bf16 query and keys
on the CPU moves ~0.2 keys of 64 a query and the logits by up to 1.5 of 3.6). So the logits are compared with the
reference engine attending over the engine's own selections, and the selections are compared apart."""
from __future__ import annotations

import numpy as np

from openinfer.testing.engine import prompt_logits


def logits_on_shared_selections(engine, reference, ids: list[int]) -> tuple[np.ndarray, np.ndarray, float]:
    """(engine's logits, reference's logits with every full layer taking the engine's selection, the mean share of
    the engine's selected keys the reference's own indexer selects too) over the prompt `ids`."""
    taken: list[np.ndarray] = []
    ops, ref_ops = engine.runner.model.ops, reference.runner.model.ops
    own_topk, ref_topk = ops.glm52_indexer_topk, ref_ops.glm52_indexer_topk

    def record(*args):
        out = own_topk(*args)
        taken.append(np.asarray(engine.runner.backend.to_host(out)))
        return out

    overlaps: list[float] = []

    def replay(*args):
        mine, theirs = taken.pop(0), np.asarray(ref_topk(*args))
        for a, b in zip(mine, theirs):
            a, b = a[a >= 0], b[b >= 0]
            overlaps.append(len(np.intersect1d(a, b)) / max(len(a), 1))
        return mine

    ops.glm52_indexer_topk, ref_ops.glm52_indexer_topk = record, replay
    try:
        ours = prompt_logits(engine, ids)
        ref = prompt_logits(reference, ids)
    finally:
        ops.glm52_indexer_topk, ref_ops.glm52_indexer_topk = own_topk, ref_topk
    assert taken == [] and overlaps, "the two engines ran different indexer calls"
    return ours, ref, float(np.mean(overlaps))
