"""MLA's expanded form (layers/mla_expanded.py) on the numpy ops against the absorbed form over the same paged
latents: one pass of every head, several passes where the step's budget holds fewer, the absorbed fallback where
not one head fits, a mixed step's decode rows in the absorbed form; and the two ops it adds, mla_gather_latent and
mla_pack_heads, against plain indexing."""
from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from openinfer.kernels import numpy_mla_moe as mla_ops
from openinfer.kernels import numpy_ops
from openinfer.layers.mla import MLADims
from openinfer.layers.mla_expanded import expanded_attention, expanded_head_dim, heads_per_pass, prefill_attention
from test_mla_moe_numpy import _batch

H, R, P, DN, DV, BS = 4, 32, 8, 16, 12, 4
DIMS = MLADims(64, H, None, R, DN, P, DV)


def _ops(calls: list[int]):
    def paged_attention(q, k, v, batch, scale):
        calls.append(q.shape[1])
        return numpy_ops.paged_attention(q, k, v, batch, scale)
    return SimpleNamespace(linear=numpy_ops.linear, paged_attention=paged_attention, gather_rows=numpy_ops.gather_rows,
                           mla_gather_latent=mla_ops.mla_gather_latent, mla_pack_heads=mla_ops.mla_pack_heads)


def _inputs(runs, seed):
    rng = np.random.default_rng(seed)
    batch = _batch(runs, BS, 96, rng)
    cache = rng.standard_normal((96, BS, R + P)).astype(np.float32)
    T = sum(n for n, _ in runs)
    kv_b = (rng.standard_normal((H * (DN + DV), R)) * 0.3).astype(np.float32)
    q_nope = rng.standard_normal((T, H, DN)).astype(np.float32)
    q_pe = rng.standard_normal((T, H, P)).astype(np.float32)
    return batch, cache, kv_b, q_nope, q_pe


def _absorbed(batch, cache, kv_b, q_nope, q_pe, scale):
    w = kv_b.reshape(H, DN + DV, R)
    q_latent = mla_ops.per_head_linear(q_nope, w[:, :DN].transpose(0, 2, 1).copy())
    return mla_ops.per_head_linear(mla_ops.mla_attention(q_latent, q_pe, cache, batch, scale), w[:, DN:])


@pytest.mark.parametrize("runs,passes", [([(8, 8)], 1),                      # a cold prefill: every head at once
                                         ([(1, 9), (5, 14), (7, 7)], 4),     # a mixed step over a prefix
                                         ([(6, 6), (3, 3)], 2)])   # a table of 2 x 6 entries: fewer heads
def test_expanded_equals_absorbed(runs, passes):
    batch, cache, kv_b, q_nope, q_pe = _inputs(runs, len(runs))
    calls: list[int] = []
    got = expanded_attention(_ops(calls), DIMS, q_nope, q_pe, cache, kv_b, batch, 0.3, len(q_nope))
    np.testing.assert_allclose(got, _absorbed(batch, cache, kv_b, q_nope, q_pe, 0.3), rtol=1e-5, atol=1e-5)
    assert len(calls) == passes and sum(calls) == H


@pytest.mark.parametrize("runs,passes,decode_rows", [([(1, 9), (5, 14), (7, 7)], 2, [0]),
                                                     ([(1, 200), (6, 6), (1, 150)], 1, [6, 7]),
                                                     ([(5, 14), (7, 7)], 2, None),
                                                     ([(2, 40)], 0, list(range(2)))])   # not one head fits
def test_prefill_attention_takes_decode_rows_absorbed(runs, passes, decode_rows):
    """A mixed step: the runs of several tokens expanded, the one-token runs absorbed over their own contexts (a
    long decode context does not count against the expansion), the rows back in the step's order."""
    batch, cache, kv_b, q_nope, q_pe = _inputs(runs, 7)
    calls: list[int] = []
    absorbed_rows = []

    def absorbed(qn, qp, b):
        absorbed_rows.append(len(qn))
        return _absorbed(b, cache, kv_b, qn, qp, 0.3)
    got = prefill_attention(_ops(calls), DIMS, q_nope, q_pe, cache, kv_b, batch, 0.3, absorbed)
    np.testing.assert_allclose(got, _absorbed(batch, cache, kv_b, q_nope, q_pe, 0.3), rtol=1e-5, atol=1e-5)
    assert len(calls) == passes and absorbed_rows == ([] if decode_rows is None else [len(decode_rows)])


def test_a_context_too_long_for_one_head_is_left_to_the_absorbed_form():
    batch, cache, kv_b, q_nope, q_pe = _inputs([(2, 40)], 0)
    calls: list[int] = []
    assert expanded_attention(_ops(calls), DIMS, q_nope, q_pe, cache, kv_b, batch, 0.3, 2) is None and not calls


def test_heads_per_pass_holds_a_fresh_prefill_of_the_step_tokens():
    assert expanded_head_dim(DIMS) == 64
    assert expanded_head_dim(MLADims(2048, 16, None, 512, 128, 64, 128)) == 256
    assert expanded_head_dim(MLADims(2048, 16, None, 512, 256, 64, 128)) is None
    assert heads_per_pass(DIMS, 64, 64, 64, 64) == H      # a fresh prefill: every head
    assert heads_per_pass(DIMS, 64, 64, 128, 128) == 1    # twice the context: the latents and one head
    assert heads_per_pass(DIMS, 64, 8, 128, 128) == 0
    d16 = MLADims(2048, 16, None, 512, 128, 64, 128)
    full = 16384 * (578 + 16 * (256 + 512))
    for rows in (16384, 32768, 65536, 131072):
        h = heads_per_pass(d16, 256, 16384, rows, rows)
        assert rows * (578 + h * 768) <= full and (h == 16 or rows * (578 + (h + 1) * 768) > full)
    # a wide table (many runs beside a long context) counts against the heads
    assert heads_per_pass(d16, 256, 16384, 32768, 1000 * 32768) < heads_per_pass(d16, 256, 16384, 32768, 32768)


def test_gather_latent_rows_and_table():
    batch, cache, *_ = _inputs([(1, 9), (5, 14), (7, 7)], 3)
    got, tables = mla_ops.mla_gather_latent(cache, batch)
    starts = [0, 9, 23, 30]
    assert got.shape == (30, R + P) and tables.shape == (3, 14)
    assert tables[1].tolist() == list(range(9, 23)) and tables[2].tolist() == [*range(23, 30)] + [0] * 7
    for i, L in enumerate(batch.context_lens_host):
        for j in range(L):
            np.testing.assert_array_equal(got[starts[i] + j], cache[batch.block_tables[i, j // BS], j % BS])


def test_pack_heads_concatenates_pads_and_shares_a_row():
    rng = np.random.default_rng(0)
    a, b, shared = rng.standard_normal((5, 3, 4)), rng.standard_normal((5, 3, 2)), rng.standard_normal((5, 2))
    got = mla_ops.mla_pack_heads([(a, b), (a[:, :2], shared), (a[:, :1], None)], 8)
    assert got.shape == (5, 6, 8)
    np.testing.assert_array_equal(got[:, :3], np.concatenate([a, b, np.zeros((5, 3, 2))], axis=-1))
    np.testing.assert_array_equal(got[:, 3:5, 4:6], np.repeat(shared[:, None], 2, axis=1))
    np.testing.assert_array_equal(got[:, 5, :4], a[:, 0])
    assert not got[:, 5, 4:].any() and not got[:, 3:5, 6:].any()
    with pytest.raises(ValueError, match="width"):
        mla_ops.mla_pack_heads([(a, b)], 5)
