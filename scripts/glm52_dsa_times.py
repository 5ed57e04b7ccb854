"""GPU time of one layer's GLM-5.2 DSA ops in a decode step, hand-written kernels ("nvrtc") against the TileLang ones
(and the registry's pick on sm_90 for the indexer: TileLang scores with the hand-written select), and all against the
bytes-moved floor: the bytes an op must read (indexer: every visible key of the index cache;
sparse attention: the selected latent rows) at the device-to-device copy bandwidth measured here. Then the core's dense
MLA decode over the same cache, and the sparse layer (indexer + sparse attention, the fastest implementation of each)
against it and against its own floor. The indexer's scores and top-k select are also timed apart, the select over
each CTA count a row may be split over. Mean time per call between CUDA events over eager launches; bf16, 64 heads,
kv_lora 512 + rope 64, indexer 32 x 128, top-2048, block size 64. Also how far the two implementations agree at these
shapes. Run by scripts/gpu_glm52.sh."""
from __future__ import annotations

import cupy as cp
import ml_dtypes
import numpy as np

from openinfer.kernels.cuda.mla import mla_attention
from openinfer.plugin_api import ForwardBatch
from openinfer.testing.cuda import copy_bandwidth, graph_ms
from openinfer_glm52.cuda import ops as nvrtc
from openinfer_glm52.cuda import tilelang_ops as tilelang

BF16 = np.dtype(ml_dtypes.bfloat16)
H, R, P, HI, DI, TOPK, BS = 64, 512, 64, 32, 128, 2048, 64
SHAPES = ((1, 8192), (1, 32768), (1, 131072), (32, 8192), (32, 32768))   # (batch, context)
IMPLS = (("nvrtc", nvrtc), ("tilelang", tilelang))
SPLITS, SELECT_RANKS = (1, 2, 4, 8, 16, 32), (1, 2, 4, 8)
splits_for, select_ranks = tilelang.splits_for, nvrtc.select_ranks
stream = cp.cuda.Stream(non_blocking=True)


def bench(fn, n: int = 50) -> float:
    """Mean microseconds per call."""
    with stream:
        fn()
        stream.synchronize()
        start, end = cp.cuda.Event(), cp.cuda.Event()
        start.record(stream)
        for _ in range(n):
            fn()
        end.record(stream)
        end.synchronize()
    return cp.cuda.get_elapsed_time(start, end) / n * 1e3


def randn(shape, dtype=BF16):
    return cp.random.standard_normal(shape, dtype=cp.float32).astype(dtype)


def decode_batch(B: int, L: int) -> ForwardBatch:
    tables = cp.arange(B * (L // BS), dtype=cp.int32).reshape(B, L // BS)
    qs, lens = np.arange(B + 1, dtype=np.int32), np.full(B, L, np.int32)
    z = cp.zeros(1, cp.int32)
    return ForwardBatch(z, cp.full(B, L - 1, cp.int32), z, tables, cp.asarray(qs), cp.asarray(lens), z, qs, lens,
                        BS, 1, L)


def time_shape(B: int, L: int, bw: float) -> None:
    """Print the rows of one (batch, context) shape."""
    with stream:
        batch = decode_batch(B, L)
        index_cache, latents = randn((B * (L // BS), BS, DI)), randn((B * (L // BS), BS, R + P))
        q, w, ql, qp = randn((B, HI, DI)), randn((B, HI), np.float32), randn((B, H, R)), randn((B, H, P))
        sel = {n: m.glm52_indexer_topk(q, w, index_cache, batch, TOPK, DI ** -0.5) for n, m in IMPLS}
        att = {n: m.glm52_sparse_mla_attention(ql, qp, latents, sel["nvrtc"], batch, 0.0625) for n, m in IMPLS}
        stream.synchronize()
    same = float((cp.sort(sel["nvrtc"], 1) == cp.sort(sel["tilelang"], 1)).mean())
    diff = float(cp.abs(att["nvrtc"].astype(cp.float32) - att["tilelang"].astype(cp.float32)).max())

    def attention(m):
        return m.glm52_sparse_mla_attention(ql, qp, latents, sel["nvrtc"], batch, 0.0625)

    def indexer(m):
        return m.glm52_indexer_topk(q, w, index_cache, batch, TOPK, DI ** -0.5)

    def paired():   # the registry's pick on sm_90 ("tilelang+nvrtc"): TileLang scores, the hand-written select
        return tilelang.glm52_indexer_topk_nvrtc_select(q, w, index_cache, batch, TOPK, DI ** -0.5)

    t_paired = bench(paired)
    cases = (("indexer scores + top-k", B * L * DI * 2,
              f"same keys {same:.4f}; TileLang scores + nvrtc select {t_paired:.1f} us", indexer),
             ("sparse MLA attention", B * min(L, TOPK) * (R + P) * 2, f"max |diff| {diff:.2e}", attention))
    best = 0.0   # the sparse layer: indexer + sparse attention, each in its fastest implementation
    for (name, nbytes, agree, call), extra in zip(cases, (t_paired, None)):
        t = {n: bench(lambda: call(m)) for n, m in IMPLS}
        best += min(*t.values(), *([extra] if extra else []))
        floor = nbytes / bw * 1e6
        print(f"{name:<24}{B:>6}{L:>8}{t['nvrtc']:>10.1f}{t['tilelang']:>12.1f}{floor:>10.1f}"
              f"{100 * floor / t['nvrtc']:>9.1f}{100 * floor / t['tilelang']:>11.1f}  {agree}")
    scores_of = {"nvrtc": nvrtc.indexer_scores, "tilelang": tilelang._indexer_scores}
    t_scores = {n: bench(lambda: f(q, w, index_cache, batch, DI ** -0.5)) for n, f in scores_of.items()}
    floor = B * L * DI * 2 / bw * 1e6
    print(f"{'  of which the scores':<24}{B:>6}{L:>8}{t_scores['nvrtc']:>10.1f}{t_scores['tilelang']:>12.1f}"
          f"{floor:>10.1f}{100 * floor / t_scores['nvrtc']:>9.1f}{100 * floor / t_scores['tilelang']:>11.1f}"
          "  (every visible key of the index cache read once)")
    with stream:
        scores, out = randn((B, L), np.float32), cp.empty((B, TOPK), cp.int32)
    t_select = {n: bench(lambda: m.select_topk(scores, batch, out)) for n, m in IMPLS}
    with stream:
        same_select = bool((nvrtc.select_topk(scores, batch, out.copy()) ==
                            tilelang.select_topk(scores, batch, out.copy())).all())
    print(f"{'  of which the top-k':<24}{B:>6}{L:>8}{t_select['nvrtc']:>10.1f}{t_select['tilelang']:>12.1f}"
          f"   (the select alone; the two select the same keys: {same_select})")
    sweep = []
    for ranks in SELECT_RANKS:   # the hand-written select's CTAs a row (select_ranks picks one per shape), replayed
        nvrtc.select_ranks = lambda *_, r=ranks: r
        sweep.append(f"{ranks}: {1e3 * graph_ms(lambda: nvrtc.select_topk(scores, batch, out), calls=20):.1f}")
    nvrtc.select_ranks = select_ranks
    print(f"{'  nvrtc top-k by ranks':<24}{B:>6}{L:>8}  {', '.join(sweep)} us in CUDA-graph replays "
          f"(picked: {select_ranks(B, L, nvrtc.sm_count())})")
    dense = bench(lambda: mla_attention(ql, qp, latents, batch, 0.0625))   # the core's MLA over every key
    floor = B * L * (R + P) * 2 / bw * 1e6
    sparse_floor = (B * L * DI * 2 + B * min(L, TOPK) * (R + P) * 2) / bw * 1e6
    print(f"{'dense MLA attention':<24}{B:>6}{L:>8}{dense:>10.1f}{'':>12}{floor:>10.1f}{100 * floor / dense:>9.1f}"
          f"{'':>11}  sparse layer (indexer + attention, fastest of each) {best:.1f} us: {dense / best:.1f}x faster "
          f"than dense, {best / sparse_floor:.2f}x its floor ({sparse_floor:.1f} us)")
    sweep = []
    for splits in SPLITS:   # the TileLang attention's split count (splits_for: one per SPLIT_KEYS keys), replayed
        tilelang.splits_for = lambda *_, s=splits: s
        sweep.append(f"{splits}: {1e3 * graph_ms(lambda: attention(tilelang), calls=10):.1f}")
    tilelang.splits_for = splits_for
    print(f"{'  tilelang MLA by splits':<24}{B:>6}{L:>8}  {', '.join(sweep)} us in CUDA-graph replays "
          f"(picked: {splits_for(TOPK)})")
    # As a decode step runs them: replays of a CUDA graph, no host launch cost between the kernels
    g_index, g_att = 1e3 * graph_ms(paired, calls=10), 1e3 * graph_ms(lambda: attention(tilelang), calls=10)
    g_dense = 1e3 * graph_ms(lambda: mla_attention(ql, qp, latents, batch, 0.0625), calls=10)
    print(f"{'  in CUDA graphs':<24}{B:>6}{L:>8}  indexer (TileLang scores + nvrtc select) {g_index:.1f} us, "
          f"TileLang sparse attention {g_att:.1f} us, dense MLA {g_dense:.1f} us: sparse layer "
          f"{g_index + g_att:.1f} us, {g_dense / (g_index + g_att):.1f}x faster than dense, "
          f"{(g_index + g_att) / sparse_floor:.2f}x its floor")


def main() -> None:
    print(cp.cuda.runtime.getDeviceProperties(cp.cuda.Device().id)["name"].decode())
    bw = copy_bandwidth()
    print(f"device copy bandwidth {bw / 1e9:.0f} GB/s (read + write); floor = bytes to read / that")
    print(f"{'op':<24}{'batch':>6}{'context':>8}{'nvrtc us':>10}{'tilelang us':>12}{'floor us':>10}"
          f"{'nvrtc %':>9}{'tilelang %':>11}  agreement")
    for B, L in SHAPES:
        time_shape(B, L, bw)
        cp.get_default_memory_pool().free_all_blocks()


if __name__ == "__main__":
    main()
