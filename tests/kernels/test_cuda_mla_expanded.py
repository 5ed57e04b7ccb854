"""MLA's expanded form on the GPU against the numpy reference ops (skipped without one): mla_gather_latent and
mla_pack_heads exactly, a whole prefill step's attention (gather, kv_b GEMM, packing, paged_attention's d256 prefill;
a mixed step's decode rows absorbed) at DeepSeek-V2-Lite's shapes against the numpy expanded and absorbed forms, and
per_head_linear with W_UV as a view of kv_b_proj."""
from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from cuda_cases import BF16, DTYPES, close, cp, dev, exact, host, own_stream, pdl, rnd  # noqa: F401
from test_cuda_attention import _batch
from openinfer.kernels import numpy_mla_moe as ref
from openinfer.kernels import numpy_ops
from openinfer.kernels.cuda import attention, blas, mla, ops
from openinfer.layers.mla import MLADims
from openinfer.layers.mla_expanded import prefill_attention

pytestmark = pytest.mark.cuda
BF = DTYPES["bfloat16"]
R, P, DN, DV = 512, 64, 128, 128
RUNS = {"cold": [(300, 300)], "prefix_hits": [(700, 64), (37, 37), (90, 1), (130, 129)],
        "empty_run": [(45, 45), (50, 0), (16, 16)]}


def _pool(runs, seed, bs=16):
    rng = np.random.default_rng(seed)
    num_blocks = sum(-(-L // bs) for L, _ in runs) + 3
    hb, db = _batch(runs, bs, rng, num_blocks)
    pool = exact(rnd(rng, num_blocks, 2, bs, R + P), BF16)
    return rng, hb, db, pool


@pytest.mark.parametrize("case", list(RUNS))
def test_mla_gather_latent(case, pdl):
    _, hb, db, pool = _pool(RUNS[case], 1)
    got, tables = mla.mla_gather_latent(dev(pool, BF16)[:, 1], db)
    want, want_tables = ref.mla_gather_latent(pool[:, 1], hb)
    np.testing.assert_array_equal(host(got), want)
    np.testing.assert_array_equal(cp.asnumpy(tables), want_tables)


def test_mla_pack_heads(pdl):
    """Strided parts as the expanded form passes them: k_nope with the shared k_pe, v alone (16-byte words), and a
    part off the word grid (element by element)."""
    rng = np.random.default_rng(2)
    kv = exact(rnd(rng, 40, 3, DN + DV + 8), BF16)
    lat = exact(rnd(rng, 40, R + P), BF16)
    qp = exact(rnd(rng, 40, 5, P), BF16)
    kv_d, lat_d, qp_d = dev(kv, BF16), dev(lat, BF16), dev(qp, BF16)
    got = mla.mla_pack_heads([(kv_d[:, :, :DN], lat_d[:, R:]), (kv_d[:, :2, DN:DN + DV], None),
                              (kv_d[:, :, 5:5 + DN], qp_d[:, 1:4])], 256)
    want = ref.mla_pack_heads([(kv[:, :, :DN], lat[:, R:]), (kv[:, :2, DN:DN + DV], None),
                               (kv[:, :, 5:5 + DN], qp[:, 1:4])], 256)
    np.testing.assert_array_equal(host(got), want)


def _absorbed(kind, w_uk_t, w_uv, cache, scale):
    def absorbed(q_nope, q_pe, batch):
        return kind.per_head_linear(kind.mla_attention(kind.per_head_linear(q_nope, w_uk_t), q_pe, cache, batch, scale),
                                    w_uv)
    return absorbed


@pytest.mark.parametrize("impl", ["paged_attention", "paged_attention_mma"])
@pytest.mark.parametrize("case", list(RUNS))
def test_prefill_attention(case, impl, pdl):
    """bf16 end to end against the numpy reference ops on the same (bf16-exact) inputs, and the numpy expanded form
    against the absorbed one."""
    H, scale = 16, 192 ** -0.5
    rng, hb, db, pool = _pool(RUNS[case], 3)
    dims = MLADims(2048, H, None, R, DN, P, DV)
    T = int(hb.query_start_host[-1])
    kv_b = exact(rnd(rng, H * (DN + DV), R, scale=R ** -0.5), BF16)
    w = kv_b.reshape(H, DN + DV, R)
    w_uk_t = np.ascontiguousarray(w[:, :DN].transpose(0, 2, 1))
    q = exact(rnd(rng, T, H, DN + P), BF16)
    cuda_ops = SimpleNamespace(linear=blas.linear, paged_attention=getattr(attention, impl),
                               gather_rows=ops.gather_rows, mla_gather_latent=mla.mla_gather_latent,
                               mla_pack_heads=mla.mla_pack_heads)
    numpy_ns = SimpleNamespace(linear=numpy_ops.linear, paged_attention=numpy_ops.paged_attention,
                               gather_rows=numpy_ops.gather_rows, mla_gather_latent=ref.mla_gather_latent,
                               mla_pack_heads=ref.mla_pack_heads)
    q_d, kv_b_d, cache_d = dev(q, BF16), dev(kv_b, BF16), dev(pool, BF16)[:, 1]
    cuda_absorbed = _absorbed(SimpleNamespace(per_head_linear=blas.per_head_linear, mla_attention=mla.mla_attention),
                              dev(w_uk_t, BF16), kv_b_d.reshape(H, DN + DV, R)[:, DN:], cache_d, scale)
    numpy_absorbed = _absorbed(ref, w_uk_t, w[:, DN:], pool[:, 1], scale)
    got = prefill_attention(cuda_ops, dims, q_d[:, :, :DN], q_d[:, :, DN:], cache_d, kv_b_d, db, scale, cuda_absorbed)
    want = prefill_attention(numpy_ns, dims, q[:, :, :DN], q[:, :, DN:], pool[:, 1], kv_b, hb, scale, numpy_absorbed)
    close(got, want, BF)
    np.testing.assert_allclose(want, numpy_absorbed(q[:, :, :DN], q[:, :, DN:], hb), rtol=1e-4, atol=1e-4)


def test_per_head_linear_with_w_uv_a_view_of_kv_b(pdl):
    rng = np.random.default_rng(4)
    kv_b = exact(rnd(rng, 16, DN + DV, R, scale=R ** -0.5), BF16)
    x = exact(rnd(rng, 9, 16, R), BF16)
    got = blas.per_head_linear(dev(x, BF16), dev(kv_b, BF16)[:, DN:, :])
    close(got, ref.per_head_linear(x, kv_b[:, DN:, :]), BF)
