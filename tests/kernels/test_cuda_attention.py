"""Paged attention against the numpy reference on random inputs (GPU only; skipped elsewhere): prefill
(mma and wgmma kernels, varlen batches, prefix hits, strided q) and decode (ragged contexts, GQA, head dims
64-256, split-KV, deterministic merges, graph capture), for each of paged_attention's CUDA implementations.
"""
from __future__ import annotations

import numpy as np
import pytest

from openinfer.engine.batch import ForwardBatch
from openinfer.kernels import numpy_ops as ref
from cuda_cases import (  # noqa: F401  (the fixtures are used by name)
    BF16, DTYPES, after_inputs, arrival_counters_left_zero, captured, close, cp, dev, dt, exact, host, own_stream,
    replayed, rnd)
from openinfer.kernels.cuda import attention
from test_attention_mma_emulation import shuffled_tables

pytestmark = pytest.mark.cuda
# paged_attention's registry implementations by name; "wgmma" is the default on sm_90 (elsewhere it runs as "mma")
IMPLS = {"wgmma": attention.paged_attention, "mma": attention.paged_attention_mma,
         "cuda_cores": attention.paged_attention_cuda_cores}


def _batch(runs, block_size, rng, num_blocks):
    """runs: (context_len, query_len) per sequence; blocks are shuffled across sequences."""
    tables = shuffled_tables([-(-L // block_size) for L, _ in runs], num_blocks, rng)
    qs = np.concatenate([[0], np.cumsum([n for _, n in runs])]).astype(np.int32)
    lens = np.array([L for L, _ in runs], np.int32)
    pos = np.concatenate([np.arange(L - n, L) for L, n in runs]).astype(np.int32)
    host_b = dict(token_ids=np.zeros(qs[-1], np.int32), positions=pos, slot_mapping=np.zeros(qs[-1], np.int64),
                  block_tables=tables, query_start=qs, context_lens=lens, sample_rows=np.zeros(0, np.int32))
    meta = dict(query_start_host=qs, context_lens_host=lens, block_size=block_size,
                max_query_len=int(np.diff(qs).max()), max_context_len=int(lens.max()))
    return (ForwardBatch(**host_b, **meta),
            ForwardBatch(**{k: cp.asarray(v) for k, v in host_b.items()}, **meta))


ATTN_CASES = {
    "prefill_varlen_prefix": ([(37, 37), (100, 30), (5, 1), (70, 64), (16, 16)], 8, 2, 128),
    "prefill_mha_d64": ([(33, 33), (90, 41)], 4, 4, 64),
    "prefill_big_group_d256": ([(40, 21), (9, 9)], 16, 1, 256),
    # bf16 prefill runs on the tensor-core kernel (64-row tiles of (token, head) rows, 64-key tiles; d256: 32)
    "prefill_long_g4_d128": ([(700, 700), (1500, 300)], 32, 8, 128),
    "prefill_long_g2_d256": ([(600, 600), (300, 100), (45, 45)], 8, 4, 256),
    "prefill_g1_partial_d64": ([(130, 130), (77, 13), (50, 0), (1, 1), (64, 64)], 4, 4, 64),
    "prefill_g8_d128": ([(200, 200), (129, 65), (8, 3)], 16, 2, 128),
    "prefill_g16_d128": ([(300, 150), (33, 33)], 16, 1, 128),
    "decode_split_kv": ([(3000, 1), (17, 1), (1, 1), (513, 1), (4100, 1)], 8, 2, 128),
    "decode_group16_d64": ([(700, 1), (129, 1)], 32, 2, 64),
    "decode_no_split": ([(60, 1)] * 40, 8, 8, 128),
    "decode_d256": ([(1000, 1), (3, 1)], 8, 2, 256),
}


@pytest.mark.parametrize("impl", ["wgmma", "mma"])   # d128 bf16 prefill: the wgmma kernel (on sm_90) or mma
@pytest.mark.parametrize("case", list(ATTN_CASES))
def test_paged_attention(dt, case, impl):
    runs, nh, nkv, d = ATTN_CASES[case]
    rng = np.random.default_rng(len(case))
    bs, layers = 16, 2
    num_blocks = sum(-(-L // bs) for L, _ in runs) + 3
    hb, db = _batch(runs, bs, rng, num_blocks)
    T = int(hb.query_start_host[-1])
    pool = exact(rnd(rng, 2, num_blocks, layers, bs, nkv, d), dt[0])
    pool_d = dev(pool, dt[0])
    q = exact(rnd(rng, T, nh, d), dt[0])
    scale = d ** -0.5
    want = ref.paged_attention(q, pool[0][:, 1], pool[1][:, 1], hb, scale)
    got = IMPLS[impl](dev(q, dt[0]), pool_d[0][:, 1], pool_d[1][:, 1], db, scale)
    close(got, want, dt)


def _prefill_inputs(dt, runs, nh, nkv, d, seed, q_offset=0):
    """A prefill batch whose q is a strided view of a fused qkv-like buffer (as the model passes it),
    starting q_offset elements into each row (2: not 16-byte aligned, so the mma kernel is skipped)."""
    rng = np.random.default_rng(seed)
    bs, layers = 16, 3
    num_blocks = sum(-(-L // bs) for L, _ in runs) + 3
    hb, db = _batch(runs, bs, rng, num_blocks)
    T = int(hb.query_start_host[-1])
    pool = exact(rnd(rng, 2, num_blocks, layers, bs, nkv, d), dt[0])
    wide = exact(rnd(rng, T, (nh + 2 * nkv) * d + q_offset), dt[0])
    q = wide[:, q_offset: q_offset + nh * d].reshape(T, nh, d)
    qd = dev(wide, dt[0])[:, q_offset: q_offset + nh * d].reshape(T, nh, d)
    want = ref.paged_attention(q, pool[0][:, 2], pool[1][:, 2], hb, d ** -0.5)
    pool_d = dev(pool, dt[0])
    return qd, pool_d[0][:, 2], pool_d[1][:, 2], db, want


@pytest.mark.parametrize("q_offset", [0, 2])
def test_prefill_attention_strided_q(dt, q_offset):
    qd, kc, vc, db, want = _prefill_inputs(dt, [(300, 200), (90, 90)], 16, 4, 128, 12, q_offset)
    close(attention.paged_attention(qd, kc, vc, db, 128 ** -0.5), want, dt)


WGMMA_CASES = {
    # runs (context_len, query_len), nh, nkv (head dim 128): prefix hits, lengths off the 128-row and
    # 128-key tiles, an empty run, Qwen3-4B's 32 / 8 heads
    "varlen_prefix_g4": ([(37, 37), (100, 30), (5, 1), (70, 64), (50, 0), (16, 16)], 8, 2),
    "long_32_8": ([(1500, 1500), (2100, 700), (300, 129)], 32, 8),
    "mha_partial": ([(190, 41), (65, 65), (1, 1)], 4, 4),
    "g8": ([(200, 200), (129, 65), (8, 3)], 16, 2),
    "g16": ([(300, 150), (33, 33)], 16, 1),
}


@pytest.fixture
def wgmma_on(monkeypatch):
    """Skips without sm_90; returns the names of the attention kernels launched."""
    if cp.cuda.Device().compute_capability != "90":
        pytest.skip("the wgmma prefill kernel needs sm_90")
    names = []
    real = attention.launch
    monkeypatch.setattr(attention, "launch", lambda src, name, *a: (names.append(name), real(src, name, *a)))
    return names


@pytest.mark.parametrize("case", list(WGMMA_CASES))
def test_prefill_attention_wgmma(wgmma_on, case):
    """The wgmma prefill kernel against the reference and against the mma kernel."""
    runs, nh, nkv = WGMMA_CASES[case]
    dt = DTYPES["bfloat16"]
    qd, kc, vc, db, want = _prefill_inputs(dt, runs, nh, nkv, 128, 15)
    got = host(attention.paged_attention(qd, kc, vc, db, 128 ** -0.5))
    mma = attention.paged_attention_mma(qd, kc, vc, db, 128 ** -0.5)
    assert wgmma_on == ["paged_prefill_wgmma_bf16_d128", "paged_prefill_mma_bf16_d128"]
    close(got, want, dt)
    close(mma, got, dt)


def test_prefill_attention_wgmma_graph_capture(wgmma_on):
    """The wgmma prefill kernel captures into a CUDA graph and replays like eager."""
    dt = DTYPES["bfloat16"]
    qd, kc, vc, db, want = _prefill_inputs(dt, [(260, 130), (70, 70)], 32, 8, 128, 16)
    _assert_graph_replays_eager(dt, qd, kc, vc, db, want)
    assert set(wgmma_on) == {"paged_prefill_wgmma_bf16_d128"}


def _assert_graph_replays_eager(dt, qd, kc, vc, db, want) -> None:
    """paged_attention (head_dim 128) captured into a CUDA graph: a replay writes what eager computed."""
    stream = cp.cuda.Stream(non_blocking=True)
    with after_inputs(stream):
        eager = attention.paged_attention(qd, kc, vc, db, 128 ** -0.5)
        stream.begin_capture()
        got = attention.paged_attention(qd, kc, vc, db, 128 ** -0.5)
        graph = stream.end_capture()
        got[...] = 0
        graph.launch(stream)
        stream.synchronize()
    close(got, want, dt)
    np.testing.assert_array_equal(host(got), host(eager))


def test_prefill_attention_graph_capture(dt):
    """The prefill path (the mma kernel for bf16) captures into a CUDA graph and replays like eager."""
    qd, kc, vc, db, want = _prefill_inputs(dt, [(260, 130), (70, 70)], 8, 2, 128, 13)
    _assert_graph_replays_eager(dt, qd, kc, vc, db, want)


def test_decode_grid_fills_one_wave():
    """On this GPU (132 SMs, at least 2 blocks of either decode kernel an SM): batch 1's 4100-key context runs its
    splits (16 of 64-key passes on the tensor-core kernel, 9 of 128-key passes on the fp32 one) on as many blocks a
    KV head; 128 sequences x 8 KV heads fill the SMs alone, one block each taking its sequence's splits in turn (16
    slots, DECODE_CAP, at a 20480-key graph width)."""
    from openinfer.kernels.cuda.attention_decode import decode_grid, decode_kernel
    for kernel, splits in ((decode_kernel("bf16", 128, 2, True), 16), (decode_kernel("f32", 128, 4, False), 9)):
        assert decode_grid(1, 8, 4100, kernel) == (splits, splits)
        assert decode_grid(128, 8, 20480, kernel)[0] == 1
    assert decode_grid(128, 8, 20480, decode_kernel("bf16", 128, 2, True))[1] == 16


# decode over ragged contexts (1 .. 20k keys, block size 16): GQA ratios 1/4/8/16, head dims 64/128/256
DECODE_CASES = {
    "qwen3_4b_g4_d128": ([1024, 1, 17, 20000, 333, 4096, 16, 15], 32, 8, 128),
    "mha_g1_d64": ([5000, 1, 64, 65, 129], 4, 4, 64),
    "g8_d256": ([2048, 3, 700], 16, 2, 256),
    "g8_d128_long": ([12000, 31], 8, 1, 128),
    "g16_d128": ([900, 2], 16, 1, 128),
    "g4_d64_tiny": ([1, 2, 3, 4, 100], 8, 2, 64),
}


def _decode_inputs(dt, ctx, nh, nkv, d, seed):
    rng = np.random.default_rng(seed)
    bs, layers = 16, 2
    num_blocks = sum(-(-L // bs) for L in ctx) + 3
    hb, db = _batch([(L, 1) for L in ctx], bs, rng, num_blocks)
    pool = exact(rnd(rng, 2, num_blocks, layers, bs, nkv, d), dt[0])
    q = exact(rnd(rng, len(ctx), nh, d), dt[0])
    want = ref.paged_attention(q, pool[0][:, 1], pool[1][:, 1], hb, d ** -0.5)
    pool_d = dev(pool, dt[0])
    return dev(q, dt[0]), pool_d[0][:, 1], pool_d[1][:, 1], db, want


# decode kernels: the tensor-core one (the "mma" and "wgmma" implementations) and the fp32 CUDA-core one
DECODE_KERNELS = ["mma", "cuda_cores"]


@pytest.mark.parametrize("kernel", DECODE_KERNELS)
@pytest.mark.parametrize("graph_width", [False, True])
@pytest.mark.parametrize("case", list(DECODE_CASES))
def test_decode_attention(dt, case, graph_width, kernel):
    """Both decode kernels (bf16: the tensor-core one, or the fp32 one of the "cuda_cores" implementation;
    float32: the fp32 one) against the reference, with the grid sized for this batch or, as a CUDA graph
    sizes it, for a 20480-token context (most splits then empty; each sequence splits its own length)."""
    import dataclasses

    if kernel != "cuda_cores" and dt[0] != BF16:
        pytest.skip("the tensor-core decode kernel is bf16 only")
    ctx, nh, nkv, d = DECODE_CASES[case]
    qd, kc, vc, db, want = _decode_inputs(dt, ctx, nh, nkv, d, len(case))
    if graph_width:
        db = dataclasses.replace(db, max_context_len=20480)
    close(IMPLS[kernel](qd, kc, vc, db, d ** -0.5), want, dt)


def test_decode_attention_graph_capture():
    """The bf16 decode path (tensor-core kernel, splits merged in it) captures into a CUDA graph and
    replays like eager."""
    import dataclasses
    dt = DTYPES["bfloat16"]
    qd, kc, vc, db, want = _decode_inputs(dt, [3000, 1, 40, 17], 32, 8, 128, 21)
    db = dataclasses.replace(db, max_context_len=20480)
    _assert_graph_replays_eager(dt, qd, kc, vc, db, want)


@pytest.fixture
def decode_grids(monkeypatch):
    """The grids of the decode attention launches (split, head chunks, sequences), as launched."""
    from openinfer.kernels.cuda import attention_decode
    grids = []
    real = attention_decode.launch
    monkeypatch.setattr(attention_decode, "launch", lambda src, name, grid, *a, **k: (grids.append(grid),
                                                                                      real(src, name, grid, *a, **k)))
    return grids


def _counters_zero() -> bool:
    from openinfer.kernels.cuda.module import arrival_counters
    return not arrival_counters("decode_attention").any()


@pytest.mark.parametrize("kernel", DECODE_KERNELS)
def test_split_decode_is_deterministic(kernel, decode_grids):
    """The merging block is whichever split finished last, a race; the merge sums in split order, so
    repeated runs give the same bits, and every run leaves the arrival counters zero."""
    import dataclasses

    dt = DTYPES["bfloat16"]
    qd, kc, vc, db, want = _decode_inputs(dt, [20000, 1, 333, 4096, 15], 32, 8, 128, 23)
    db = dataclasses.replace(db, max_context_len=20480)   # most splits of the short contexts empty
    first = host(IMPLS[kernel](qd, kc, vc, db, 128 ** -0.5))
    close(first, want, dt)
    for _ in range(5):
        np.testing.assert_array_equal(host(IMPLS[kernel](qd, kc, vc, db, 128 ** -0.5)), first)
    assert all(g[0] > 1 for g in decode_grids), decode_grids
    assert _counters_zero()


@pytest.mark.parametrize("kernel", DECODE_KERNELS)
def test_split_decode_with_a_no_query_sequence(dt, kernel, decode_grids):
    """A sequence without a query this step (query_start repeats): all its blocks leave before counting,
    the others merge as usual, and the next launch still finds the counters zero."""
    import dataclasses

    if kernel != "cuda_cores" and dt[0] != BF16:
        pytest.skip("the tensor-core decode kernel is bf16 only")
    rng = np.random.default_rng(24)
    runs, nh, nkv, d, bs = [(3000, 1), (2000, 0), (700, 1), (5, 0), (64, 1)], 16, 4, 64, 16
    num_blocks = sum(-(-L // bs) for L, _ in runs) + 3
    hb, db = _batch(runs, bs, rng, num_blocks)
    db = dataclasses.replace(db, max_context_len=20480)
    pool = exact(rnd(rng, 2, num_blocks, 1, bs, nkv, d), dt[0])
    q = exact(rnd(rng, 3, nh, d), dt[0])
    want = ref.paged_attention(q, pool[0][:, 0], pool[1][:, 0], hb, d ** -0.5)
    pool_d, qd = dev(pool, dt[0]), dev(q, dt[0])
    for _ in range(2):
        close(IMPLS[kernel](qd, pool_d[0][:, 0], pool_d[1][:, 0], db, d ** -0.5), want, dt)
        assert _counters_zero()
    assert decode_grids[0][0] > 1 and decode_grids[0][2] == len(runs), decode_grids


@pytest.mark.parametrize("kernel", DECODE_KERNELS)
@pytest.mark.parametrize("keys", [64, 128, 256, 1024])
def test_split_decode_with_longer_splits(kernel, keys, decode_grids, monkeypatch):
    """DECODE_SPLIT_KEYS: each context is cut into splits of `keys` keys (in whole passes; then longer ones, by
    the rule), the grid's blocks past a context's splits leave without counting; the merge waits for the used
    ones only. Against the reference, the same bits on a rerun, the counters left zero, in a grid sized for
    20480 keys."""
    import dataclasses

    from openinfer.kernels.cuda import attention_decode
    monkeypatch.setattr(attention_decode, "DECODE_SPLIT_KEYS", keys)
    dt = DTYPES["bfloat16"]
    qd, kc, vc, db, want = _decode_inputs(dt, [20000, 1, 1024, 333, 4097, 64, 65], 32, 8, 128, 26)
    db = dataclasses.replace(db, max_context_len=20480)
    first = host(IMPLS[kernel](qd, kc, vc, db, 128 ** -0.5))
    close(first, want, dt)
    np.testing.assert_array_equal(host(IMPLS[kernel](qd, kc, vc, db, 128 ** -0.5)), first)
    assert _counters_zero()
    assert decode_grids[0][0] > 1, decode_grids


def _first(db, seqs: int):
    """The device batch's first `seqs` sequences, under their own longest context."""
    import dataclasses
    lens = db.context_lens_host[:seqs]
    return dataclasses.replace(db, block_tables=db.block_tables[:seqs], query_start=db.query_start[: seqs + 1],
                               context_lens=db.context_lens[:seqs], query_start_host=db.query_start_host[: seqs + 1],
                               context_lens_host=lens, max_context_len=int(lens.max()))


@pytest.mark.parametrize("kernel", DECODE_KERNELS)
def test_decode_bits_depend_on_the_keys_alone(kernel, decode_grids):
    """A sequence's splits follow its key count alone; the grid (batch size, max_context_len) only decides how
    many blocks take them in turn. So every row is the same bits in the batch, under a CUDA graph's 40960-key
    width (eager and replayed), and in batches of the first sequence (20000 keys) and of the first two."""
    import dataclasses
    dt = DTYPES["bfloat16"]
    qd, kc, vc, db, want = _decode_inputs(dt, [20000, 4096, 1, 333, 1500, 15], 32, 8, 128, 27)
    run = IMPLS[kernel]
    full = host(run(qd, kc, vc, db, 128 ** -0.5))
    close(full, want, dt)
    wide = dataclasses.replace(db, max_context_len=40960)
    np.testing.assert_array_equal(host(run(qd, kc, vc, wide, 128 ** -0.5)), full)
    for seqs in (1, 2):
        np.testing.assert_array_equal(host(run(qd[:seqs], kc, vc, _first(db, seqs), 128 ** -0.5)), full[:seqs])
    assert len({g[0] for g in decode_grids}) > 1, decode_grids   # the grids differed
    stream, pool = cp.cuda.Stream(non_blocking=True), cp.cuda.MemoryPool()
    with after_inputs(stream):
        run(qd, kc, vc, wide, 128 ** -0.5)   # eagerly first: sets up the arrival counters
        got, graph = captured(lambda: run(qd, kc, vc, wide, 128 ** -0.5), stream, pool)
        np.testing.assert_array_equal(replayed(graph, stream, got), full)


def test_split_decode_graph_replays_twice(decode_grids):
    """Captured split decode replayed twice in a row, its output zeroed before each replay: a replay
    merges only if the previous one left its counters zero."""
    import dataclasses
    dt = DTYPES["bfloat16"]
    qd, kc, vc, db, want = _decode_inputs(dt, [9000, 2, 600], 32, 8, 128, 25)
    db = dataclasses.replace(db, max_context_len=20480)
    stream, pool = cp.cuda.Stream(non_blocking=True), cp.cuda.MemoryPool()
    with after_inputs(stream):
        eager = host(attention.paged_attention(qd, kc, vc, db, 128 ** -0.5))
        got, graph = captured(lambda: attention.paged_attention(qd, kc, vc, db, 128 ** -0.5), stream, pool)
        for _ in range(2):
            np.testing.assert_array_equal(replayed(graph, stream, got), eager)
            assert _counters_zero()
    close(eager, want, dt)
    assert decode_grids[1][0] > 1, decode_grids   # the captured launch splits


FP8_CASES = ["prefill_varlen_prefix", "prefill_mha_d64", "prefill_long_g2_d256", "prefill_g8_d128",
             "decode_split_kv", "decode_group16_d64", "decode_no_split", "decode_d256"]


@pytest.mark.parametrize("impl", ["wgmma", "mma", "cuda_cores"])
@pytest.mark.parametrize("case", FP8_CASES)
def test_fp8_cache_attention_is_attention_over_the_rounded_cache(case, impl):
    """Caches of e4m3 bytes (keys past +-448 among them, saturated) in every implementation: the numpy reference's
    attention over the rounded values, within bf16 tolerance (the kernels convert the bytes to f16, which holds
    every e4m3 value, and multiply in f16 with Q rounded to f16), and the same bits from every implementation."""
    from openinfer.quant.fp8 import e4m3_to_f32, to_e4m3
    runs, nh, nkv, d = ATTN_CASES[case]
    rng = np.random.default_rng(len(case) + 7)
    bs, layers = 16, 2
    num_blocks = sum(-(-L // bs) for L, _ in runs) + 3
    hb, db = _batch(runs, bs, rng, num_blocks)
    T = int(hb.query_start_host[-1])
    pool = rnd(rng, 2, num_blocks, layers, bs, nkv, d, scale=2.0)
    pool[0, ..., 0] *= 300.0                      # some keys past the e4m3 range
    raw = to_e4m3(pool)
    rounded = e4m3_to_f32(raw)
    q = exact(rnd(rng, T, nh, d, scale=0.2), BF16)
    scale = d ** -0.5
    raw_d = cp.asarray(raw)
    got = IMPLS[impl](dev(q, BF16), raw_d[0][:, 1], raw_d[1][:, 1], db, scale)
    want = ref.paged_attention(q, rounded[0][:, 1], rounded[1][:, 1], hb, scale)
    close(got, want, DTYPES["bfloat16"])
    other = IMPLS["mma"](dev(q, BF16), raw_d[0][:, 1], raw_d[1][:, 1], db, scale)
    np.testing.assert_array_equal(cp.asnumpy(got).view(np.uint16), cp.asnumpy(other).view(np.uint16))
