"""The fp8-cache form of attention_decode.cu's tensor-core decode kernel, lane by lane (used by
test_attention_decode_emulation's emulate_split): its rings keep the bytes' values at their swizzled places
(kv8_chunk), its lanes read whole words of a row (bank conflicts checked), the value pairs come from byte permutes,
and its head dims are permuted as the kernel takes them. Mirrors the kernel: change both together."""
from __future__ import annotations

import numpy as np

from test_attention_mma_emulation import LANE, mma

STAGES_KV8 = {64: 2, 128: 2, 256: 3}
BN_KV8 = {64: 32, 128: 32, 256: 16}   # keys a tile
GID, TQ = LANE >> 2, LANE & 3


def kv8_chunk(r, c, D):
    """Where an fp8 ring row r keeps its 16-byte chunk c."""
    return c ^ ((((r & 1) << 2) ^ (r & 6)) & (D // 16 - 1))


def kv8_w(D):
    """Bytes a lane reads of a value row (kv8_pv), per 8 W dims."""
    return 16 if D >= 128 else 8


def dec_cols(dd, D, kv8):
    """DecCols: where the warp merge area keeps head dim dd (n-tile t's column n stored at 8 t + n holds dim
    8 W (t / W) + W n + t % W over an fp8 ring)."""
    if not kv8:
        return dd
    W, rem = kv8_w(D), dd % (8 * kv8_w(D))
    return 8 * (W * (dd // (8 * W)) + rem % W) + rem // W


def f16(x):
    return np.asarray(x, np.float32).astype(np.float16).astype(np.float32)


def lds(smem, addr, nbytes, ways=1):
    """Each lane's `nbytes` from its byte address (an fp8 ring); a phase's lanes (128 bytes a phase) meet a bank at
    most `ways` times (a word read by several lanes counts once)."""
    assert (addr % nbytes == 0).all()
    per = 128 // nbytes
    for p in range(0, 32, per):
        words = {(int(a) + i) // 4 for a in addr[p: p + per] for i in range(0, nbytes, 4)}
        banks = np.bincount([w % 32 for w in words], minlength=32)
        assert banks.max() <= ways, f"fp8 fragment read: {banks.max()}-way bank conflict"
    return np.stack([smem[a: a + nbytes] for a in addr])


def q_fragment_kv8(q, lo, hi, kk):
    """[32, 4, 2]: q_fragment over an fp8 ring's dim order (k-step kk = 4 qd + i: dims 64 qd + 16 tq + 4 i + 0..3),
    rounded to f16."""
    a = np.zeros((32, 4, 2), np.float32)
    for ln in range(32):
        e = (kk >> 2) * 64 + 16 * TQ[ln] + 4 * (kk & 3)
        for i, (row, col) in enumerate(((lo[ln], 0), (hi[ln], 0), (lo[ln], 2), (hi[ln], 2))):
            if row is not None:
                a[ln, i] = f16(q[row + e + col: row + e + col + 2])
    return a


def kv8_scores(smem, kt, qf, D, NJ):
    """kv8_scores: S [32, NJ, 4] from an fp8 stage's K rows (byte values at their swizzled places; rows gid + 8 j
    share gid's swizzle)."""
    s = np.zeros((32, NJ, 4))
    for qd in range(D // 64):
        at = np.array([kv8_chunk(g, 4 * qd + t, D) for g, t in zip(GID, TQ)]) * 16
        k = [lds(smem, kt + (GID + 8 * j) * D + at, 16) for j in range(NJ)]
        for i in range(4):
            for j in range(NJ):
                mma(s[:, j], qf[4 * qd + i], k[j][:, 4 * i: 4 * i + 2], k[j][:, 4 * i + 2: 4 * i + 4])
    return s


def kv8_pv(smem, vt, o, a, D):
    """kv8_pv: o [32, D / 8, 4] += P V over an fp8 stage's V rows."""
    W = kv8_w(D)
    for b in range(D // (8 * W)):
        dim = 8 * W * b + W * GID
        rows = []
        for k in range(4):
            r = 2 * TQ + (k & 1) + (k >> 1) * 8
            at = np.array([kv8_chunk(rr, d // 16, D) for rr, d in zip(r, dim)]) * 16 + dim % 16
            # d64: rows 0, 2, 4, 6 of 64 bytes span half the banks, so their 8-byte reads pair up
            rows.append(lds(smem, vt + r * D + at, W, 1 if D >= 128 else 2))
        for e in range(W):   # byte e: n-tile W b + e (the byte permutes pair rows 0 / 1 and 2 / 3)
            b0 = np.stack([rows[0][:, e], rows[1][:, e]], 1)
            b1 = np.stack([rows[2][:, e], rows[3][:, e]], 1)
            mma(o[:, W * b + e], a, b0, b1)
