"""CPU emulation of mla_latent.cu (no GPU), driven by mla.py's recorded launches (fake_device.py): mla_rope,
mla_write_latent and the fused mla_rope_write, against the numpy reference ops."""
from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from fake_device import flat, run
from openinfer.kernels import numpy_mla_moe as ref
from openinfer.kernels.cuda import mla, module
from openinfer.kernels.cuda.module import BF16
from openinfer.testing.launch_check import fake, record_launches

R, P = 512, 64
D = R + P


def emulate_write_latent(call):
    cache, block_stride, bs, c, c_stride, kpe, kpe_stride, slots = call.args
    cf, c_f, k_f, sl = flat(cache), flat(c), flat(kpe), flat(slots)
    for t in range(call.grid[0]):
        slot = int(sl[t])
        if slot >= 0:
            dst = slot // int(bs) * int(block_stride) + slot % int(bs) * D
            cf[dst: dst + R] = c_f[t * int(c_stride):][:R]
            cf[dst + R: dst + D] = k_f[t * int(kpe_stride):][:P]


def emulate_rope(call):
    q, q_stride, q_head, k, k_stride, positions, cos, sin, half, nh, q_out, k_out = call.args
    qf, kf, pos, cf, sf = flat(q).astype(np.float32), flat(k).astype(np.float32), flat(positions), flat(cos), flat(sin)
    qo, ko = flat(q_out), flat(k_out)
    half, nh = int(half), int(nh)
    for t in range(call.grid[0]):
        c, s = cf[pos[t] * half:][:half], sf[pos[t] * half:][:half]
        for head in range(nh + 1):
            src = qf[t * int(q_stride) + head * int(q_head):] if head < nh else kf[t * int(k_stride):]
            dst = qo[(t * nh + head) * 2 * half:] if head < nh else ko[t * 2 * half:]
            x0, x1 = src[0: 2 * half: 2], src[1: 2 * half: 2]
            dst[0: 2 * half: 2] = x0 * c - x1 * s
            dst[1: 2 * half: 2] = x1 * c + x0 * s


def emulate_rope_write(call):
    """mla_rope_write: the latent's rms_norm (float32 sum of squares, x * inv * w), the k_pe and q_pe rotations, the
    cache row written where the slot is not negative."""
    (q, q_stride, q_head, kv, kv_stride, norm_w, eps, positions, cos, sin, half, nh, cache, block_stride, bs, slots,
     q_out) = call.args
    kvf, wf, cf, sl = flat(kv).astype(np.float32), flat(norm_w).astype(np.float32)[:R], flat(cache), flat(slots)
    k_rot = fake(np.zeros((call.grid[0], P)), BF16)
    emulate_rope(SimpleNamespace(args=(q, q_stride, q_head, kv[:, R:], kv_stride, positions, cos, sin, half, nh,
                                       q_out, k_rot), grid=call.grid))
    for t in range(call.grid[0]):
        x = kvf[t * int(kv_stride):][:R]
        inv = np.float32(1) / np.sqrt(np.square(x, dtype=np.float32).sum(dtype=np.float32) / np.float32(R)
                                      + np.float32(eps))
        slot = int(sl[t])
        if slot >= 0:
            dst = slot // int(bs) * int(block_stride) + slot % int(bs) * D
            cf[dst: dst + R] = x * inv * wf
            cf[dst + R: dst + D] = k_rot[t]


KERNELS = {"mla_write_latent_bf16": emulate_write_latent, "mla_rope_bf16": emulate_rope,
           "mla_rope_write": emulate_rope_write}


@pytest.fixture
def launches(monkeypatch):
    """mla.py's launchers on host arrays."""
    return record_launches(monkeypatch, (mla, module))


def test_mla_write_latent_and_rope_emulation(launches):
    """mla_rope on slices of q and kv, then mla_write_latent of c and the rotated k_pe (a negative slot skipped),
    emulated from their launches, against the numpy references."""
    rng = np.random.default_rng(0)
    T, nh, dn, bs = 5, 4, 16, 16
    q = fake(rng.standard_normal((T, nh, dn + P)), BF16)
    kv = fake(rng.standard_normal((T, D + 8)), BF16)
    pos = fake(rng.integers(0, 50, T).astype(np.int32))
    cos = fake(rng.standard_normal((50, P // 2)).astype(np.float32))
    sin = fake(rng.random((50, P // 2)).astype(np.float32))
    q_pe, k_pe = mla.mla_rope(q[:, :, dn:], kv[:, R: D], pos, cos, sin)
    pool = fake(np.zeros((3, 2, bs, D)), BF16)
    slots = fake(np.array([3, 40, -1, 17, 0], np.int64))
    mla.mla_write_latent(pool[:, 1], kv[:, :R], k_pe, slots)
    run(launches, KERNELS)
    want_q, want_k = ref.mla_rope(np.asarray(q[:, :, dn:], np.float32), np.asarray(kv[:, R: D], np.float32), pos,
                                  cos, sin)
    np.testing.assert_allclose(np.asarray(q_pe, np.float32), want_q, atol=2e-2, rtol=1e-2)
    np.testing.assert_allclose(np.asarray(k_pe, np.float32), want_k, atol=2e-2, rtol=1e-2)
    want_pool = np.zeros((3, bs, D), np.float32)
    keep = np.asarray(slots) >= 0
    ref.mla_write_latent(want_pool, np.asarray(kv[:, :R], np.float32)[keep], np.asarray(k_pe, np.float32)[keep],
                         np.asarray(slots)[keep])
    np.testing.assert_array_equal(np.asarray(pool[:, 1], np.float32), want_pool)


@pytest.mark.parametrize("w_dtype", [BF16, np.float32])
def test_mla_rope_write_emulation(launches, w_dtype):
    """mla_rope_write on slices of one projection row (q and kv), emulated from its launch, against
    numpy_mla_moe.mla_rope_write (the unfused ops composed); a negative slot writes nothing."""
    rng = np.random.default_rng(1)
    T, nh, dn, bs = 5, 4, 16, 16
    row = fake(rng.standard_normal((T, nh * (dn + P) + D + 8)), BF16)
    q, kv = row[:, : nh * (dn + P)].reshape(T, nh, dn + P), row[:, nh * (dn + P): nh * (dn + P) + D]
    norm_w = fake(1 + 0.1 * rng.standard_normal(R), w_dtype)
    pos = fake(rng.integers(0, 50, T).astype(np.int32))
    cos = fake(rng.standard_normal((50, P // 2)).astype(np.float32))
    sin = fake(rng.random((50, P // 2)).astype(np.float32))
    pool = fake(np.zeros((3, 2, bs, D)), BF16)
    slots = fake(np.array([3, 40, -1, 17, 0], np.int64))
    q_pe = mla.mla_rope_write(q[:, :, dn:], kv, norm_w, 1e-6, pos, cos, sin, pool[:, 1], slots)
    (call,) = launches
    assert call.name == f"mla_rope_write_{'bf16' if w_dtype == BF16 else 'bf16_wf32'}" and call.grid == (T,)
    run(launches, KERNELS)
    want_pool = np.zeros((3, bs, D), np.float32)
    keep = np.asarray(slots) >= 0
    f32 = [np.asarray(a, np.float32) for a in (q[:, :, dn:], kv, norm_w)]
    want_q = ref.mla_rope_write(f32[0][keep], f32[1][keep], f32[2], 1e-6, np.asarray(pos)[keep], cos, sin, want_pool,
                                np.asarray(slots)[keep])
    np.testing.assert_allclose(np.asarray(q_pe, np.float32)[keep], want_q, atol=2e-2, rtol=1e-2)
    np.testing.assert_allclose(np.asarray(pool[:, 1], np.float32), want_pool, atol=3e-2, rtol=1e-2)
    all_q, _ = ref.mla_rope(f32[0], f32[1][:, R:], np.asarray(pos), cos, sin)   # a skipped slot's query turns too
    np.testing.assert_allclose(np.asarray(q_pe, np.float32), all_q, atol=2e-2, rtol=1e-2)
