"""CPU checks of the cuBLASLt path (kernels/cuda/lt.py, lt_tune.py; no GPU): the ctypes structs and prototypes
against cublasLt.h, the choice of the fastest usable candidate, the cache file (round trip, its key, a saved
algorithm that fails the check is timed again), the shapes blas.linear records and which
calls blas.linear sends to cuBLASLt -- with fakes for the library, the timer and the GPU."""
from __future__ import annotations

import contextlib
import ctypes
import json
from types import SimpleNamespace

import numpy as np
import pytest

pytest.importorskip("cupy")
from openinfer.backends.cuda_backend import CudaBackend  # noqa: E402
from openinfer.backends.cuda_graphs import buckets  # noqa: E402
from openinfer.kernels.cuda import blas, lanes, lt, lt_tune  # noqa: E402
from openinfer.kernels.cuda import tuning as tuning_cache  # noqa: E402  (`tuning` is this file's fixture)
from openinfer.testing.launch_check import FAKE_CP, aligned_empty  # noqa: E402

BF16 = blas.BF16
TIMES = {0: 12.0, 3: 4.0, 4: 8.0}   # us per GEMM by candidate (algo.data[0]); 3 is the fastest that runs


def test_structs_match_cublasLt_h():
    """typedef struct { uint64_t data[8]; } cublasLtMatmulAlgo_t; and cublasLtMatmulHeuristicResult_t =
    { algo; size_t workspaceSize; cublasStatus_t state; float wavesCount; int reserved[4]; } on x86-64."""
    assert ctypes.sizeof(lt.MatmulAlgo) == 64
    r = lt.HeuristicResult
    assert ctypes.sizeof(r) == 96
    assert [r.algo.offset, r.workspace_size.offset, r.state.offset, r.waves_count.offset, r.reserved.offset] == \
        [0, 64, 72, 76, 80]


def test_prototypes_match_cublasLt_h(monkeypatch):
    """Parameter counts of cublasLt.h (nvidia-cublas 13): cublasLtMatmul 16, cublasLtMatmulAlgoCheck 8,
    cublasLtMatmulAlgoGetHeuristic 10, cublasLtMatmulAlgoGetIds 10, cublasLtMatmulAlgoInit 9,
    cublasLtMatmulAlgoCapGetAttribute 5, cublasLtMatmulAlgoConfigSetAttribute 4; cublasLtGetVersion returns
    size_t."""
    names = ("cublasLtCreate", "cublasLtMatmulDescCreate", "cublasLtMatmulDescSetAttribute",
             "cublasLtMatrixLayoutCreate", "cublasLtMatmulPreferenceCreate", "cublasLtMatmulPreferenceSetAttribute",
             "cublasLtMatmulAlgoGetHeuristic", "cublasLtMatmulAlgoCheck", "cublasLtMatmul", "cublasLtGetVersion",
             "cublasLtMatmulAlgoGetIds", "cublasLtMatmulAlgoInit", "cublasLtMatmulAlgoCapGetAttribute",
             "cublasLtMatmulAlgoConfigSetAttribute")
    fake = SimpleNamespace(**{n: SimpleNamespace() for n in names})
    monkeypatch.setattr(blas, "load_cublas", lambda name: fake if name == "cublasLt" else None)
    lib = lt.load_lt()
    assert [len(getattr(lib, n).argtypes) for n in names] == [1, 3, 4, 5, 1, 4, 10, 8, 16, 0, 10, 9, 5, 4]
    assert lib.cublasLtGetVersion.restype is ctypes.c_size_t and lib.cublasLtMatmul.restype is ctypes.c_int
    assert lib.cublasLtMatmulAlgoCheck.argtypes[6]._type_ is lt.MatmulAlgo


def test_descriptors_with_the_real_library():
    try:
        lib = lt.load_lt()
    except RuntimeError:
        pytest.skip("libcublasLt is not installed here")
    lt.matmul_desc(lib)   # a wrong attribute size is CUBLAS_STATUS_INVALID_VALUE, raised by _check
    lt.preference(lib)
    assert len(lt.layouts(lib, 32, 6144, 2560)) == 3


class FakeLt:
    """Six candidates: #0 fine, #1 not usable (state), #2 needs too much workspace, #3 the fastest, #4 fine,
    #5 refused by cublasLtMatmul. `rejected`: algorithm ids that cublasLtMatmulAlgoCheck fails."""
    instances = 0

    def __init__(self) -> None:
        FakeLt.instances += 1
        self.lib = SimpleNamespace(cublasLtGetVersion=lambda: 130802)
        self.heuristic_calls, self.rejected, self.ran = 0, set(), []

    def heuristics(self, lay, count):
        self.heuristic_calls += 1
        results = [lt.HeuristicResult() for _ in range(6)]
        for i, r in enumerate(results):
            r.algo.data[0], r.algo.data[7], r.workspace_size = i, 1000 + i, 1 << 20
        results[1].state = 15   # CUBLAS_STATUS_NOT_SUPPORTED
        results[2].workspace_size = blas.WORKSPACE_BYTES + 1
        return results[:count]

    def usable(self, algo, lay):
        return algo.data[0] not in self.rejected

    def matmul(self, algo, lay, x, w, y):
        self.ran.append((algo.data[0], x.shape, w.shape, y.shape))


def fake_timer(calls):
    def timer(algo):
        calls.append(algo.data[0])
        if algo.data[0] == 5:
            raise RuntimeError("cublasLtMatmul failed with status 15")
        return TIMES[algo.data[0]]
    return timer


def test_fastest_skips_unusable_and_failing_candidates():
    calls = []
    best = lt_tune.fastest(FakeLt(), None, fake_timer(calls))
    assert calls == [0, 3, 4, 5]   # #1 (state) and #2 (workspace) never run
    assert (best.data[0], best.data[7]) == (3, 1003)   # a copy: the heuristic's result array is gone
    assert lt_tune.fastest(FakeLt(), None, lambda algo: (_ for _ in ()).throw(RuntimeError("no"))) is None


@pytest.fixture
def tuning(monkeypatch, tmp_path):
    """lt_tune.tune on fakes: FakeLt, a fake timer (its calls in .timed), host scratch, the cache in tmp_path."""
    monkeypatch.setenv("OPENINFER_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(lt, "plans", {})
    monkeypatch.setattr(lt_tune, "_lts", {})
    state = SimpleNamespace(timed=[], key={"gpu": "NVIDIA H200", "cc": "9.0", "sms": 132, "cublaslt": 130802})
    monkeypatch.setattr(lt_tune, "cp", SimpleNamespace(cuda=SimpleNamespace(
        Device=lambda: SimpleNamespace(id=0), Stream=lambda non_blocking: FakeStream())))
    monkeypatch.setattr(lt_tune, "Lt", FakeLt)
    monkeypatch.setattr(lt_tune, "device_key", lambda dev, lib: dict(state.key))
    monkeypatch.setattr(lt_tune, "scratch", lambda m, n, k: (np.zeros((m, k)), [np.zeros((n, k))], np.zeros((m, n))))
    monkeypatch.setattr(lt_tune, "graph_timer", lambda lt_, lay, x, ws, y, s: fake_timer(state.timed))
    monkeypatch.setattr(lt, "layouts", lambda lib, m, n, k: ("layout", m, n, k))
    return state


SHAPES = {(64, 32), (128, 64)}


class FakeStream(contextlib.nullcontext):
    def synchronize(self) -> None:
        pass


def _restart(monkeypatch) -> None:
    """A new process: no plans, no handle; the cache file stays."""
    monkeypatch.setattr(lt, "plans", {})
    monkeypatch.setattr(lt_tune, "_lts", {})


def test_tune_times_then_reads_the_cache(tuning, monkeypatch, tmp_path):
    got = lt_tune.tune(buckets(32), SHAPES)   # buckets 1, 2, 4, 8 stay on the GEMV
    assert got == lt_tune.Tuned(cached=0, timed=6, lt=6)
    assert sorted(lt.plans) == sorted((0, m, n, k) for n, k in SHAPES for m in (16, 24, 32))
    assert all(p.algo.data[0] == 3 and p.lay == ("layout", *key[1:]) for key, p in lt.plans.items())
    (path,) = (tmp_path / "gemm_algos").iterdir()
    saved = json.loads(path.read_text())
    assert saved["key"] == tuning.key and sorted(saved["choices"]) == sorted(
        f"{m},{n},{k},bf16" for n, k in SHAPES for m in (16, 24, 32))
    assert bytes.fromhex(saved["choices"]["16,64,32,bf16"]) == bytes(lt.plans[(0, 16, 64, 32)].algo)
    assert lt_tune.tune(buckets(32), SHAPES) == lt_tune.Tuned(0, 0, 6)   # planned shapes are kept as they are

    _restart(monkeypatch)
    tuning.timed.clear()
    assert lt_tune.tune(buckets(32), SHAPES) == lt_tune.Tuned(cached=6, timed=0, lt=6)
    assert tuning.timed == [] and lt_tune._lts[0].heuristic_calls == 0   # warm: no timing, no heuristic
    assert all(p.algo.data[0] == 3 and p.algo.data[7] == 1003 for p in lt.plans.values())


def test_a_saved_algorithm_failing_the_check_is_timed_again(tuning, monkeypatch, tmp_path):
    lt_tune.tune([16], SHAPES)
    _restart(monkeypatch)
    monkeypatch.setattr(FakeLt, "usable", lambda self, algo, lay: lay[2:] != (128, 64))
    tuning.timed.clear()
    assert lt_tune.tune([16], SHAPES) == lt_tune.Tuned(cached=1, timed=1, lt=2)
    assert tuning.timed == [0, 3, 4, 5]


@pytest.mark.parametrize("change", ["gpu", "sms", "cublaslt"])
def test_another_gpu_or_library_times_again(tuning, monkeypatch, change):
    lt_tune.tune([16], SHAPES)
    _restart(monkeypatch)
    tuning.key[change] = "other" if change == "gpu" else tuning.key[change] + 1
    assert lt_tune.tune([16], SHAPES) == lt_tune.Tuned(cached=0, timed=2, lt=2)


def test_cache_key_and_unreadable_files(monkeypatch, tmp_path):
    monkeypatch.setenv("OPENINFER_CACHE_DIR", str(tmp_path))
    props = {"name": b"NVIDIA H200", "major": 9, "minor": 0, "multiProcessorCount": 132}
    monkeypatch.setattr(tuning_cache, "cp", SimpleNamespace(cuda=SimpleNamespace(runtime=SimpleNamespace(
        getDeviceProperties=lambda dev: props))))
    key = lt_tune.device_key(0, SimpleNamespace(cublasLtGetVersion=lambda: 130802))
    assert key == {"gpu": "NVIDIA H200", "cc": "9.0", "sms": 132, "cublaslt": 130802}
    path = tuning_cache.cache_path("gemm_algos", key)
    assert path.parent == tmp_path / "gemm_algos" and path != tuning_cache.cache_path("gemm_algos", {**key, "cublaslt": 130900})
    assert tuning_cache.read_choices(path, key) == {}   # missing
    tuning_cache.write_choices(path, key, {"16,64,32,bf16": "00" * 64})
    assert tuning_cache.read_choices(path, key) == {"16,64,32,bf16": "00" * 64}
    assert tuning_cache.read_choices(path, {**key, "sms": 66}) == {}   # a file of another key (hash collision)
    path.write_text("{not json")
    assert tuning_cache.read_choices(path, key) == {}
    assert lt_tune.from_hex("zz") is None and lt_tune.from_hex("00" * 63) is None
    assert lt_tune.from_hex("01" + "00" * 63).data[0] == 1


def test_no_bf16_shapes_tunes_nothing(tuning, tmp_path):
    before = FakeLt.instances
    assert lt_tune.tune(buckets(256), set()) == lt_tune.Tuned(0, 0, 0)   # float32 models: no bf16 shapes
    assert FakeLt.instances == before and not (tmp_path / "gemm_algos").exists()


def test_backend_tunes_every_decode_bucket(monkeypatch):
    """The M's tuned are the decode graphs' buckets (tune drops those on the GEMV), the GEMV's split-K factors are
    tuned for the same weights; the scratch is released."""
    from openinfer.kernels.cuda import gemv_tune
    calls = []
    monkeypatch.setattr(lt_tune, "tune", lambda ms, shapes: calls.append((ms, shapes, lanes.current()))
                        or lt_tune.Tuned(90, 5, 95))
    monkeypatch.setattr(gemv_tune, "tune", lambda shapes: calls.append(shapes) or gemv_tune.Tuned(3, 2, ("64x32 2->1",)))
    backend = SimpleNamespace(device=contextlib.nullcontext(), release_cached=lambda: calls.append("released"),
                              lane="cuda:0#7")
    detail = CudaBackend.tune_gemms(backend, SHAPES, 256)
    assert calls == [(buckets(256), SHAPES, "cuda:0#7"), SHAPES, "released"]   # in the backend's lane
    assert len([m for m in buckets(256) if m > blas.GEMV_MAX_M]) == 19   # 95 GEMMs for Qwen3-4B's 5 weights
    assert detail == ("95 decode GEMM shapes on cuBLASLt (90 from the cache, 5 timed); GEMV split-K for 5 (3 from the "
                      f"cache, 2 timed; off the rule: 64x32 2->1); of {len(SHAPES)} weight shapes")


@pytest.fixture
def dispatch(monkeypatch):
    """blas.linear on host stand-ins: a plan for (M=16, N=64, K=32) on FakeLt; GemmEx and the GEMV recorded."""
    calls = []
    fake_lt = FakeLt()
    fake_lt.matmul = lambda algo, lay, x, w, y: calls.append(("lt", x.shape[0], algo.data[0]))
    algo = lt.MatmulAlgo()
    algo.data[0] = 3
    monkeypatch.setattr(lt, "plans", {(0, 16, 64, 32): lt.Plan(fake_lt, algo, ("layout",))})
    cuda = SimpleNamespace(Device=lambda: SimpleNamespace(id=0), get_current_stream=lambda: SimpleNamespace(ptr=7))
    monkeypatch.setattr(blas, "cp", SimpleNamespace(**vars(FAKE_CP), cuda=cuda))
    gemm_ex = SimpleNamespace(cublasGemmEx=lambda handle, ta, tb, n, m, *a: calls.append(("gemm_ex", m)) or 0)
    monkeypatch.setattr(blas, "_handles", {(0, "default"): SimpleNamespace(lib=gemm_ex, bind=lambda stream: 1)})
    monkeypatch.setattr(blas, "gemv", lambda x2, w, out2: calls.append(("gemv", x2.shape[0])))
    return calls


def test_linear_takes_cublaslt_only_for_tuned_shapes(dispatch):
    w = aligned_empty((64, 32), BF16)
    blas.linear(aligned_empty((16, 32), BF16), w)
    blas.linear(aligned_empty((24, 32), BF16), w)                              # M not tuned
    blas.linear(aligned_empty((16, 32), BF16), aligned_empty((72, 32), BF16))  # N not tuned
    blas.linear(aligned_empty((16, 32), np.float32), aligned_empty((64, 32), np.float32))
    blas.linear(aligned_empty((4, 32), BF16), w)                               # M <= 8: the GEMV
    blas.linear(aligned_empty((16, 48), BF16)[:, :32], w)                     # strided rows: not ld K
    blas.linear(aligned_empty((16 * 32 + 8,), BF16)[8:].reshape(16, 32), w)    # 16 bytes off the 256
    blas.linear(aligned_empty((2, 8, 32), BF16), w)                            # [..., K] rows: M = 16
    assert dispatch == [("lt", 16, 3), ("gemm_ex", 24), ("gemm_ex", 16), ("gemm_ex", 16), ("gemv", 4),
                        ("gemm_ex", 16), ("gemm_ex", 16), ("lt", 16, 3)]


def test_linear_records_bf16_weight_shapes(dispatch):
    w = aligned_empty((64, 32), BF16)
    with lt.recording() as shapes:
        blas.linear(aligned_empty((16, 32), BF16), w)
        blas.linear(aligned_empty((1, 32), BF16), aligned_empty((72, 32), BF16))     # the GEMV's M too
        blas.linear(aligned_empty((16, 32), np.float32), aligned_empty((96, 32), np.float32))
        blas.linear(aligned_empty((16, 32), BF16), aligned_empty((80, 64), BF16)[:, :32])   # rows not packed
        assert blas.gemv_silu_mul(aligned_empty((16, 32), BF16), aligned_empty((112, 32), BF16)) is None  # recorded
    assert shapes == {(64, 32), (72, 32), (112, 32)} and lt.recorded is None
    blas.linear(aligned_empty((16, 32), BF16), aligned_empty((88, 32), BF16))
    assert shapes == {(64, 32), (72, 32), (112, 32)}
