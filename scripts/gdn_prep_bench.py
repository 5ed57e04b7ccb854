"""Where gdn_chunk_prep spends its time (GPU only): the prefill's per-chunk kernel of Qwen3.5's gated delta rule
(plugins/qwen35/.../delta_rule.cu) at the Qwen3.5-4B shape (16 key / 32 value heads, dk = dv = 128), one 1k-token
run, timed as CUDA-graph replays, for the source in the tree and any others given, and for ablations of the
tree's source that each skip one phase (their output is wrong; only the time is read):
    no_load   phase 1 reads no q / k from memory (zeros)
    no_AP     phase 2's K K^T and Q K^T products skipped
    no_QgKt   the exp(gamma) Q and tail K rows not written
    no_subst  phase 3's forward substitution skipped (its loads and stores kept)
Then the state walk (gdn_chunk_state) of the tree and of each given source after the tree's prep, timed and compared
(a source from before stop 25 walks in fp32 on the CUDA cores; every walk gets the larger shared memory). The tree's
records are compared bit for bit with the other sources'.
    python scripts/gdn_prep_bench.py [--tokens 1024] [--source base=PATH ...] [--no-ablations]
"""
from __future__ import annotations

import argparse
import shutil
import tempfile
from pathlib import Path

import cupy as cp
import ml_dtypes
import numpy as np

from openinfer.kernels.cuda.module import NULL, launch
from openinfer.testing.cuda import graph_ms
from openinfer_qwen35.cuda import delta_rule as dr

NK, NV, D = 16, 32, 128
OLD_STATE_SMEM = 4 * (3 * dr.CHUNK * dr.DK_MAX + dr.CHUNK * dr.CHUNK + (dr.DK_MAX + dr.CHUNK) * (dr.BV + 1))
ABLATIONS = {   # name: (text of the tree's source, what replaces it)
    "no_load": ("const bool in = t < nc && i < dk;", "const bool in = false;"),
    "no_AP": ("for (int d = 0; d < DK_MAX; d += 4) {\n            float4 qi[4]",
              "for (int d = 0; d < 0; d += 4) {\n            float4 qi[4]"),
    "no_QgKt": ("for (int e = tid; e < L * DK_MAX; e += CH_THREADS) {", "for (int e = tid; e < 0; e += CH_THREADS) {"),
    "no_subst": ("for (int i = 1; i < L; ++i) {\n            float acc[4]",
                 "for (int i = 1; i < 1; ++i) {\n            float acc[4]"),
}


def variant(text: str, folder: Path) -> Path:
    """A copy of delta_rule.cu with `text`, beside the plugin's headers (the core ones come from the core)."""
    folder.mkdir(parents=True, exist_ok=True)
    for header in dr.SOURCE.parent.glob("*.cuh"):
        shutil.copy(header, folder)
    path = folder / "delta_rule.cu"
    path.write_text(text)
    return path


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", type=int, default=1024)
    ap.add_argument("--source", action="append", default=[], help="NAME=PATH of another delta_rule.cu")
    ap.add_argument("--no-ablations", action="store_true")
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="gdn_prep_"))
    tree = dr.SOURCE.read_text()
    sources = {"tree": dr.SOURCE}
    for item in args.source:
        name, path = item.split("=", 1)
        sources[name] = variant(Path(path).read_text(), tmp / name)
    if not args.no_ablations:
        for name, (old, new) in ABLATIONS.items():
            assert tree.count(old) == 1, f"{name}: the tree's source changed; update ABLATIONS"
            sources[name] = variant(tree.replace(old, new), tmp / name)

    T = args.tokens
    rng = np.random.default_rng(0)
    bf = np.dtype(ml_dtypes.bfloat16)
    q, k = (cp.asarray(rng.standard_normal((T, NK, D)).astype(bf)) for _ in range(2))
    v = cp.asarray(rng.standard_normal((T, NV, D)).astype(bf))
    g = cp.asarray(-np.abs(rng.standard_normal((T, NV))).astype(np.float32) * 0.1)
    beta = cp.asarray(rng.uniform(0, 1, (T, NV)).astype(np.float32))
    qs = cp.asarray(np.array([0, T], np.int32))
    chunks = -(-T // dr.CHUNK)
    scratch = cp.zeros((T // dr.CHUNK + 1) * NV * dr.record_floats(D), dtype=cp.float32)
    prep_args = (q, np.int64(NK * D), k, np.int64(NK * D), v, np.int64(NV * D), g, beta, qs, NULL, scratch,
                 np.int32(NK), np.int32(NV), np.int32(D), np.int32(D))
    print(f"{cp.cuda.runtime.getDeviceProperties(0)['name'].decode()}; gdn_chunk_prep_bf16, {T} tokens, grid "
          f"({chunks}, {NV}, 1) x {dr.CHUNK_THREADS}")
    given = {"tree", *(item.split("=", 1)[0] for item in args.source)}
    records = {}
    for name, path in sources.items():
        def run(path=path):
            launch(path, "gdn_chunk_prep_bf16", (chunks, NV, 1), dr.CHUNK_THREADS, prep_args, dr.PREP_SMEM)
        ms = graph_ms(run, repeats=20, calls=10)
        scratch.fill(0)
        run()
        records[name] = cp.asnumpy(scratch)
        bits = ""
        if name in given and name != "tree":
            bits = " records: " + ("the same bits as tree's" if np.array_equal(records[name], records["tree"])
                                   else "differ from tree's")
        print(f"  {name:<10} {1e3 * ms:8.1f} us{bits}")
    run_state(prep_args, scratch, chunks, T, {name: sources[name] for name in sources if name in given})


def run_state(prep_args: tuple, scratch: cp.ndarray, chunks: int, T: int, sources: dict[str, Path]) -> None:
    """The state walk (gdn_chunk_state) of each given source after the tree's prep, timed, and each one's output and
    state against the tree's (from the same zero state): e.g. an older tree's fp32 walk against the tensor-core one."""
    launch(dr.SOURCE, "gdn_chunk_prep_bf16", (chunks, NV, 1), dr.CHUNK_THREADS, prep_args, dr.PREP_SMEM)
    slots, ctx = cp.zeros(1, cp.int32), cp.asarray(np.array([T], np.int32))
    results = {}
    smem = max(dr.STATE_SMEM, OLD_STATE_SMEM)   # enough for either walk's layout
    for name, path in sources.items():
        state = cp.zeros((1, NV, D, D), dtype=cp.float32)
        out = cp.empty((T, NV, D), dtype=prep_args[4].dtype)
        sargs = (scratch, state, np.int64(NV * D * D), slots, prep_args[8], ctx, NULL, NULL, out, np.int32(NV),
                 np.int32(D), np.int32(D))

        def run(path=path, sargs=sargs):
            launch(path, "gdn_chunk_state_bf16", (D // dr.BV, NV, 1), dr.STATE_THREADS, sargs, smem)
        run()   # once from the zero state
        results[name] = (cp.asnumpy(out).astype(np.float32), cp.asnumpy(state))
        ms = graph_ms(run, repeats=20, calls=10)
        print(f"  gdn_chunk_state_bf16 of {name:<8} {1e3 * ms:8.1f} us")
    o1, s1 = results["tree"]
    for name, (o2, s2) in results.items():
        if name != "tree":
            print(f"  {name} against tree: out max |diff| {np.abs(o2 - o1).max():.3g} "
                  f"(max |out| {np.abs(o1).max():.3g}), state max |diff| {np.abs(s2 - s1).max():.3g} "
                  f"(max |state| {np.abs(s1).max():.3g})")


if __name__ == "__main__":
    main()
