"""CPU emulation of rope.cu's QK-norm sum of squares (no GPU): the warp-per-head kernel's order
(norm_rope_head: lane l sums elements l, l + 32, ..., then warp_sum's butterfly) against the
16-byte-word kernel's (head_sumsq_v: 32 / E lanes, E partial sums each, the butterfly split into
shuffles and register steps). Each float32 step is emulated as the GPU rounds it (ss += v * v is
one fma), so equal bits here mean the two loops perform the same operations in the same order.
Mirrors both device functions line by line: change them together."""
from __future__ import annotations

import numpy as np
import pytest


def _fma(a: np.float32, b: np.float32, c: np.float32) -> np.float32:
    """fmaf, emulated: the product exact in float64 (bf16 values) or nearly, one rounding to float32
    after the sum. Both loops below use it, which is all the comparison of their orders needs."""
    return np.float32(np.float64(a) * np.float64(b) + np.float64(c))


def scalar_sumsq(x: np.ndarray) -> np.float32:
    d = x.shape[0]
    ss = [np.float32(0)] * 32
    for lane in range(32):
        for i in range(lane, d, 32):
            ss[lane] = _fma(x[i], x[i], ss[lane])
    o = 16
    while o:   # warp_sum: every lane adds its xor partner's value
        ss = [np.float32(ss[lane] + ss[lane ^ o]) for lane in range(32)]
        o >>= 1
    assert len({v.tobytes() for v in ss}) == 1   # all lanes agree
    return ss[0]


def words_sumsq(x: np.ndarray, E: int) -> np.float32:
    d, lph = x.shape[0], 32 // E
    ss = [[np.float32(0)] * E for _ in range(lph)]   # [sub][j]
    for sub in range(lph):
        for i in range(sub * E, d, 32):
            f = x[i: i + E]
            for j in range(E):
                ss[sub][j] = _fma(f[j], f[j], ss[sub][j])
    o = 16
    while o:
        if o >= E:   # __shfl_xor_sync(group, ss[j], o / E)
            ss = [[np.float32(ss[sub][j] + ss[sub ^ (o // E)][j]) for j in range(E)] for sub in range(lph)]
        else:        # within a lane's registers
            ss = [[np.float32(t[j] + t[j ^ o]) for j in range(E)] for t in ss]
        o >>= 1
    assert len({v.tobytes() for row in ss for v in row}) == 1
    return ss[0][0]


@pytest.mark.parametrize("E", [8, 4])   # bf16 and float32 words
@pytest.mark.parametrize("d", [64, 128, 256])
def test_word_sum_of_squares_keeps_the_scalar_order(E, d):
    rng = np.random.default_rng(d + E)
    for scale in (1.0, 1e3):
        x = (scale * rng.standard_normal(d) * np.exp(rng.standard_normal(d) * 3)).astype(np.float32)
        if E == 8:   # bf16 values, as the bf16 kernels see them
            x = (x.view(np.uint32) & 0xFFFF0000).view(np.float32)
        assert scalar_sumsq(x).tobytes() == words_sumsq(x, E).tobytes()
