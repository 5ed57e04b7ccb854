"""CPU check of every kernel launch's arguments against the kernel's compiled parameter list (no GPU).

Each .cu is compiled by NVRTC to PTX, whose `.entry` lists give every kernel's parameters with their
sizes (.u64: a pointer or a 64-bit integer, .u32/.s32: a 32-bit integer, .f32: a float). The Python
launchers then run on host stand-ins for cupy arrays (numpy arrays with a `.data.ptr`), with
`launch` recording instead of launching, and each recorded tuple is checked: the count, each
argument's size, floats where the kernel takes a float, and no Python int or float (CuPy would
pass it at a size of its choosing). Grid and block limits and the shared-memory ceiling are
checked too. A wrong argument tuple otherwise shows only on a GPU, as a crash or garbage."""
from __future__ import annotations

import ctypes
import functools
import re
from types import SimpleNamespace

import numpy as np
import pytest

pytest.importorskip("cupy")
from openinfer.batch import ForwardBatch  # noqa: E402
from openinfer.kernels.cuda import attention, attention_decode, blas, compile as kc, module, ops, sampler  # noqa: E402
from openinfer.sampling import SamplingParams  # noqa: E402
from openinfer.sampling_batch import NUM_FIELDS, ROW, SampleRow, build_batch  # noqa: E402

BF16 = module.BF16
PARAM = re.compile(r"\.param\s+(?:\.align\s+\d+\s+)?\.(\w+)\s+\w+(?:\[(\d+)\])?")
SMEM_MAX = 227 * 1024   # the opt-in ceiling per block on sm_90


class FakeArray(np.ndarray):
    """A host array standing in for a cupy array: `.data.ptr` is its address."""

    @property
    def data(self) -> SimpleNamespace:  # type: ignore[override]
        return SimpleNamespace(ptr=self.__array_interface__["data"][0])


def _aligned_empty(shape, dtype=np.float32) -> FakeArray:
    """Like cupy's allocations: 256-byte aligned, so the launchers take their vectorized paths."""
    dtype = np.dtype(dtype)
    n = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    raw = np.empty(n + 256, np.uint8)
    off = -raw.ctypes.data % 256
    return raw[off: off + n].view(dtype).reshape(shape).view(FakeArray)


def _fake(a, dtype=None) -> FakeArray:
    a = np.asarray(a, dtype)
    out = _aligned_empty(a.shape, a.dtype)
    out[...] = a
    return out


FAKE_CP = SimpleNamespace(
    empty=_aligned_empty, asarray=_fake, float32=np.float32, int32=np.int32, uint8=np.uint8, ndarray=FakeArray,
    ascontiguousarray=lambda a, dtype=None: a if a.flags.c_contiguous and dtype in (None, a.dtype) else _fake(a, dtype))


@functools.lru_cache(maxsize=None)
def _entries(source: str) -> dict[str, list[tuple[str, int]]]:
    """kernel name -> [(PTX type, bytes)] of its parameters."""
    nvrtc = kc._nvrtc()
    path = kc.source_path(source)
    headers = kc._headers(path.parent)
    prog = nvrtc.createProgram(path.read_text(), path.name, [h.encode() for h in headers.values()],
                               [n.encode() for n in headers])
    try:
        nvrtc.compileProgram(prog, [*kc.OPTIONS, "-arch=compute_90a"])
        ptx = nvrtc.getPTX(prog).decode()
    finally:
        nvrtc.destroyProgram(prog)
    out = {}
    for name, params in re.findall(r"\.entry\s+(\w+)\s*\(([^)]*)\)", ptx):
        out[name] = [(t, int(n) if n else int(re.sub(r"\D", "", t) or 8) // 8) for t, n in PARAM.findall(params)]
    return out


def _check(source: str, name: str, grid, block: int, args: tuple, smem: int = 0) -> None:
    params = _entries(source)[name]
    assert len(args) == len(params), f"{name}: {len(args)} arguments for {len(params)} parameters"
    for i, (a, (ptype, size)) in enumerate(zip(args, params)):
        where = f"{name} argument {i} ({ptype})"
        if isinstance(a, np.ndarray):
            assert isinstance(a, FakeArray) and ptype in ("u64", "b64", "s64"), f"{where}: an array"
        else:
            assert isinstance(a, np.generic), f"{where}: {type(a).__name__} {a!r} (pass a numpy scalar)"
            assert a.dtype.itemsize == size, f"{where}: {a.dtype} is {a.dtype.itemsize} bytes"
            assert (a.dtype.kind == "f") == ptype.startswith("f"), f"{where}: {a.dtype}"
    grid = tuple(grid) + (1,) * (3 - len(grid))
    assert all(isinstance(g, int) and g >= 1 for g in grid), f"{name}: grid {grid}"
    assert grid[0] < 2**31 and grid[1] <= 65535 and grid[2] <= 65535, f"{name}: grid {grid}"
    assert 1 <= block <= 1024 and block % 32 == 0, f"{name}: block {block}"
    assert smem <= SMEM_MAX, f"{name}: {smem} bytes of shared memory"


@pytest.fixture
def launches(monkeypatch):
    """Launchers on host stand-ins; yields the list of recorded launches (source, name, ...)."""
    try:
        kc._nvrtc()
    except kc.KernelCompileError as e:
        pytest.skip(f"no NVRTC library to compile with: {e}")
    recorded = []

    def launch(source, name, grid, block, args, smem=0):
        recorded.append((source, name))
        _check(source, name, [int(g) for g in grid], block, args, smem)

    for mod in (attention, attention_decode, blas, module, ops, sampler):
        monkeypatch.setattr(mod, "cp", FAKE_CP)
        if hasattr(mod, "launch"):
            monkeypatch.setattr(mod, "launch", launch)
    monkeypatch.setattr(attention_decode, "sm_count", lambda: 132)
    monkeypatch.setattr(attention_decode, "blocks_per_sm", lambda *a: 4)
    monkeypatch.setattr(blas, "gemv_resident", lambda name: 4 * 132)
    monkeypatch.setattr(blas, "_gemv_counters", lambda: _aligned_empty((blas._COUNTER_SLOTS,), np.int32))
    return recorded


def _batch(q_lens, ctx, bs, width) -> ForwardBatch:
    qstart = np.concatenate(([0], np.cumsum(q_lens))).astype(np.int32)
    T = int(qstart[-1])
    tables = np.arange(len(ctx) * width, dtype=np.int32).reshape(len(ctx), width) + 1
    return ForwardBatch(_fake(np.zeros(T, np.int32)), _fake(np.arange(T, dtype=np.int32)),
                        _fake(np.arange(T, dtype=np.int64)), _fake(tables), _fake(qstart),
                        _fake(np.asarray(ctx, np.int32)), _fake(qstart[1:] - 1), qstart, np.asarray(ctx, np.int32),
                        bs, int(max(q_lens)), int(max(ctx)))


@pytest.mark.parametrize("dtype", [BF16, np.float32])
@pytest.mark.parametrize("d", [64, 128, 256])
@pytest.mark.parametrize("q_lens,ctx", [([1, 1, 1], [5000, 17, 900]), ([1] * 64, [30] * 64),   # decode, split / not
                                         ([7, 1, 33], [7, 40, 300])])                          # prefill
def test_paged_attention_launch_args(launches, dtype, d, q_lens, ctx):
    nh, nkv, bs, layers = 24, 4, 16, 3
    width = -(-max(ctx) // bs)
    pool = _aligned_empty((2, 1 + len(ctx) * width, layers, bs, nkv, d), dtype)   # [k/v, blocks, layer, ...]
    T = sum(q_lens)
    qkv = _aligned_empty((T, (nh + 2 * nkv) * d), dtype)     # q: a slice of the fused projection
    q = qkv[:, : nh * d].reshape(T, nh, d)
    attention.paged_attention(q, pool[0, :, 1], pool[1, :, 1], _batch(q_lens, ctx, bs, width), 0.125)
    names = [n for _, n in launches]
    assert names and all(str(d) in n or "combine" in n for n in names)
    if max(q_lens) == 1 and dtype == BF16:
        assert names[0].startswith("paged_decode_mma"), names
    assert names[-1].startswith("paged_combine") == (max(ctx) == 5000), names   # only the long context splits


@pytest.mark.parametrize("m", [1, 3, 8])
@pytest.mark.parametrize("n,k", [(128, 4096), (4096, 1024), (151936, 64)])
def test_linear_gemv_launch_args(launches, m, n, k):
    x = _aligned_empty((m, k), BF16)
    w = _aligned_empty((n, k), BF16)
    blas.linear(x, w)
    assert launches == [("gemv", f"gemv_bf16_{blas.GEMV_VARIANT}")]


def test_gemv_pdl_launch_args(launches, monkeypatch):
    got = []
    monkeypatch.setattr(blas, "GEMV_PDL", True)
    monkeypatch.setattr(blas, "_launch_pdl", lambda name, grid, args: got.append((name, grid, args)))
    blas.linear(_aligned_empty((4, 4096), BF16), _aligned_empty((256, 4096), BF16))
    (name, grid, args), = got
    params = _entries("gemv")[name]
    assert len(args) == len(blas._GEMV_ARG_TYPES) == len(params)
    for a, t, (ptype, size) in zip(args, blas._GEMV_ARG_TYPES, params):
        assert isinstance(a, int) and ctypes.sizeof(t) == size, (a, t, ptype)
    assert grid[1] > 1 and args[6] and args[7]   # split-K: a workspace and the counters


def test_cublas_gemm_ex_binding():
    """cublasGemmEx(handle, transa, transb, m, n, k, alpha, A, Atype, lda, B, Btype, ldb, beta, C,
    Ctype, ldc, computeType, algo): 19 parameters, as bound."""
    lib = SimpleNamespace(**{n: SimpleNamespace() for n in ("cublasCreate_v2", "cublasSetStream_v2",
                                                           "cublasSetWorkspace_v2", "cublasGemmEx")})
    blas._bind(lib)
    assert len(lib.cublasGemmEx.argtypes) == 19


def test_launch_config_matches_cuda_h():
    """CUlaunchConfig / CUlaunchAttribute as laid out by cuda.h (x86-64)."""
    assert ctypes.sizeof(blas._LaunchAttr) == 72 and blas._LaunchAttr.value.offset == 8
    assert [getattr(blas._LaunchConfig, f).offset for f in ("grid", "block", "smem", "stream", "attrs", "num_attrs")] \
        == [0, 12, 24, 32, 40, 48]


@pytest.mark.parametrize("dtype", [BF16, np.float32])
def test_ops_launch_args(launches, dtype):
    T, nh, nkv, d, bs = 5, 8, 2, 128, 16
    qkv = _aligned_empty((T, (nh + 2 * nkv) * d), dtype)
    q = qkv[:, : nh * d].reshape(T, nh, d)
    k = qkv[:, nh * d: (nh + nkv) * d].reshape(T, nkv, d)
    v = qkv[:, (nh + nkv) * d:].reshape(T, nkv, d)
    pool = _aligned_empty((2, 9, 3, bs, nkv, d), dtype)
    cos = sin = _aligned_empty((64, 32), np.float32)
    pos, slots = np.arange(T, dtype=np.int32), np.arange(T, dtype=np.int64)
    w = _aligned_empty((d,), dtype)
    ops.rope_write_kv(q, k, v, w, w, 1e-6, pos, cos, sin, pool[0, :, 1], pool[1, :, 1], slots)
    ops.rope_write_kv(q, k, v, None, None, 0.0, pos, cos, sin, pool[0, :, 1], pool[1, :, 1], slots)
    ops.qk_norm_rope(q, k, w, w, 1e-6, pos, cos, sin)
    ops.rope(q, k, pos, cos, sin)
    ops.write_kv(pool[0, :, 1], pool[1, :, 1], k, v, slots)
    x = _aligned_empty((T, 512), dtype)
    ops.rms_norm(x, _aligned_empty((512,), dtype), 1e-6)
    ops.add_rms_norm(x, _aligned_empty((T, 512), dtype), _aligned_empty((512,), dtype), 1e-6)
    ops.silu_mul(_aligned_empty((T, 1024), dtype))
    ops.embedding(_aligned_empty((100, 512), dtype), np.arange(T))
    ops.argmax(_aligned_empty((T, 1000), dtype))
    ops.top_logprobs(_aligned_empty((T, 1000), dtype), 5)
    assert len(launches) == 13


@pytest.mark.parametrize("dtype", [BF16, np.float32])
def test_device_sampler_launch_args(launches, dtype):
    vocab = 1000
    rows = [SampleRow(SamplingParams(temperature=0.7, top_p=0.9, top_k=50, logprobs=lp, repetition_penalty=1.1),
                      [1, 2, 3], [4, 4], frozenset({7}), (1, 2), (3, 4)) for lp in (None, 3, 0)]
    b = build_batch(rows, vocab)
    b.params[:, ROW] = [0, 2, 3]
    params = _fake(b.params)
    edits = _fake(b.edits)
    assert params.shape[1] == NUM_FIELDS
    logits = _aligned_empty((4, vocab), dtype)
    sampler.sample(logits, params, edits, b.top_k, np.flatnonzero(b.params[:, 1] > 0))
    assert [n for _, n in launches][-1].startswith("sample_rows_")
