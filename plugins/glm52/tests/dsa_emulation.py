"""numpy emulations of the dsa.cu kernels, run from the launch arguments the CUDA launchers (openinfer_glm52.cuda.ops)
pass: raw pointers (host stand-ins from openinfer.testing.launch_check) and the element strides and sizes the kernel
indexes them with, exactly as the CUDA code does. Every element a kernel reads or writes must lie inside the array
the launcher passed for it (a paged cache inside its layer view's blocks and rows), so a wrong stride, layer,
block table or slot shows here on the CPU instead of as garbage or an illegal address on a GPU."""
from __future__ import annotations

from typing import Any, Callable

import numpy as np

from openinfer.testing.launch_check import FakeArray, check_launch, Launch

from test_glm52_cuda_compile import emulate_select


class Memory:
    """A launch argument's elements as the kernel addresses them: flat offsets in elements from its pointer,
    bounded by the array the launcher passed (a view reaches no element outside itself)."""

    def __init__(self, a: FakeArray, dtype: Any = None) -> None:
        assert isinstance(a, FakeArray), f"a kernel argument is a {type(a).__name__}, not a device array"
        assert dtype is None or a.dtype == np.dtype(dtype), f"the kernel reads {np.dtype(dtype)}, got {a.dtype}"
        it = a.itemsize
        assert all(s % it == 0 and s >= 0 for s in a.strides), f"strides {a.strides}"
        dims = sorted(((s // it, n, axis) for axis, (n, s) in enumerate(zip(a.shape, a.strides))), reverse=True)
        for (outer, _, _), (inner, n, _) in zip(dims, dims[1:]):   # each stride spans the dims inside it
            assert n <= 1 or outer >= inner * n, f"overlapping layout: shape {a.shape}, strides {a.strides}"
        self.a, self.dims = a, dims

    def _index(self, offsets: np.ndarray) -> tuple[np.ndarray, ...]:
        rest = np.asarray(offsets, np.int64).reshape(-1).copy()
        index: list[np.ndarray] = [np.zeros_like(rest)] * self.a.ndim
        ok = rest >= 0
        for stride, n, axis in self.dims:
            i = rest // max(stride, 1) if n > 1 else np.zeros_like(rest)
            ok &= (i >= 0) & (i < n)
            rest = rest - i * stride
            index[axis] = i
        ok &= rest == 0
        bad = np.asarray(offsets).reshape(-1)[~ok]
        assert not len(bad), f"access outside the array passed (shape {self.a.shape}, strides " \
                             f"{self.a.strides}): element offsets {bad[:5].tolist()}"
        return tuple(index)

    def read(self, offsets: Any) -> np.ndarray:
        offsets = np.asarray(offsets, np.int64)
        return np.asarray(self.a)[self._index(offsets)].reshape(offsets.shape)

    def write(self, offsets: Any, values: np.ndarray) -> None:
        np.asarray(self.a)[self._index(offsets)] = np.asarray(values).reshape(-1)


def _seq_pos(qs: np.ndarray, lens: np.ndarray, t: int) -> tuple[int, int]:
    """token_seq_pos: the sequence of token t (the last whose start is <= t) and the token's position."""
    seq = int(np.searchsorted(qs[:-1], t, side="right")) - 1
    n = int(qs[seq + 1] - qs[seq])
    return seq, int(lens[seq]) - n + (t - int(qs[seq]))


def _cache_rows(cache: Memory, tables: Memory, table_stride: int, seq: int, pos: np.ndarray, bs: int,
                block_stride: int, dim: int) -> np.ndarray:
    """cache_row for each position: the element offset of its row's first element."""
    blocks = tables.read(seq * table_stride + pos // bs)
    return blocks.astype(np.int64) * block_stride + (pos % bs) * dim


def _rope(x: np.ndarray, c: np.ndarray, s: np.ndarray, interleave: bool) -> np.ndarray:
    half = c.shape[-1]
    a, b = (x[..., 0:2 * half:2], x[..., 1:2 * half:2]) if interleave else (x[..., :half], x[..., half:2 * half])
    return np.concatenate([a * c - b * s, b * c + a * s, x[..., 2 * half:]], axis=-1)


def indexer_rope_write(grid, args) -> None:
    (q, q_stride, k, k_stride, norm_w, norm_b, positions, cos, sin, half, cache, block_stride, block_size, slots,
     q_out, heads, dim, interleave) = args
    T, heads, dim, half, bs = grid[0], int(heads), int(dim), int(half), int(block_size)
    Q, K, W, B = Memory(q), Memory(k), Memory(norm_w), Memory(norm_b)
    P, C, S = Memory(positions, np.int32), Memory(cos, np.float32), Memory(sin, np.float32)
    CACHE, SLOT, OUT = Memory(cache), Memory(slots, np.int64), Memory(q_out)
    d = np.arange(dim)
    for t in range(T):
        pos = int(P.read(np.array(t)))
        c, s = C.read(pos * half + np.arange(half)), S.read(pos * half + np.arange(half))
        kr = K.read(t * int(k_stride) + d).astype(np.float32)
        kn = (kr - kr.mean()) / np.sqrt(np.square(kr - kr.mean()).mean() + np.float32(1e-6)) * W.read(d) + B.read(d)
        slot = int(SLOT.read(np.array(t)))
        if slot >= 0:
            block, row = divmod(slot, bs)
            assert block < cache.shape[0], f"slot {slot} outside the cache of {cache.shape[0]} blocks"
            CACHE.write(block * int(block_stride) + row * dim + d, _rope(kn, c, s, bool(interleave)))
        qr = Q.read(t * int(q_stride) + np.arange(heads)[:, None] * dim + d).astype(np.float32)
        OUT.write((t * heads + np.arange(heads)[:, None]) * dim + d, _rope(qr, c, s, bool(interleave)))


def _batch(block_tables, table_stride, query_start, context_lens, num_seqs):
    B = int(num_seqs)
    qs = Memory(query_start, np.int32).read(np.arange(B + 1))
    lens = Memory(context_lens, np.int32).read(np.arange(B))
    return Memory(block_tables, np.int32), int(table_stride), qs, lens


def indexer_scores(grid, args) -> None:
    (q, w, cache, block_stride, block_size, block_tables, table_stride, query_start, context_lens, num_seqs,
     scores, width, heads, dim, scale) = args
    T, width, heads, dim, bs = grid[0], int(width), int(heads), int(dim), int(block_size)
    tables, ts, qs, lens = _batch(block_tables, table_stride, query_start, context_lens, num_seqs)
    Q, W, CACHE, OUT = Memory(q), Memory(w, np.float32), Memory(cache), Memory(scores, np.float32)
    d = np.arange(dim)
    for t in range(T):
        seq, pos = _seq_pos(qs, lens, t)
        qt = Q.read((t * heads + np.arange(heads)[:, None]) * dim + d).astype(np.float32)
        wt = W.read(t * heads + np.arange(heads))
        row = np.full(width, -np.inf, np.float32)
        keys = np.arange(min(pos + 1, width))
        if len(keys):
            kv = CACHE.read(_cache_rows(CACHE, tables, ts, seq, keys, bs, int(block_stride), dim)[:, None] + d)
            dots = qt @ kv.astype(np.float32).T * np.float32(scale)
            row[keys] = wt @ np.maximum(dots, 0)
        OUT.write(t * width + np.arange(width), row)


def indexer_topk_select(grid, args) -> None:
    scores, width, query_start, context_lens, num_seqs, topk, ranks, staged_keys, out = args
    ranks, width, topk = int(ranks), int(width), int(topk)
    assert grid[0] % ranks == 0, f"grid {grid} is not whole rows of {ranks} ranks"
    T = grid[0] // ranks
    qs = Memory(query_start, np.int32).read(np.arange(int(num_seqs) + 1))
    lens = Memory(context_lens, np.int32).read(np.arange(int(num_seqs)))
    S, OUT = Memory(scores, np.float32), Memory(out, np.int32)
    for t in range(T):
        visible = _seq_pos(qs, lens, t)[1] + 1
        row = S.read(t * width + np.arange(visible)) if visible > topk else np.zeros(0, np.float32)
        OUT.write(t * topk + np.arange(topk), emulate_select(row, visible, topk, ranks))


def sparse_mla_attention(grid, args) -> None:
    (q_latent, q_pe, cache, block_stride, block_size, block_tables, table_stride, query_start, context_lens,
     num_seqs, indices, topk, out, heads, R, P, scale) = args
    T, heads, R, P, topk, bs = grid[0], int(heads), int(R), int(P), int(topk), int(block_size)
    tables, ts, qs, lens = _batch(block_tables, table_stride, query_start, context_lens, num_seqs)
    QL, QP, CACHE, IDX, OUT = Memory(q_latent), Memory(q_pe), Memory(cache), Memory(indices, np.int32), Memory(out)
    h = np.arange(heads)[:, None]
    for t in range(T):
        seq, pos = _seq_pos(qs, lens, t)
        q = np.concatenate([QL.read((t * heads + h) * R + np.arange(R)), QP.read((t * heads + h) * P + np.arange(P))],
                           axis=1).astype(np.float32)
        sel = IDX.read(t * topk + np.arange(topk))
        sel = sel[(sel >= 0) & (sel <= pos)]
        o = np.zeros((heads, R), np.float32)
        if len(sel):
            rows = CACHE.read(_cache_rows(CACHE, tables, ts, seq, sel, bs, int(block_stride), R + P)[:, None]
                              + np.arange(R + P)).astype(np.float32)
            scores = q @ rows.T * np.float32(scale)
            p = np.exp(scores - scores.max(axis=1, keepdims=True))
            o = (p / p.sum(axis=1, keepdims=True)) @ rows[:, :R]
        OUT.write((t * heads + h) * R + np.arange(R), o)


KERNELS: dict[str, Callable] = {"indexer_rope_write": indexer_rope_write, "indexer_scores": indexer_scores,
                                "indexer_topk_select": indexer_topk_select,
                                "sparse_mla_attention": sparse_mla_attention}


def emulated_launch(source, name: str, grid, block: int, args: tuple, smem: int = 0, cluster=None,
                    dependent: bool = False) -> None:
    """module.launch for dsa.cu on the host: the launch checked against the compiled parameters, then emulated."""
    call = Launch(source, name, tuple(int(g) for g in grid), block, args, smem, cluster, dependent)
    check_launch(call)
    kernel = name.rsplit("_", 1)[0] if name.endswith(("_bf16", "_f32")) else name
    if kernel == "indexer_topk_select":   # a row's ranks are one cluster
        assert (call.cluster or (1, 1, 1)) == (int(args[6]), 1, 1), f"ranks {args[6]}, cluster {call.cluster}"
    KERNELS[kernel](call.grid, args)
