"""CPU checks of the glm52 TileLang kernels (no GPU): the shipped cubins are the ones kernels.json describes, built
from the current programs; each kernel's metadata matches its CUDA signature; every launch of tilelang_ops.py
passes the parameters kernels.json lists, with their types, on the grid TileLang computed; a numpy emulation of the
split attention and its combine equals the reference; rebuilding gives the same CUDA source (where tilelang is
installed); the ops register as "tilelang" above the hand-written kernels on sm_90."""
from __future__ import annotations

import fnmatch
import hashlib
import json
import re
import subprocess
import sys
import tomllib
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from openinfer.plugin_api import ForwardBatch, KernelRegistry
from openinfer_glm52 import cuda, ops, plugin

from test_glm52_cuda_compile import _batch

PACKAGE = Path(cuda.__file__).parents[1]
PLUGIN_ROOT = PACKAGE.parent
KERNEL_DIR = Path(cuda.__file__).with_name("tilelang")
SOURCES = PLUGIN_ROOT / "kernels_src"
META = json.loads((KERNEL_DIR / "kernels.json").read_text())
NAMES = ["indexer_scores", "sparse_mla", "sparse_mla_combine", "sparse_rows", "topk_select"]
SIGNATURE = re.compile(r"__global__ void __launch_bounds__\([^)]*\) (\w+)\(([^)]*)\)")
C_TYPES = {"int": "int32", "float": "float32", "bfloat16_t": "bfloat16"}


def test_cubins_are_the_described_build_of_the_current_programs():
    assert sorted(META["kernels"]) == NAMES and META["arch"] == "sm_90a"
    assert META["programs_sha256"] == hashlib.sha256((SOURCES / "programs.py").read_bytes()).hexdigest(), \
        "programs.py changed since the cubins were built: run plugins/glm52/kernels_src/build_tilelang.py"
    total = 0
    for name, meta in META["kernels"].items():
        cubin = (KERNEL_DIR / f"{name}.cubin").read_bytes()
        total += len(cubin)
        assert cubin[:4] == b"\x7fELF" and name.encode() + b"\0" in cubin
        assert hashlib.sha256(cubin).hexdigest() == meta["cubin_sha256"], name
    assert total < 2 << 20


def test_shipped_as_package_data():
    patterns = tomllib.loads((PLUGIN_ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]
    for path in KERNEL_DIR.iterdir():
        rel = path.relative_to(PACKAGE).as_posix()
        assert any(fnmatch.fnmatch(rel, p) for p in patterns["openinfer_glm52"]), rel


@pytest.mark.parametrize("name", NAMES)
def test_metadata_matches_the_kernel_signature(name):
    [(kernel, params)] = SIGNATURE.findall((KERNEL_DIR / f"{name}.cu").read_text())
    assert kernel == name
    got = []
    for p in params.split(","):
        words = p.replace("const", "").replace("__restrict__", "").split()
        ctype, pname = words[0].rstrip("*"), words[-1].lstrip("*")
        got.append({"name": pname, "type": ("ptr:" if "*" in p else "") + C_TYPES[ctype]})
    assert got == META["kernels"][name]["params"]


@pytest.mark.parametrize("name", NAMES)
def test_every_kernel_waits_for_the_previous_one_first(name):
    """Marked for programmatic dependent launch, each kernel's first statements wait for the previous kernel and
    then let the next one launch (programs.py dependent_launch), before any load of its own."""
    body = (KERNEL_DIR / f"{name}.cu").read_text().split("void __launch_bounds__", 1)[1]
    wait = body.index("cudaGridDependencySynchronize();")
    assert META["kernels"][name]["pdl"] is True and wait < body.index("cudaTriggerProgrammaticLaunchCompletion")
    before = body[:wait].split("{", 1)[1]
    pointers = [p["name"] for p in META["kernels"][name]["params"] if p["type"].startswith("ptr:")]
    assert not [p for p in pointers if re.search(rf"\b{p}\[", before)], "a load before the wait"


@pytest.mark.parametrize("runs", [[(0, 40), (7, 1), (300, 1)], [(5000, 1)] * 3])
def test_launches_match_the_metadata(monkeypatch, runs):
    pytest.importorskip("cupy")
    ml_dtypes = pytest.importorskip("ml_dtypes")
    from openinfer.testing.launch_check import FAKE_CP, aligned_empty, fake, record_launches
    from openinfer_glm52.cuda import ops as cuda_ops
    from openinfer_glm52.cuda import tilelang_module, tilelang_ops
    from test_glm52_cuda_compile import on_h100
    nvrtc = record_launches(monkeypatch, [cuda_ops])
    on_h100(monkeypatch)
    fake_cp = SimpleNamespace(**vars(FAKE_CP), arange=lambda *a, **k: fake(np.arange(*a, **k)),
                              searchsorted=lambda a, v, side: fake(np.searchsorted(a, v, side=side)))
    monkeypatch.setattr(tilelang_ops, "cp", fake_cp)
    monkeypatch.setattr(tilelang_ops, "sm_count", lambda: 132)
    launches = []

    def launch(name, grid, values):
        meta = tilelang_module.kernels()[name]
        args = tilelang_module.arguments(name, values)   # every parameter by name, of its type
        assert all(isinstance(a, np.ndarray) for a, p in zip(args, meta["params"]) if p["type"].startswith("ptr"))
        want = [eval(g, {}, {k: int(v) for k, v in values.items() if np.ndim(v) == 0}) for g in meta["grid"]]
        assert list(grid) + [1] * (3 - len(grid)) == want, f"{name}: grid {grid}, TileLang's {want}"
        assert meta["smem"] <= 227 * 1024
        launches.append((name, values))

    monkeypatch.setattr(tilelang_ops, "launch", launch)
    bf = np.dtype(ml_dtypes.bfloat16)
    b = _batch(runs, fake, 64)
    T, H, blocks, layers = b.num_tokens, 64, 300, 3
    latent = aligned_empty((blocks, layers, 64, 576), bf)
    index = aligned_empty((blocks, layers, 64, 128), bf)
    sel = fake(np.full((T, 2048), -1, np.int32))
    out = tilelang_ops.glm52_sparse_mla_attention(aligned_empty((T, H, 512), bf), aligned_empty((T, H, 64), bf),
                                                  latent[:, 1], sel, b, 0.07)
    iq, iw = aligned_empty((T, 32, 128), bf), aligned_empty((T, 32), np.float32)
    top = tilelang_ops.glm52_indexer_topk(iq, iw, index[:, 2], b, 2048, 128 ** -0.5)
    top2 = tilelang_ops.glm52_indexer_topk_nvrtc_select(iq, iw, index[:, 2], b, 2048, 128 ** -0.5)
    assert out.shape == (T, H, 512) and top.shape == top2.shape == (T, 2048)
    assert [n for n, _ in launches] == ["sparse_rows", "sparse_mla", "sparse_mla_combine", "indexer_scores",
                                        "topk_select", "indexer_scores"]
    [(_, rows), (_, mla), _, (_, scores), (_, select), _] = launches
    seqs = np.repeat(np.arange(len(runs)), [n for _, n in runs])
    np.testing.assert_array_equal(rows["TokenSeq"], seqs)
    assert rows["block_rows"] == layers * 64 and mla["kv_rows"] == (blocks - 1) * layers * 64 + 64
    assert scores["width"] == b.max_context_len and mla["splits"] == tilelang_ops.splits_for(2048) == 8
    assert mla["per"] == tilelang_ops.splits_per_block(8, T, 132)
    assert select["width"] == b.max_context_len and select["topk"] == 2048
    assert [c.name for c in nvrtc] == ["indexer_topk_select"]   # "tilelang+nvrtc": the hand-written select


def test_a_kernel_that_waits_launches_with_pdl_where_it_is_available(monkeypatch):
    """kernels.json's "pdl" sends a launch through cuLaunchKernelEx with the attribute (plugin_api.cuda.pdl) while PDL
    is available on the stream, and through CuPy otherwise."""
    pytest.importorskip("cupy")
    ml_dtypes = pytest.importorskip("ml_dtypes")
    from openinfer.plugin_api.cuda import pdl
    from openinfer_glm52.cuda import tilelang_module
    calls = []

    class Kernel:
        kernel = SimpleNamespace(ptr=1234)

        def __call__(self, grid, block, args, shared_mem):
            calls.append(("cupy", grid, block, shared_mem))

    monkeypatch.setattr(tilelang_module, "_function", lambda name: Kernel())
    monkeypatch.setattr(pdl, "launch", lambda ptr, grid, block, args, smem: calls.append(("pdl", ptr, grid, block)))
    values = dict(OPart=np.zeros((8, 2, 64, 512), np.float32), LsePart=np.zeros((8, 2, 64), np.float32),
                  Out=np.zeros((2, 64, 512), ml_dtypes.bfloat16), heads=64, splits=8, t_n=2)
    for available in (True, False):
        monkeypatch.setattr(pdl, "available", lambda: available)
        tilelang_module.launch("sparse_mla_combine", (2, 64), values)
    assert calls == [("pdl", 1234, (2, 64), 128), ("cupy", (2, 64), (128, 1, 1), 0)]


def test_serving_imports_neither_tilelang_nor_torch():
    pytest.importorskip("cupy")
    code = ("import sys, openinfer_glm52.cuda.tilelang_ops, openinfer_glm52.cuda.tilelang_module as tm; "
            "tm.kernels(); bad = [m for m in ('tilelang', 'tvm_ffi', 'torch') if m in sys.modules]; "
            "assert not bad, bad")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_other_shapes_go_to_the_hand_written_kernels(monkeypatch):
    pytest.importorskip("cupy")
    from openinfer_glm52.cuda import tilelang_ops
    called = []
    monkeypatch.setattr(tilelang_ops.nvrtc, "glm52_sparse_mla_attention", lambda *a: called.append("mla"))
    monkeypatch.setattr(tilelang_ops.nvrtc, "glm52_indexer_topk", lambda *a: called.append("topk"))
    f32 = np.zeros((2, 4, 512), np.float32)
    tilelang_ops.glm52_sparse_mla_attention(f32, f32[..., :64], np.zeros((3, 16, 576), np.float32), None, None, 0.1)
    for fn in (tilelang_ops.glm52_indexer_topk, tilelang_ops.glm52_indexer_topk_nvrtc_select):
        fn(np.zeros((2, 16, 128), np.float32), None, np.zeros((3, 16, 128), np.float32), None, 4, 0.1)
    assert called == ["mla", "topk", "topk"]


def emulate_split_attention(q: np.ndarray, keys: np.ndarray, valid: np.ndarray, scale: float, splits: int,
                            tile: int) -> np.ndarray:
    """sparse_mla + sparse_mla_combine in numpy for one token: q [H, 576], keys [K, 576] (its selection's rows),
    valid [K]; tiles of `tile` keys, tile i in split i % splits, online softmax in base 2, log2-sum-exp merge."""
    sm = scale * np.log2(np.e)
    H, parts = q.shape[0], []
    for s in range(splits):
        m, l, acc = np.full(H, -2.0**30), np.zeros(H), np.zeros((H, 512))
        for base in range(s * tile, len(keys), splits * tile):
            k, ok = keys[base:base + tile], valid[base:base + tile]
            scores = np.where(ok[None], q @ k.T, -np.inf)
            m_new = np.maximum(m, scores.max(axis=1))
            alpha, p = np.exp2((m - m_new) * sm), np.exp2(scores * sm - m_new[:, None] * sm)
            l, acc, m = l * alpha + p.sum(axis=1), acc * alpha[:, None] + p @ k[:, :512], m_new
        parts.append((np.where(l[:, None] > 0, acc / np.where(l > 0, l, 1)[:, None], 0),
                      np.where(l > 0, np.log2(np.where(l > 0, l, 1)) + m * sm, -np.inf)))
    top = np.max([lse for _, lse in parts], axis=0)
    w = [np.where(lse == -np.inf, 0, np.exp2(lse - top)) for _, lse in parts]
    return sum(wi[:, None] * o for wi, (o, _) in zip(w, parts)) / sum(w)[:, None]


def test_the_split_attention_algorithm_is_the_reference():
    rng = np.random.default_rng(0)
    H, K, L = 8, 200, 300
    for splits in (1, 3, 4):
        q = rng.standard_normal((1, H, 576)).astype(np.float32)
        cache = rng.standard_normal((L // 10, 10, 576)).astype(np.float32)
        sel = np.sort(rng.choice(L, K, replace=False)).astype(np.int32)
        sel[-20:] = -1
        b = ForwardBatch(*[np.zeros(1, np.int32)] * 3, np.arange(L // 10, dtype=np.int32)[None],
                         np.array([0, 1], np.int32), np.array([L], np.int32), np.zeros(1, np.int32),
                         np.array([0, 1], np.int32), np.array([L], np.int32), 10, 1, L)
        want = ops.glm52_sparse_mla_attention(q[..., :512], q[..., 512:], cache, sel[None], b, 0.05)
        rows = cache.reshape(L, 576)[np.maximum(sel, 0)]
        got = emulate_split_attention(q[0], rows, sel >= 0, 0.05, splits, 64)
        np.testing.assert_allclose(got, want[0], rtol=1e-5, atol=1e-5)


def emulate_select_placement(scores: np.ndarray, visible: int, topk: int, chunk: int) -> np.ndarray:
    """topk_select's last pass in numpy (the radix passes that find the k-th largest key are the hand-written
    select's, emulated in test_glm52_cuda_compile.py): chunk by chunk, one scan of packed (equal, larger) counts; a
    taken key's slot is the larger keys before it plus min(equal keys before it, need)."""
    x = np.where(scores[:visible] == 0, np.float32(0), scores[:visible]).astype(np.float32)
    u = x.view(np.uint32)
    keys = np.where(u & 0x80000000, ~u, u | 0x80000000).astype(np.uint32)
    kth = np.sort(keys)[::-1][topk - 1]
    need = topk - int((keys > kth).sum())
    out = np.full(topk, -1, np.int32)
    gt_seen = eq_seen = 0
    for base in range(0, visible, chunk):
        k = keys[base:base + chunk]
        gt, eq = (k > kth).astype(np.int64), (k == kth).astype(np.int64)
        packed = np.cumsum(eq * 65536 + gt)
        before = packed - (eq * 65536 + gt)
        eq_before = eq_seen + (before >> 16)
        slot = gt_seen + (before & 65535) + np.minimum(eq_before, need)
        take = (gt == 1) | ((eq == 1) & (eq_before < need))
        out[slot[take]] = base + np.flatnonzero(take)
        gt_seen, eq_seen = gt_seen + int(packed[-1] & 65535), eq_seen + int(packed[-1] >> 16)
    return out


def test_the_tilelang_select_s_placement_is_the_reference_selection():
    rng = np.random.default_rng(1)
    for trial in range(300):
        L, topk, chunk = int(rng.integers(2, 400)), int(rng.integers(1, 64)), int(rng.choice([8, 32, 1024]))
        zeros = np.where(rng.random(L) < 0.7, 0.0 * rng.choice([-1, 1], L), rng.standard_normal(L))
        s = [rng.standard_normal(L), zeros, rng.integers(-3, 3, L)][trial % 3].astype(np.float32)
        visible = int(rng.integers(topk + 1, L + 1)) if L > topk else L
        if visible <= topk:
            continue
        np.testing.assert_array_equal(emulate_select_placement(s, visible, topk, chunk),
                                      ops.select_topk(s, visible, topk))


def test_rebuilding_gives_the_same_source(tmp_path):
    pytest.importorskip("tilelang")
    subprocess.run([sys.executable, str(SOURCES / "build_tilelang.py"), "--source-only", "--out", str(tmp_path),
                    "sparse_rows"], check=True, capture_output=True)
    assert (tmp_path / "sparse_rows.cu").read_text() == (KERNEL_DIR / "sparse_rows.cu").read_text()


def test_registered_above_the_hand_written_kernels_on_sm90():
    """The order measured on the H100: TileLang scores with the hand-written select, TileLang, then hand-written;
    elsewhere (another GPU generation, float32) only the hand-written kernels."""
    reg = KernelRegistry()
    plugin.register_kernels(reg.register)
    expected = {"glm52_indexer_topk": ["tilelang+nvrtc", "tilelang", "nvrtc"],
                "glm52_sparse_mla_attention": ["tilelang", "nvrtc"]}
    for op in cuda.TILELANG_OPS:
        assert [k.name for k in reg.candidates(op, "cuda", "bfloat16", 90)] == expected[op], op
        assert [k.name for k in reg.candidates(op, "cuda", "bfloat16", 89)] == ["nvrtc"]
        assert [k.name for k in reg.candidates(op, "cuda", "float32", 90)] == ["nvrtc"]
        tl = [k for k in reg.candidates(op, "cuda", "bfloat16", 90) if k.name == "tilelang"]
        assert tl[0].impl == f"openinfer_glm52.cuda.tilelang_ops:{op}"
    [both] = [k for k in reg.candidates("glm52_indexer_topk", "cuda", "bfloat16", 90) if k.name == "tilelang+nvrtc"]
    assert both.impl.endswith("tilelang_ops:glm52_indexer_topk_nvrtc_select")


def test_a_block_takes_as_many_splits_as_keep_the_grid_in_one_wave():
    """sparse_mla's blocks a token's parts take in turn: a divisor of the split count, the fewest that fit one wave
    of a block an SM (the parts, and so the bits, stay the same)."""
    pytest.importorskip("cupy")
    from openinfer_glm52.cuda.tilelang_ops import splits_per_block
    assert [splits_per_block(8, blocks, 132) for blocks in (1, 16, 17, 33, 34, 67, 1000)] == [1, 1, 2, 2, 4, 8, 8]
    assert splits_per_block(1, 500, 132) == 1 and splits_per_block(6, 30, 132) == 2
