"""Philox4x32-10 against the known-answer vectors of Random123 (tests/kat_vectors, the three
"philox4x32 10" lines: counter, key -> output), and the sampler's stream layout."""
from __future__ import annotations

import numpy as np
import pytest

from openinfer.sampling.philox import normals, philox4x32, split64, uniform_words

KAT = [  # counter (4 words), key (2 words), expected (4 words)
    ((0x00000000, 0x00000000, 0x00000000, 0x00000000), (0x00000000, 0x00000000),
     (0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8)),
    ((0xFFFFFFFF, 0xFFFFFFFF, 0xFFFFFFFF, 0xFFFFFFFF), (0xFFFFFFFF, 0xFFFFFFFF),
     (0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD)),
    ((0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344), (0xA4093822, 0x299F31D0),
     (0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1)),
]


@pytest.mark.parametrize("ctr,key,want", KAT)
def test_known_answers(ctr, key, want):
    got = philox4x32(np.array([ctr], dtype=np.uint32), key)
    assert tuple(int(w) for w in got[0]) == want


def test_vectorised_rows_are_independent():
    ctrs = np.array([k[0] for k in KAT], dtype=np.uint32)
    got = philox4x32(ctrs, KAT[2][1])
    assert tuple(int(w) for w in got[2]) == KAT[2][2]
    assert tuple(int(w) for w in got[0]) != KAT[0][2]  # same counter, another key


def test_stream_layout():
    key, stream = split64(-7), (5, 0)
    assert key == (0xFFFFFFF9, 0xFFFFFFFF)
    words = uniform_words(10, key, 3, stream)
    block2 = philox4x32(np.array([[2, 3, 5, 0]], dtype=np.uint32), key)[0]
    np.testing.assert_array_equal(words[8:], block2[:2])
    assert not np.array_equal(words, uniform_words(10, key, 4, stream))


def test_normals_layout_and_moments():
    key = split64(12345)
    z = normals(200_003, key)
    assert z.shape == (200_003,) and np.isfinite(z).all()
    # elements 4g..4g+3 come from Philox(counter = (g, 0, 0, 0)): pairs of words by Box-Muller
    w = philox4x32(np.array([[1, 0, 0, 0]], dtype=np.uint32), key)[0]
    u1, u2 = ((w[2] >> 8) + 1) / 2**24, (w[3] >> 8) / 2**24
    np.testing.assert_allclose(z[6:8], np.sqrt(-2 * np.log(u1)) * np.array([np.cos(2 * np.pi * u2),
                                                                              np.sin(2 * np.pi * u2)]))
    assert abs(z.mean()) < 0.01 and abs(z.std() - 1) < 0.01
    assert abs(z).max() < 6   # u1 >= 2^-24 bounds |z| by sqrt(2 ln 2^24) ~ 5.77
    assert not np.array_equal(z[:100], normals(100, split64(12346)))
