"""Philox4x32-10 (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3", SC 2011) in numpy.

A counter-based generator: the 128-bit output is a pure function of a 128-bit counter and a
64-bit key, so any element of a stream is computed without the ones before it. The device
sampler (kernels/cuda/philox.cuh) runs the same function; this is its reference.
"""
from __future__ import annotations

import numpy as np

M0, M1 = np.uint64(0xD2511F53), np.uint64(0xCD9E8D57)     # round multipliers
W0, W1 = 0x9E3779B9, 0xBB67AE85                            # key schedule (golden ratio, sqrt(3) - 1)
MASK32 = np.uint64(0xFFFFFFFF)


def philox4x32(counter: np.ndarray, key: tuple[int, int], rounds: int = 10) -> np.ndarray:
    """Philox4x32-R of counters [N, 4] uint32 under key (k0, k1): [N, 4] uint32."""
    c = [np.asarray(counter, dtype=np.uint32)[:, i].astype(np.uint64) for i in range(4)]
    k0, k1 = key[0] & 0xFFFFFFFF, key[1] & 0xFFFFFFFF
    for r in range(rounds):
        if r:
            k0, k1 = (k0 + W0) & 0xFFFFFFFF, (k1 + W1) & 0xFFFFFFFF
        p0, p1 = M0 * c[0], M1 * c[2]
        c = [(p1 >> np.uint64(32)) ^ c[1] ^ np.uint64(k0), p1 & MASK32,
             (p0 >> np.uint64(32)) ^ c[3] ^ np.uint64(k1), p0 & MASK32]
    return np.stack(c, axis=1).astype(np.uint32)


def split64(x: int) -> tuple[int, int]:
    """An int (any sign or size) as its low 64 bits in two 32-bit words, low word first."""
    x &= (1 << 64) - 1
    return x & 0xFFFFFFFF, x >> 32


def uniform_words(n: int, key: tuple[int, int], step: int, stream: tuple[int, int]) -> np.ndarray:
    """The sampler's random words for elements 0..n-1 of one draw: element j is word j % 4 of
    Philox(counter = (j // 4, step, stream_lo, stream_hi), key)."""
    groups = -(-n // 4)
    ctr = np.zeros((groups, 4), dtype=np.uint32)
    ctr[:, 0] = np.arange(groups, dtype=np.uint32)
    ctr[:, 1], ctr[:, 2], ctr[:, 3] = step & 0xFFFFFFFF, stream[0], stream[1]
    return philox4x32(ctr, key).reshape(-1)[:n]


def normals(n: int, key: tuple[int, int]) -> np.ndarray:
    """n standard normals, float64: element i from words 2(i // 2) and 2(i // 2) + 1 of the stream
    Philox(counter = (i // 4, its high word, 0, 0), key), by Box-Muller on their top 24 bits
    (the dummy-weight fill, kernels/cuda/random_fill.cu)."""
    groups = -(-n // 4)
    g = np.arange(groups, dtype=np.uint64)
    ctr = np.zeros((groups, 4), dtype=np.uint32)
    ctr[:, 0], ctr[:, 1] = (g & MASK32).astype(np.uint32), (g >> np.uint64(32)).astype(np.uint32)
    words = philox4x32(ctr, key).reshape(-1, 2)
    u1 = ((words[:, 0] >> 8).astype(np.float64) + 1) / 2**24
    u2 = (words[:, 1] >> 8).astype(np.float64) / 2**24
    r = np.sqrt(-2 * np.log(u1))
    return np.stack([r * np.cos(2 * np.pi * u2), r * np.sin(2 * np.pi * u2)], axis=1).reshape(-1)[:n]
