"""MLA on the GPU against the numpy reference ops on random inputs (skipped without one): mla_attention's decode kernel
(contexts split over thread-block clusters and merged in the kernel, over distributed shared memory and through
partials; grids as a CUDA graph sizes them, graph capture and replay at other context lengths; a sequence's output
bits the same in any batch and graph) and its runs of
several tokens (prefill, prefix hits, empty runs, heads of a row tile spanning tokens), mla_write_latent, mla_rope and
per_head_linear."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from cuda_cases import (  # noqa: F401  (the fixtures are used by name)
    BF16, DTYPES, after_inputs, arrival_counters_left_zero, captured, close, cp, dev, exact, host, own_stream, pdl,
    replayed, rnd)
from test_cuda_attention import _batch
from openinfer.kernels import numpy_mla_moe as ref
from openinfer.kernels.numpy_ops import rms_norm
from openinfer.kernels.cuda import blas, mla, ops

pytestmark = pytest.mark.cuda
BF = DTYPES["bfloat16"]
R, P = 512, 64


def _inputs(runs, nh, seed, bs=16, q_pad=0, reference=True):
    """A batch of (context, run) sequences over a shuffled latent pool (layer 1 of 2) and q_latent / q_pe as
    strided views of one wider buffer (q_pad extra columns a token, as a fused projection would leave); the numpy
    reference output unless `reference` is off (None)."""
    rng = np.random.default_rng(seed)
    num_blocks = sum(-(-L // bs) for L, _ in runs) + 3
    hb, db = _batch(runs, bs, rng, num_blocks)
    T = int(hb.query_start_host[-1])
    pool = exact(rnd(rng, num_blocks, 2, bs, R + P), BF16)
    wide = exact(rnd(rng, T, nh * (R + P) + q_pad), BF16)
    ql = wide[:, : nh * R].reshape(T, nh, R)
    qp = wide[:, nh * R: nh * (R + P)].reshape(T, nh, P)
    scale = 192 ** -0.5
    want = ref.mla_attention(ql, qp, pool[:, 1], hb, scale) if reference else None
    wide_d, pool_d = dev(wide, BF16), dev(pool, BF16)
    qld = wide_d[:, : nh * R].reshape(T, nh, R)
    qpd = wide_d[:, nh * R: nh * (R + P)].reshape(T, nh, P)
    return qld, qpd, pool_d[:, 1], db, scale, want


def _lens(n, lo, hi):
    """n decode runs of context lengths spread over lo .. hi (odd ones among them)."""
    return [(int(L), 1) for L in np.linspace(lo, hi, n).astype(int) | 1]


CASES = {
    # runs (context, query run), heads: decode with long and tiny contexts (V2-Lite's 16 heads, 64 = 4 row tiles)
    "decode_16": ([(3000, 1), (17, 1), (1, 1), (513, 1), (4100, 1)], 16),
    "decode_64_heads": ([(700, 1), (33, 1)], 64),
    "decode_4_heads": ([(1000, 1), (2, 1), (64, 1)], 4),
    # batch 1: 4 clusters of 2 (1k keys, 128 a CTA; and 1k + 1), 16 of 512-key CTAs (16k), one partial tile
    "decode_batch1_1k": ([(1024, 1)], 16),
    "decode_batch1_1025": ([(1025, 1)], 16),
    "decode_batch1_16k": ([(16001, 1)], 16),
    "decode_batch1_31": ([(31, 1)], 16),
    # contexts of many odd lengths; batches whose grid's clusters take several of a sequence's clusters in turn
    "decode_odd": ([(1, 1), (31, 1), (33, 1), (257, 1), (1023, 1), (4097, 1), (2049, 1)], 16),
    "decode_many": ([(100, 1)] * 40, 16),
    "decode_40": (_lens(40, 1, 3000), 16),
    "decode_128": (_lens(128, 1, 1100), 16),
    "decode_300": (_lens(300, 1, 200), 16),
    # runs of several tokens: whole prompts, prefix hits, an empty run, a one-token run among them
    "prefill_16": ([(37, 37), (100, 30), (5, 1), (70, 64), (50, 0), (16, 16)], 16),
    "prefill_4_heads": ([(130, 130), (77, 13), (9, 9)], 4),
    "prefill_long_prefix": ([(1500, 40), (300, 300)], 16),
    "prefill_6_heads": ([(45, 45), (200, 7)], 6),
}


@pytest.mark.parametrize("graph_width", [False, True])
@pytest.mark.parametrize("case", list(CASES))
def test_mla_attention(case, graph_width, pdl):
    runs, nh = CASES[case]
    qld, qpd, cache, db, scale, want = _inputs(runs, nh, len(case), q_pad=8 if "prefill" in case else 0)
    if graph_width:   # the grid a CUDA graph captured at a long context launches (decode splits mostly empty)
        db = dataclasses.replace(db, max_context_len=20480)
    got = mla.mla_attention(qld, qpd, cache, db, scale)
    close(got, want, BF)
    np.testing.assert_array_equal(host(mla.mla_attention(qld, qpd, cache, db, scale)), host(got))   # deterministic


@pytest.mark.parametrize("bs", [64, 1])
def test_mla_attention_block_sizes(bs):
    qld, qpd, cache, db, scale, want = _inputs([(300, 1), (129, 1)], 16, 3, bs=bs)
    close(mla.mla_attention(qld, qpd, cache, db, scale), want, BF)
    qld, qpd, cache, db, scale, want = _inputs([(300, 20), (129, 129)], 16, 4, bs=bs)
    close(mla.mla_attention(qld, qpd, cache, db, scale), want, BF)


@pytest.mark.parametrize("case", ["decode_16", "decode_batch1_1k", "decode_40"])
def test_mla_attention_without_clusters(case, monkeypatch):
    """A GPU without thread-block clusters: splits of one CTA each, every column of a head merged by the last."""
    monkeypatch.setattr(mla, "clusters_supported", lambda: False)
    runs, nh = CASES[case]
    qld, qpd, cache, db, scale, want = _inputs(runs, nh, len(case))
    close(mla.mla_attention(qld, qpd, cache, dataclasses.replace(db, max_context_len=20480), scale), want, BF)


def test_mla_decode_graph_replays():
    """Split decode captured into a CUDA graph at a long context and replayed twice (output zeroed before each):
    the same bits as eager, so each replay left its arrival counters zero for the next; then replayed on other
    context lengths written into the captured batch (fewer and more clusters used, a context of one key)."""
    runs = [(5000, 1), (2, 1), (600, 1)]
    qld, qpd, cache, db, scale, want = _inputs(runs, 16, 9)
    db = dataclasses.replace(db, max_context_len=20480)
    stream, pool = cp.cuda.Stream(non_blocking=True), cp.cuda.MemoryPool()
    with after_inputs(stream):
        eager = host(mla.mla_attention(qld, qpd, cache, db, scale))
        got, graph = captured(lambda: mla.mla_attention(qld, qpd, cache, db, scale), stream, pool)
        for _ in range(2):
            np.testing.assert_array_equal(replayed(graph, stream, got), eager)
        lens = np.array([1025, 1, 599], np.int32)   # within the captured block tables
        db.context_lens[...] = cp.asarray(lens)
        stream.synchronize()
        hb = dataclasses.replace(db, block_tables=cp.asnumpy(db.block_tables), query_start=cp.asnumpy(db.query_start),
                                 context_lens=lens, context_lens_host=lens)
        other = ref.mla_attention(host(qld), host(qpd), host(cache), hb, scale)
        close(replayed(graph, stream, got), other, BF)
    close(eager, want, BF)


KEY_COUNTS = (1, 31, 127, 128, 129, 1000, 1025, 5000, 20000)


def _decode_rows(qld, qpd, db, rows, max_context_len):
    """q_latent, q_pe and the batch of the decode batch db's sequences `rows` alone, in that order, under
    max_context_len."""
    idx = cp.asarray(np.asarray(rows, np.int32))
    lens = db.context_lens_host[rows]
    qs = np.arange(len(rows) + 1, dtype=np.int32)
    sub = dataclasses.replace(db, token_ids=db.token_ids[idx], positions=db.positions[idx],
                              slot_mapping=db.slot_mapping[idx], block_tables=db.block_tables[idx],
                              query_start=cp.asarray(qs), context_lens=db.context_lens[idx], query_start_host=qs,
                              context_lens_host=lens, max_context_len=max_context_len)
    return qld[idx], qpd[idx], sub


def test_mla_decode_bits_depend_on_the_keys_alone():
    """Each sequence's output rows are the same bits computed alone (batch 1, its own length as max_context_len),
    in batches of 2 .. 300 among sequences of other lengths, under a CUDA graph's max_context_len (4096 where it
    covers the batch, 20480), and replayed from a graph captured at 20480: a sequence's split depends on its own
    key count alone, so batching and CUDA graphs never change a greedy token. Batches up to mla.W8_MAX_TILES run the
    eight-warp kernel, larger ones the four-warp one: the same bits."""
    rng = np.random.default_rng(11)
    runs = [(L, 1) for L in (*KEY_COUNTS, *(int(x) for x in rng.integers(1, 300, 300)))]
    qld, qpd, cache, db, scale, _ = _inputs(runs, 16, 12, reference=False)
    n = len(KEY_COUNTS)
    alone = []
    for i in range(n):
        ql, qp, sub = _decode_rows(qld, qpd, db, [i], KEY_COUNTS[i])
        alone.append(host(mla.mla_attention(ql, qp, cache, sub, scale))[0])
    for size in (2, 7, 32, 128, 300):
        rows = rng.permutation(n)[:size].tolist() + (n + rng.permutation(300)[: max(0, size - n)]).tolist()
        rows = [int(r) for r in rng.permutation(rows)]
        longest = int(db.context_lens_host[rows].max())
        for max_context in sorted({longest, max(longest, 4096), 20480}):
            ql, qp, sub = _decode_rows(qld, qpd, db, rows, max_context)
            got = host(mla.mla_attention(ql, qp, cache, sub, scale))
            for j, r in enumerate(rows):
                if r < n:
                    np.testing.assert_array_equal(got[j], alone[r], err_msg=f"{KEY_COUNTS[r]} keys, batch {size}, "
                                                                          f"max_context_len {max_context}")
    stream, pool = cp.cuda.Stream(non_blocking=True), cp.cuda.MemoryPool()
    ql, qp, sub = _decode_rows(qld, qpd, db, list(range(32)), 20480)
    with after_inputs(stream):
        got, graph = captured(lambda: mla.mla_attention(ql, qp, cache, sub, scale), stream, pool)
        out = replayed(graph, stream, got)
    for r in range(n):
        np.testing.assert_array_equal(out[r], alone[r], err_msg=f"{KEY_COUNTS[r]} keys, graph replay")


def test_mla_write_latent():
    """Rows land at their slots (c then k_pe), from strided views; negative slots and other rows stay untouched."""
    rng = np.random.default_rng(5)
    nb, bs, T = 6, 16, 9
    pool = exact(rnd(rng, nb, 2, bs, R + P), BF16)
    kv = exact(rnd(rng, T, R + P + 8), BF16)   # c || k_pe || something else, as a fused projection leaves them
    slots = rng.choice(nb * bs, T, replace=False).astype(np.int64)
    slots[3] = -1
    pool_d, kv_d = dev(pool, BF16), dev(kv, BF16)
    mla.mla_write_latent(pool_d[:, 0], kv_d[:, :R], kv_d[:, R: R + P], cp.asarray(slots))
    want = pool.copy()
    keep = slots >= 0
    ref.mla_write_latent(want[:, 0], kv[keep, :R], kv[keep, R: R + P], slots[keep])
    np.testing.assert_array_equal(host(pool_d), want)


@pytest.mark.parametrize("T,nh", [(1, 16), (37, 4)])
def test_mla_rope(T, nh, pdl):
    """q_pe and k_pe as slices of the projections (q [T, H, dn + P], kv [T, R + P]), YaRN-like tables."""
    rng = np.random.default_rng(T)
    dn, max_pos = 128, 4096
    q = exact(rnd(rng, T, nh, dn + P), BF16)
    kv = exact(rnd(rng, T, R + P), BF16)
    pos = rng.integers(0, max_pos, T).astype(np.int32)
    angles = np.outer(np.arange(max_pos), 10000.0 ** (-np.arange(0, P, 2) / P))
    cos, sin = (0.9 * np.cos(angles)).astype(np.float32), (0.9 * np.sin(angles)).astype(np.float32)
    want_q, want_k = ref.mla_rope(q[:, :, dn:], kv[:, R:], pos, cos, sin)
    qd, kvd = dev(q, BF16), dev(kv, BF16)
    got_q, got_k = mla.mla_rope(qd[:, :, dn:], kvd[:, R:], cp.asarray(pos), cp.asarray(cos), cp.asarray(sin))
    close(got_q, want_q, BF)
    close(got_k, want_k, BF)


@pytest.mark.parametrize("T,nh", [(1, 16), (37, 4)])
@pytest.mark.parametrize("w_dtype", [BF16, np.float32])
def test_mla_rope_write(T, nh, w_dtype, pdl):
    """The latent norm, both RoPEs and the cache write in one launch, from one fused projection row (q || kv), against
    numpy_mla_moe.mla_rope_write and, to within a bf16 step, the three unfused launches; a negative slot writes
    nothing and every other pool row stays untouched."""
    rng = np.random.default_rng(T + 1)
    dn, max_pos, nb, bs = 128, 4096, 6, 16
    row = exact(rnd(rng, T, nh * (dn + P) + R + P), BF16)
    w = exact(1 + 0.1 * rnd(rng, R), w_dtype)
    pos = rng.integers(0, max_pos, T).astype(np.int32)
    angles = np.outer(np.arange(max_pos), 10000.0 ** (-np.arange(0, P, 2) / P))
    cos, sin = (0.9 * np.cos(angles)).astype(np.float32), (0.9 * np.sin(angles)).astype(np.float32)
    pool = exact(rnd(rng, nb, 2, bs, R + P), BF16)
    slots = rng.choice(nb * bs, T, replace=False).astype(np.int64)
    slots[T // 2] = -1
    q, kv = row[:, : nh * (dn + P)].reshape(T, nh, dn + P), row[:, nh * (dn + P):]
    want = pool.copy()
    keep = slots >= 0
    _, k_rot = ref.mla_rope(q[keep, :, dn:], kv[keep, R:], pos[keep], cos, sin)
    ref.mla_write_latent(want[:, 0], rms_norm(kv[keep, :R], w, 1e-6), k_rot, slots[keep])
    want_q, _ = ref.mla_rope(q[:, :, dn:], kv[:, R:], pos, cos, sin)
    rd, pool_d = dev(row, BF16), dev(pool, BF16)
    qd, kvd = rd[:, : nh * (dn + P)].reshape(T, nh, dn + P), rd[:, nh * (dn + P):]
    args = (cp.asarray(pos), cp.asarray(cos), cp.asarray(sin))
    got_q = mla.mla_rope_write(qd[:, :, dn:], kvd, dev(w, w_dtype), 1e-6, *args, pool_d[:, 0], cp.asarray(slots))
    close(got_q, want_q, BF)
    close(pool_d, want, BF)
    unfused = dev(pool, BF16)
    q_rot, k_rot = mla.mla_rope(qd[:, :, dn:], kvd[:, R:], *args)
    mla.mla_write_latent(unfused[:, 0], ops.rms_norm(kvd[:, :R], dev(w, w_dtype), 1e-6), k_rot, cp.asarray(slots))
    np.testing.assert_array_equal(host(got_q), host(q_rot))
    np.testing.assert_allclose(host(pool_d), host(unfused), rtol=2 ** -7, atol=0)


@pytest.mark.parametrize("T,H,n_in,n_out", [(1, 16, 128, 512), (3, 16, 512, 128), (8, 16, 128, 512),
                                            (9, 16, 512, 128), (40, 4, 16, 512)])
def test_per_head_linear(T, H, n_in, n_out, pdl):
    """x as a strided slice (q_nope of q [T, H, dn + P]), w as one too (W_UV of kv_b_proj [H, 64 + n_out, n_in]);
    MLA's W_UK^T and W_UV shapes, on the per-head GEMV (up to 8 tokens) and on cuBLAS."""
    rng = np.random.default_rng(n_in)
    wide = exact(rnd(rng, T, H, n_in + 64), BF16)
    kv_b = exact(rnd(rng, H, 64 + n_out, n_in, scale=n_in ** -0.5), BF16)
    got = blas.per_head_linear(dev(wide, BF16)[:, :, :n_in], dev(kv_b, BF16)[:, 64:])
    close(got, ref.per_head_linear(wide[:, :, :n_in], kv_b[:, 64:]), BF)
