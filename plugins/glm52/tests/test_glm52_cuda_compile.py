"""CPU-only checks of the glm52 CUDA kernels (no GPU): dsa.cu compiles to an sm_90a cubin with NVRTC, every
launch matches its kernel's compiled parameters (openinfer.testing.launch_check), the source ships as package
data, the ops register lazily for "cuda", and a numpy emulation of the top-k kernel's radix select and tie rule
equals the reference selection."""
from __future__ import annotations

import dataclasses
import fnmatch
import subprocess
import sys
import tomllib
from pathlib import Path

import numpy as np
import pytest

from openinfer.plugin_api import ForwardBatch, KernelRegistry
from openinfer_glm52 import cuda, ops, plugin

KERNEL_DIR = Path(cuda.__file__).parent
PLUGIN_ROOT = KERNEL_DIR.parents[1]


def test_dsa_compiles_to_an_sm90a_cubin_with_every_kernel(tmp_path, monkeypatch):
    from openinfer.testing.cuda import compile_cubin, require_nvrtc
    require_nvrtc()
    monkeypatch.setenv("OPENINFER_CACHE_DIR", str(tmp_path))
    cubin = compile_cubin(KERNEL_DIR / "dsa.cu")
    assert cubin[:4] == b"\x7fELF"
    names = ["indexer_topk_select"] + [f"{k}_{s}" for k in ("indexer_rope_write", "indexer_scores",
                                                            "sparse_mla_attention") for s in ("bf16", "f32")]
    for name in names:
        assert name.encode() + b"\0" in cubin, name


def test_source_ships_as_package_data():
    patterns = tomllib.loads((PLUGIN_ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]
    for path in KERNEL_DIR.glob("*.cu"):
        rel = path.relative_to(PLUGIN_ROOT / "openinfer_glm52").as_posix()
        assert any(fnmatch.fnmatch(rel, p) for p in patterns["openinfer_glm52"]), rel


def test_registered_lazily_for_cuda():
    reg = KernelRegistry()
    plugin.register_kernels(reg.register)
    for op in ops.OPS:
        for dtype in cuda.DTYPES:
            assert reg.candidates(op, "cuda", dtype)[0].impl == f"openinfer_glm52.cuda.ops:{op}"
        assert reg.candidates(op, "numpy", "float32")[0].impl == f"openinfer_glm52.ops:{op}"
    code = ("import sys, openinfer_glm52.plugin; "
            "bad = [m for m in ('cupy', 'cuda', 'torch') if m in sys.modules]; assert not bad, bad")
    subprocess.run([sys.executable, "-c", code], check=True)


def _batch(runs: list[tuple[int, int]], fake, block_size: int = 16) -> ForwardBatch:
    qs = np.concatenate([[0], np.cumsum([n for _, n in runs])]).astype(np.int32)
    lens = np.asarray([p + n for p, n in runs], dtype=np.int32)
    width = max(-(-L // block_size) for L in lens)
    tables = np.arange(len(runs) * width, dtype=np.int32).reshape(len(runs), width)
    positions = np.concatenate([np.arange(p, p + n) for p, n in runs]).astype(np.int32)
    T = int(qs[-1])
    return ForwardBatch(fake(np.zeros(T, np.int32)), fake(positions), fake(np.zeros(T, np.int64)), fake(tables),
                        fake(qs), fake(lens), fake(np.zeros(1, np.int32)), qs, lens, block_size,
                        max(n for _, n in runs), int(lens.max()))


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
@pytest.mark.parametrize("runs", [[(0, 40), (7, 1), (300, 1)], [(5, 1), (2047, 1)], [(40000, 1), (7, 1)]])
def test_launches_match_the_kernels(monkeypatch, dtype, runs):
    pytest.importorskip("cupy")
    ml_dtypes = pytest.importorskip("ml_dtypes")
    from openinfer.plugin_api.cuda import suffix
    from openinfer.testing.launch_check import aligned_empty, fake, record_launches
    from openinfer_glm52.cuda import ops as cuda_ops
    recorded = record_launches(monkeypatch, [cuda_ops])
    on_h100(monkeypatch)
    dt = np.dtype(ml_dtypes.bfloat16) if dtype == "bfloat16" else np.dtype(np.float32)
    b = _batch(runs, fake)
    T, Hi, Di, H, R, P, layers, blocks = b.num_tokens, 32, 128, 64, 512, 64, 3, 64
    index_pool = aligned_empty((blocks, layers, 16, Di), dt)
    latent_pool = aligned_empty((blocks, layers, 16, R + P), dt)
    cos = aligned_empty((4096, P // 2), np.float32)
    q = cuda_ops.glm52_indexer_rope_write(aligned_empty((T, Hi, Di), dt), aligned_empty((T, Di), dt),
                                          aligned_empty(Di, dt), aligned_empty(Di, dt), b.positions, cos, cos,
                                          index_pool[:, 1], b.slot_mapping, True)
    sel = cuda_ops.glm52_indexer_topk(q, aligned_empty((T, Hi), np.float32), index_pool[:, 2], b, 2048, Di ** -0.5)
    out = cuda_ops.glm52_sparse_mla_attention(aligned_empty((T, H, R), dt), aligned_empty((T, H, P), dt),
                                              latent_pool[:, 0], sel, b, 0.07)
    assert q.shape == (T, Hi, Di) and sel.shape == (T, 2048) and out.shape == (T, H, R)
    assert [c.name for c in recorded] == [f"indexer_rope_write_{suffix(dt)}",
                                          f"indexer_scores_{suffix(dt)}", "indexer_topk_select",
                                          f"sparse_mla_attention_{suffix(dt)}"]
    select = recorded[2]
    ranks = int(select.args[6])
    assert select.grid == (T * ranks,) and select.cluster == ((ranks, 1, 1) if ranks > 1 else None)


def on_h100(monkeypatch) -> None:
    """The launchers' device queries answered as an H100 would (there is no GPU to ask)."""
    from openinfer_glm52.cuda import ops as cuda_ops
    monkeypatch.setattr(cuda_ops, "clusters_supported", lambda: True)
    monkeypatch.setattr(cuda_ops, "sm_count", lambda: 132)


def _inconsistent(b: ForwardBatch, fake) -> list[tuple[str, ForwardBatch, int, int]]:
    """(what is wrong, batch, tokens, cache block size): each breaks one shape the kernels index by."""
    narrow = dataclasses.replace(b, block_tables=fake(np.asarray(b.block_tables)[:, :-1]))
    return [("tokens", b, b.num_tokens + 1, 16), ("cannot hold", narrow, b.num_tokens, 16),
            ("cache blocks", b, b.num_tokens, 32)]


@pytest.mark.parametrize("case", range(3))
def test_launchers_refuse_a_batch_the_kernels_would_index_outside_of(monkeypatch, case):
    """The kernels index the cache through the batch's device fields unchecked: a grid of more tokens than the
    batch, block tables narrower than its contexts or a cache of other blocks is a clear error, not a launch."""
    pytest.importorskip("cupy")
    from openinfer.testing.launch_check import aligned_empty, fake, record_launches
    from openinfer_glm52.cuda import ops as cuda_ops
    recorded = record_launches(monkeypatch, [cuda_ops])
    match, b, T, bs = _inconsistent(_batch([(0, 40), (7, 1), (300, 1)], fake), fake)[case]
    Hi, Di, H, R, P = 4, 128, 16, 512, 64
    index_pool, latent_pool = aligned_empty((64, 2, bs, Di), np.float32), aligned_empty((64, 2, bs, R + P), np.float32)
    q = aligned_empty((T, Hi, Di), np.float32)
    if T != b.num_tokens:
        cos = aligned_empty((512, P // 2), np.float32)
        with pytest.raises(ValueError, match="positions"):
            cuda_ops.glm52_indexer_rope_write(q, aligned_empty((T, Di), np.float32), aligned_empty(Di, np.float32),
                                              aligned_empty(Di, np.float32), b.positions, cos, cos, index_pool[:, 1],
                                              b.slot_mapping, True)
    with pytest.raises(ValueError, match=match):
        cuda_ops.glm52_indexer_topk(q, aligned_empty((T, Hi), np.float32), index_pool[:, 1], b, 64, Di ** -0.5)
    with pytest.raises(ValueError, match=match):
        cuda_ops.glm52_sparse_mla_attention(aligned_empty((T, H, R), np.float32), aligned_empty((T, H, P), np.float32),
                                            latent_pool[:, 0], fake(np.zeros((T, 64), np.int32)), b, 0.07)
    assert not recorded


def emulate_select(scores: np.ndarray, visible: int, topk: int, ranks: int = 1, threads: int = 1024) -> np.ndarray:
    """indexer_topk_select's algorithm in numpy, [topk] int32: order keys; radix passes of 11, 11 and 10 bits over
    the summed histograms of the ranks' segments find the k-th largest key (the kernel's candidate list changes
    where the last pass reads its keys, not its counts); each warp's contiguous run of its rank's segment (whole
    steps of 32 keys) writes its keys above the cut, and the earliest at it, after the counts of the runs before
    it."""
    if visible <= topk:
        return np.array([i if i < visible else -1 for i in range(topk)], np.int32)
    x = np.where(scores[:visible] == 0, np.float32(0), scores[:visible]).astype(np.float32)
    u = x.view(np.uint32)
    keys = np.where(u & 0x80000000, ~u, u | 0x80000000).astype(np.uint32)
    seg = -(-visible // ranks)
    lo = np.minimum(np.arange(ranks) * seg, visible)
    hi = np.minimum(lo + seg, visible)
    prefix, mask, need = 0, 0, topk
    for shift, bits in ((21, 11), (10, 11), (0, 10)):
        digits = (1 << bits) - 1
        hist = sum(np.bincount((k[(k & mask) == prefix] >> shift) & digits, minlength=digits + 1)
                   for k in (keys[a:b] for a, b in zip(lo, hi)))
        above, b = 0, digits
        while b > 0 and above + hist[b] < need:
            above += hist[b]
            b -= 1
        prefix, need, mask = prefix | (b << shift), need - above, mask | (digits << shift)
    warps = threads // 32
    run = -(-(-(-(hi - lo) // warps)) // 32) * 32
    first = (lo[:, None] + np.arange(warps) * run[:, None]).ravel()   # (rank, warp) order
    last = np.minimum(first + np.repeat(run, warps), np.repeat(hi, warps))
    first, last = first[last > first], last[last > first]
    assert first[0] == 0 and last[-1] == visible and (first[1:] == last[:-1]).all(), "the runs tile the row in order"
    above_before = np.concatenate([[0], np.cumsum(keys > prefix)])     # counts of the runs before, then the run's own
    equal_before = np.concatenate([[0], np.cumsum(keys == prefix)])
    out = np.full(topk, -2, np.int64)
    for a, b in zip(first, last):
        for s in range(a, b):
            if keys[s] > prefix or (keys[s] == prefix and equal_before[s] < need):
                at = above_before[s] + min(equal_before[s], need)
                assert out[at] == -2, f"slot {at} written twice"
                out[at] = s
    assert (out >= 0).all(), "every slot written"
    return out.astype(np.int32)


def test_the_top_k_kernel_s_algorithm_is_the_reference_selection():
    rng = np.random.default_rng(0)
    for trial in range(300):
        L, topk = int(rng.integers(1, 300)), int(rng.integers(1, 64))
        kind = trial % 3
        if kind == 0:
            s = rng.standard_normal(L).astype(np.float32)
        elif kind == 1:   # the ReLU's exact ties: many zeros of both signs, a few values
            s = np.where(rng.random(L) < 0.7, np.float32(0) * rng.choice([-1, 1], L),
                         rng.standard_normal(L)).astype(np.float32)
        else:             # few distinct values
            s = rng.integers(-3, 3, L).astype(np.float32)
        visible, ranks, threads = int(rng.integers(1, L + 1)), int(rng.integers(1, 9)), int(rng.choice([32, 64]))
        np.testing.assert_array_equal(emulate_select(s, visible, topk, ranks, threads),
                                      ops.select_topk(s, visible, topk))


def test_select_keeps_a_segment_in_shared_memory_where_it_fits():
    pytest.importorskip("cupy")
    from openinfer_glm52.cuda import ops as cuda_ops
    assert cuda_ops.select_staged_keys(131072, 8) == 16384     # 64 KB a CTA at 128k over a cluster of 8
    assert cuda_ops.select_staged_keys(202752, 8) == 25344     # GLM's longest context: 99 KB
    assert cuda_ops.select_staged_keys(131072, 1) == 0         # 512 KB: every pass reads the row
    assert 4 * cuda_ops.select_staged_keys(49152, 1) <= cuda_ops.SELECT_STAGE_BYTES


def test_select_ranks_split_long_rows_over_a_cluster(monkeypatch):
    """One CTA a row where rows are short or many, a cluster of up to 8 where few long rows would leave the GPU
    idle; one everywhere without clusters."""
    pytest.importorskip("cupy")
    from openinfer_glm52.cuda import ops as cuda_ops
    monkeypatch.setattr(cuda_ops, "clusters_supported", lambda: True)
    assert cuda_ops.select_ranks(1, 131072, 132) == 8
    assert cuda_ops.select_ranks(1, 2048, 132) == 1
    assert cuda_ops.select_ranks(1, 8192, 132) == 1
    assert cuda_ops.select_ranks(32, 32768, 132) == 4
    assert cuda_ops.select_ranks(1, 16384, 132) == 2
    assert cuda_ops.select_ranks(512, 131072, 132) == 1
    monkeypatch.setattr(cuda_ops, "clusters_supported", lambda: False)
    assert cuda_ops.select_ranks(1, 131072, 132) == 1
