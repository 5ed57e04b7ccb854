"""DecodeGraphs' order of work on the CPU, with a recording stand-in for cupy. Capture: the capture
stream waits on the step stream's queued work by an event (the host does not wait for the GPU
before the end), and only the largest bucket runs eagerly before the captures. Replay: the host
mirrors are restaged only after the previous upload read them; a pipelined step's token ids are
written on the device after its upload, before its launch, and the previous step's tokens are
queued to the host before that launch (so collecting them waits for that copy alone). Beside a mixed step's eager
part: the graphs' stream waits for the step stream's queued work, uploads and replays there while the eager part is
queued on the step stream, which then waits for the replay."""
from __future__ import annotations

import contextlib
from types import SimpleNamespace

import numpy as np
import pytest

from openinfer.backends.cuda_graphs import DecodeGraphs
from openinfer.kernels.cuda import lanes
from openinfer.engine.model_runner import HostBatch


class _Stream:
    def __init__(self, log: list, name: str) -> None:
        self.log, self.name, self.capturing = log, name, False
        self.ptr = name

    def __enter__(self) -> "_Stream":
        return self

    def __exit__(self, *exc) -> None:
        pass

    def synchronize(self) -> None:
        self.log.append(("host waits for", self.name))

    def wait_event(self, event) -> None:
        self.log.append((self.name, "waits for", event.stream))

    def begin_capture(self) -> None:
        self.capturing = True

    def end_capture(self) -> str:
        self.capturing = False
        return "graph"


class _DeviceArray(np.ndarray):
    @property
    def data(self) -> SimpleNamespace:   # a cupy array's device pointer
        return SimpleNamespace(ptr=self.ctypes.data)


def _fake_cp(log: list) -> SimpleNamespace:
    class Event:
        def __init__(self, disable_timing: bool = False) -> None:
            self.stream = None

        def record(self, stream: _Stream) -> None:
            self.stream = stream.name
            log.append(("record on", stream.name))

        def synchronize(self) -> None:
            log.append(("host waits for the event on", self.stream))

    streams: list[_Stream] = []

    def stream(non_blocking: bool = False) -> _Stream:
        streams.append(_Stream(log, "capture"))
        return streams[-1]

    def memcpy(dst, src, size, kind, stream) -> None:
        log.append(("copy to the host on", stream))

    def concatenate(parts):
        log.append(("concatenate", [len(p) for p in parts]))
        return np.concatenate(parts)

    runtime = SimpleNamespace(memcpyAsync=memcpy, memcpyDeviceToHost=2)
    cuda = SimpleNamespace(alloc_pinned_memory=bytearray, Event=Event, Stream=stream, Device=contextlib.nullcontext,
                           runtime=runtime,
                           MemoryPool=lambda: SimpleNamespace(malloc=None, total_bytes=lambda: 0),
                           using_allocator=lambda malloc: contextlib.nullcontext())
    return SimpleNamespace(cuda=cuda, zeros=np.zeros, arange=np.arange, int32=np.int32, int64=np.int64,
                           streams=streams, asarray=np.asarray, concatenate=concatenate)


def test_capture_runs_one_eager_forward_and_never_waits_on_the_host_before_the_end(monkeypatch):
    log: list = []
    step = _Stream(log, "step")
    cp = _fake_cp(log)

    def forward(batch):
        log.append(("forward", len(batch.token_ids), "captured" if cp.streams[-1].capturing else "eager",
                    lanes.current()))
        return "logits", "tokens"

    monkeypatch.setattr(DecodeGraphs, "_upload", lambda self, width: log.append(("upload",)))
    graphs = DecodeGraphs(cp, step, forward, max_num_seqs=16, max_model_len=64, block_size=16)
    graphs.capture()
    assert log == [("upload",), ("record on", "step"), ("capture", "waits for", "step"),
                   ("forward", 16, "eager", "graphs")] + \
        [("forward", b, "captured", "graphs") for b in (16, 8, 4, 2, 1)] + [("host waits for", "capture")]
    assert lanes.current() == "default"
    assert sorted(graphs.graphs) == [1, 2, 4, 8, 16]


def _replaying_graphs(log: list, outputs: tuple, monkeypatch) -> DecodeGraphs:
    """Graphs of up to 4 rows on the recording cupy whose launches log their stream and the staged token ids, and
    whose uploads log their stream (None: the step stream) and copy the host mirrors."""
    graphs = DecodeGraphs(_fake_cp(log), _Stream(log, "step"), None, max_num_seqs=4, max_model_len=64, block_size=16)

    class Graph:
        def launch(self, stream: _Stream) -> None:
            log.append(("launch on", stream.name, graphs.inputs.meta[2 * 4: 2 * 4 + 2].tolist()))
    graphs.graphs = {b: (Graph(), *outputs) for b in graphs.sizes}

    def upload(self, width: int, stream: _Stream | None = None) -> None:
        log.append(("upload on", stream and stream.name))
        self.inputs.meta[:] = self.inputs.host
    monkeypatch.setattr(DecodeGraphs, "_upload", upload)
    return graphs


def _two_rows(sample_rows: list[int]) -> HostBatch:
    return HostBatch(np.array([7, 8], np.int32), np.array([3, 5], np.int32), np.array([19, 37], np.int64),
                     np.array([[1], [2]], np.int32), np.arange(3, dtype=np.int32), np.array([4, 6], np.int32),
                     np.array(sample_rows, np.int32))


def test_replay_restages_after_the_last_upload_and_writes_pipelined_ids_before_the_launch(monkeypatch):
    log: list = []
    graphs = _replaying_graphs(log, ("logits", "tokens"), monkeypatch)
    h = _two_rows([0, 1])
    graphs.replay(h)
    tokens = np.array([42, 43], np.int32).view(_DeviceArray)
    wait = graphs.fetch(tokens)
    graphs.replay(h, ids=tokens)
    wait()
    assert log == [("host waits for the event on", None), ("upload on", None), ("record on", "step"),
                   ("launch on", "step", [7, 8]),
                   ("copy to the host on", "step"), ("record on", "step"),
                   ("host waits for the event on", "step"), ("upload on", None), ("record on", "step"),
                   ("launch on", "step", [42, 43]),
                   ("host waits for the event on", "step")]


def test_a_replay_beside_an_eager_part_runs_on_the_graphs_stream_and_the_step_stream_waits_for_it(monkeypatch):
    log: list = []
    logits = np.arange(4 * 3, dtype=np.float32).reshape(4, 3)
    graphs = _replaying_graphs(log, (logits, np.array([5, 6, 7, 8], np.int32)), monkeypatch)

    def rest():
        log.append(("eager part",))
        return np.full((1, 3), -1, np.float32), np.array([9], np.int32)
    h = _two_rows([1])   # of the two decode rows, only the second samples
    got_logits, got_tokens = graphs.replay_beside(h, rest)
    assert log == [("host waits for the event on", None), ("record on", "step"), ("capture", "waits for", "step"),
                   ("upload on", "capture"), ("record on", "capture"), ("launch on", "capture", [7, 8]),
                   ("record on", "capture"), ("eager part",), ("step", "waits for", "capture"),
                   ("concatenate", [1, 1]), ("concatenate", [1, 1])]
    np.testing.assert_array_equal(got_logits, [[3, 4, 5], [-1, -1, -1]])
    np.testing.assert_array_equal(got_tokens, [6, 9])


def test_the_step_stream_waits_for_the_replay_even_when_the_eager_part_fails(monkeypatch):
    log: list = []
    graphs = _replaying_graphs(log, (np.zeros((4, 3), np.float32), np.zeros(4, np.int32)), monkeypatch)

    def rest():
        raise RuntimeError("the eager part failed")
    with pytest.raises(RuntimeError, match="eager part failed"):
        graphs.replay_beside(_two_rows([0, 1]), rest)
    assert log[-1] == ("step", "waits for", "capture")
