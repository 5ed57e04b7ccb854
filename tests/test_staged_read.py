"""The threaded checkpoint reader behind the CUDA weight upload, with a numpy sink on the CPU."""
from __future__ import annotations

import threading
import weakref

import numpy as np
import pytest

from openinfer.backends.staged_read import MIN_PIECE, StagedReader, copy_threads, pieces
from openinfer.loading.weights import Checkpoint, save_safetensors


@pytest.mark.parametrize("nbytes", [0, 1, 4095, MIN_PIECE + 3, 5 * MIN_PIECE, 100 * MIN_PIECE + 17])
@pytest.mark.parametrize("threads", [1, 3, 8])
def test_pieces_cover_the_range_in_equal_pieces(nbytes, threads):
    max_piece = 4 * MIN_PIECE
    got = pieces(nbytes, threads, max_piece)
    assert [at for at, _ in got] == list(np.cumsum([0] + [n for _, n in got])[:-1])
    assert sum(n for _, n in got) == nbytes
    assert all(0 < n <= max_piece for _, n in got)
    assert len({n for _, n in got[:-1]}) <= 1 and (not got or got[-1][1] <= got[0][1])
    if nbytes > threads * MIN_PIECE:   # big ranges: every thread gets the same number of pieces
        assert len(got) % threads == 0
    else:                              # small ones are not cut below MIN_PIECE
        assert len(got) == -(-nbytes // MIN_PIECE)


def test_copy_threads_is_bounded():
    assert 2 <= copy_threads() <= 8


class LateCopy:
    """A sink's handle that copies only when synchronized: like an async H2D still in flight, the
    staging buffer must not be refilled before synchronize() (if it were, dst gets the new bytes)."""

    def __init__(self, staged: np.ndarray, dst: np.ndarray, at: int) -> None:
        self.staged, self.dst, self.at = staged, dst, at
        self.lock, self.done = threading.Lock(), False

    def synchronize(self) -> None:
        with self.lock:
            if not self.done:
                self.dst[self.at: self.at + self.staged.nbytes] = self.staged
                self.done = True


def test_reads_land_in_place_through_reused_buffers(tmp_path):
    rng = np.random.default_rng(0)
    data = rng.integers(0, 256, 3 * MIN_PIECE + 12345, dtype=np.uint8)
    path = tmp_path / "blob"
    path.write_bytes(data.tobytes())
    buffers = [np.zeros(MIN_PIECE // 4, np.uint8) for _ in range(6)]   # 3 threads x 2: reused many times
    seen_threads, contexts, lock, second = set(), [], threading.Lock(), threading.Event()

    def sink(staged, dst, at, context):
        with lock:
            seen_threads.add(threading.current_thread().name)
            contexts.append(context)
            if len(seen_threads) > 1:
                second.set()
        # the first piece's thread holds on until another thread takes a piece: on a busy machine one thread could
        # otherwise take them all, and the check below of reads spread over the pool would fail by timing alone
        second.wait(10)
        return LateCopy(staged, dst, at)

    reader = StagedReader(buffers, sink, threads=3)
    ranges = [(0, len(data)), (7, 1), (MIN_PIECE - 5, 2 * MIN_PIECE + 9), (len(data) - 3, 3)]
    outs = [np.zeros(n, np.uint8) for _, n in ranges]
    futures = [reader.read(str(path), off, n, out, context=i) for i, ((off, n), out) in enumerate(zip(ranges, outs))]
    for f in futures[1]:
        f.result().synchronize()   # waiting on one range's pieces, as the uploader does per tensor
    np.testing.assert_array_equal(outs[1], data[7:8])
    reader.finish()
    for (off, n), out in zip(ranges, outs):
        np.testing.assert_array_equal(out, data[off: off + n])
    assert len(seen_threads) > 1 and all(t.startswith("weights") for t in seen_threads)
    assert sorted(set(contexts)) == [0, 1, 2, 3]


def test_finish_lets_the_buffers_go_at_once(tmp_path):
    path = tmp_path / "blob"
    path.write_bytes(bytes(range(256)) * 4096)
    buffers = [np.zeros(MIN_PIECE // 4, np.uint8) for _ in range(4)]
    first = weakref.ref(buffers[0])
    reader = StagedReader(buffers, lambda staged, dst, at, context: LateCopy(staged, dst, at), threads=2)
    out = np.zeros(3 * MIN_PIECE // 4, np.uint8)
    reader.read(str(path), 5, out.nbytes, out)
    del buffers
    reader.finish()
    assert first() is None   # the reader still exists: it must not hold pinned memory past the load
    assert out[0] == 5


def test_checkpoint_spans_read_back_the_tensors(tmp_path):
    shapes = {"a": (300, 70), "b": (5,), "c": (2, 3, 4)}
    rng = np.random.default_rng(1)
    tensors = {n: rng.standard_normal(s).astype(np.float32) for n, s in shapes.items()}
    save_safetensors(tmp_path / "model.safetensors", shapes, tensors.__getitem__, dtype="F32")
    ckpt = Checkpoint(tmp_path)
    reader = StagedReader([np.zeros(4096, np.uint8) for _ in range(4)], lambda s, d, at, c: d.__setitem__(
        slice(at, at + s.nbytes), s), threads=2)
    got = {}
    for name, shape in shapes.items():
        path, offset, nbytes = ckpt.span(name)
        got[name] = np.zeros(shape, np.float32)
        reader.read(path, offset, nbytes, got[name].reshape(-1).view(np.uint8))
    reader.finish()
    for name in shapes:
        np.testing.assert_array_equal(got[name], tensors[name])


def test_a_short_file_fails_the_load(tmp_path):
    path = tmp_path / "short"
    path.write_bytes(b"x" * 100)
    reader = StagedReader([np.zeros(64, np.uint8) for _ in range(2)], lambda *a: None, threads=1)
    reader.read(str(path), 50, 200, np.zeros(200, np.uint8))
    with pytest.raises(EOFError):
        reader.finish()


def test_buffers_must_cover_every_thread():
    with pytest.raises(ValueError):
        StagedReader([np.zeros(64, np.uint8)], lambda *a: None, threads=2)
