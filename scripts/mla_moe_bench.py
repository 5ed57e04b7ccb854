"""MLA and MoE kernel microbenchmark on one GPU at DeepSeek-V2-Lite's shapes (16 heads, latent 512 + 64, hidden 2048,
64 experts top-6 of width 1408; bf16, block size 64), each op as the engine runs it: CALLS calls captured into one
CUDA graph, the replay timed with CUDA events (openinfer.testing.cuda.graph_ms), random inputs.

- mla decode: one layer's mla_attention for batch x context, its grid sized for --max-model-len (the CUDA graphs'
  sizing). GB/s counts the latent rows a step must read (batch x context x 576 x 2 bytes) over its time.
- mla prefill: one layer's mla_attention over a prompt of T tokens (causal, absorbed: 2 x 16 x T^2 / 2 x (576 + 512)
  FLOPs). TFLOP/s over its time.
- mla layer: one layer's prefill attention (o_proj aside) over `run` new tokens of a `context`-token sequence, in
  both forms, timed eagerly with CUDA events (the expanded form uploads its context layout, which a graph cannot
  capture): absorbed = W_UK, mla_attention, W_UV; expanded = the latents gathered, kv_b_proj, Q/K/V packed at head dim
  256, paged_attention's prefill (layers/mla_expanded.py). TFLOP/s counts the useful expanded attention
  (2 x 16 x keys seen x (192 + 128)) over each form's time, so the two rates compare directly. A run whose context
  outgrows its own tokens expands its heads in passes (heads_per_pass); where not one head fits, the engine runs the
  absorbed form and the expanded row says so.
- moe decode / prefill: moe_router + moe_experts of one layer for T tokens. GB/s counts the distinct
  experts the routing selects (3 x 2048 x 1408 x 2 bytes each) over its time; TFLOP/s the routed GEMMs
  (T x 6 x 3 x 2048 x 1408 x 2).
- experts (--experts: this section alone): moe_experts of one layer for T prefill tokens in each CUDA implementation
  (the registry's "grouped": moe.py's grouped GEMMs on mma.sync; "wgmma" on sm_90: their 128-row tiles on warpgroup
  MMA; "cublas" forced: moe_blas.py's cuBLAS per expert), timed
  eagerly with CUDA events as a prefill step runs them (the cuBLAS path reads the routing to the host, so no graph);
  the routing is the random gate's, computed once. TFLOP/s counts the routed GEMMs (T x 6 x 3 x 2048 x 1408 x 2),
  GB/s the chosen experts' weights (each read at least once) over the time;
  `rule` names the implementation the "cublas" entry point picks at that T (moe_blas.uses_cublas); the
  `its gemms` row times the cuBLAS path's GEMMs alone (one gate_up and one down an expert).
Compare GB/s with the device's copy rate (~3.35 TB/s H100, ~4.3 TB/s H200) and TFLOP/s with ~700 (bf16 dense).
    python scripts/mla_moe_bench.py [--batches 1,32,128] [--contexts 1024,8192] [--prompts 1024,8192]
                                    [--layer-runs 1024@1024,16384@16384,4096@16384,2048@16384]
                                    [--tokens 1,8,32,512,2048] [--max-model-len 16384]
                                    [--experts] [--expert-tokens 1024,8192,16384]
"""
from __future__ import annotations

import argparse
import dataclasses

import cupy as cp
import numpy as np

from types import SimpleNamespace

from openinfer.engine.batch import ForwardBatch
from openinfer.kernels.cuda import attention, blas, mla, module, moe, moe_blas
from openinfer.kernels.cuda.module import BF16
from openinfer.layers.mla import MLADims
from openinfer.layers.mla_expanded import expanded_attention
from openinfer.layers.moe import RouterConfig
from openinfer.testing.cuda import graph_ms

H, R, P, D, E, K, I, BS = 16, 512, 64, 2048, 64, 6, 1408, 64
DN = DV = 128
CALLS = 10


def _normal(*shape, scale: float = 1.0) -> cp.ndarray:
    return (cp.random.standard_normal(shape, dtype=cp.float32) * scale).astype(BF16)


def mla_inputs(batch: int, context: int, run: int, rng: np.random.Generator):
    """q_latent, q_pe, a latent cache and a batch of `batch` sequences of `context` keys, the last `run` new."""
    per = -(-context // BS)
    tables = (1 + rng.permutation(batch * per).astype(np.int32)).reshape(batch, per)
    cache = _normal(batch * per + 1, BS, R + P)
    qs = np.arange(batch + 1, dtype=np.int32) * run
    lens = np.full(batch, context, np.int32)
    T = batch * run
    fb = ForwardBatch(
        token_ids=cp.zeros(T, cp.int32), positions=cp.zeros(T, cp.int32), slot_mapping=cp.zeros(T, cp.int64),
        block_tables=cp.asarray(tables), query_start=cp.asarray(qs), context_lens=cp.asarray(lens),
        sample_rows=cp.zeros(batch, cp.int32), query_start_host=qs, context_lens_host=lens, block_size=BS,
        max_query_len=run, max_context_len=context)
    return _normal(T, H, R), _normal(T, H, P), cache, fb


def event_ms(fn, repeats: int = 5) -> float:
    """Median ms of one eager fn() between CUDA events, after a warm-up call."""
    fn()
    times = []
    for _ in range(repeats):
        start, end = cp.cuda.Event(), cp.cuda.Event()
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(cp.cuda.get_elapsed_time(start, end))
    return float(np.median(times))


def mla_layer_ms(run: int, context: int, rng: np.random.Generator) -> tuple[float, float | None]:
    """(absorbed, expanded) ms of one layer's attention for a run of `run` tokens ending a `context`-token sequence;
    expanded None where the step would not expand (the absorbed form runs)."""
    _, q_pe, cache, fb = mla_inputs(1, context, run, rng)
    q_nope = _normal(run, H, DN)
    kv_b = _normal(H * (DN + DV), R, scale=R ** -0.5)
    w_uk_t = cp.ascontiguousarray(kv_b.reshape(H, DN + DV, R)[:, :DN].transpose(0, 2, 1))
    w_uv = kv_b.reshape(H, DN + DV, R)[:, DN:]
    scale = (DN + P) ** -0.5
    ops = SimpleNamespace(linear=blas.linear, paged_attention=attention.paged_attention,
                          mla_gather_latent=mla.mla_gather_latent, mla_pack_heads=mla.mla_pack_heads)
    dims = MLADims(D, H, None, R, DN, P, DV)

    def absorbed():
        return blas.per_head_linear(mla.mla_attention(blas.per_head_linear(q_nope, w_uk_t), q_pe, cache, fb, scale),
                                    w_uv)

    def expanded():
        return expanded_attention(ops, dims, q_nope, q_pe, cache, kv_b, fb, scale, run)
    return event_ms(absorbed), None if expanded() is None else event_ms(expanded)


def expert_rows(tokens: list[int]) -> None:
    """The experts section: both implementations of moe_experts at each prefill size."""
    gate = cp.random.standard_normal((E, D), dtype=cp.float32) * D ** -0.5
    gate_up, down = _normal(E, 2 * I, D, scale=D ** -0.5), _normal(E, D, I, scale=I ** -0.5)
    impls = {"grouped": moe.moe_experts, "cublas": moe_blas.moe_experts_cublas}
    if module.hopper():
        impls["wgmma"] = moe.moe_experts_wgmma
    print(f"{'experts':12} {'tokens':>6} {'rows/e':>8} {'us':>9} {'TFLOP/s':>8} {'GB/s':>8} {'rule':>8}")
    for t in tokens:
        x = _normal(t, D)
        ids, w = moe.moe_router(x, gate, None, RouterConfig(top_k=K))
        rule = "cublas" if moe_blas.uses_cublas(t, K, E) else "wgmma" if module.hopper() else "grouped"
        flops = t * K * 3 * D * I * 2
        weights = len(np.unique(cp.asnumpy(ids))) * 3 * D * I * 2   # the chosen experts' bytes, read at least once
        for name, fn in [*impls.items(), ("  its gemms", cublas_gemms(gate_up, down, ids))]:
            ms = event_ms(fn if name == "  its gemms" else lambda: fn(x, gate_up, down, ids, w, 0))
            print(f"{name:12} {t:>6} {t * K / E:>8.0f} {ms * 1e3:>9.0f} {flops / ms / 1e9:>8.1f} "
                  f"{weights / ms / 1e6:>8.0f} {rule if name == 'grouped' else '':>8}")


def cublas_gemms(gate_up: cp.ndarray, down: cp.ndarray, ids: cp.ndarray):
    """The cuBLAS path's two GEMMs an expert alone, on buffers of the routing's sorted rows (no align, host read,
    gather, SwiGLU or combine): how much of its time the GEMMs take."""
    counts = np.bincount(cp.asnumpy(ids).ravel(), minlength=E)
    ends = np.cumsum(counts).tolist()
    groups = [(e, end - c, end) for e, (c, end) in enumerate(zip(counts.tolist(), ends)) if c]
    n = ends[-1]
    xs, h = _normal(n, D), _normal(n, I)
    gu, ys = cp.empty((n, 2 * I), dtype=BF16), cp.empty((n, D), dtype=cp.float32)
    return lambda: (blas.grouped_gemm(xs, gate_up, gu, groups), blas.grouped_gemm(h, down, ys, groups))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--batches", default="1,32,128")
    ap.add_argument("--contexts", default="1024,8192")
    ap.add_argument("--prompts", default="1024,8192")
    ap.add_argument("--layer-runs", default="1024@1024,16384@16384,4096@16384,2048@16384",
                    help="RUN@CONTEXT pairs for the mla layer rows: a prefill chunk of RUN tokens ending at CONTEXT")
    ap.add_argument("--tokens", default="1,8,32,512,2048")
    ap.add_argument("--max-model-len", type=int, default=16384)
    ap.add_argument("--experts", action="store_true", help="only the experts section: both moe_experts implementations")
    ap.add_argument("--expert-tokens", default="1024,8192,16384")
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    scale = (128 + P) ** -0.5
    print(f"{cp.cuda.runtime.getDeviceProperties(0)['name'].decode()}; V2-Lite shapes, bf16, {CALLS} calls a graph "
          "(experts: eager)")
    if args.experts:
        expert_rows([int(t) for t in args.expert_tokens.split(",")])
        return
    print(f"{'op':12} {'batch':>6} {'context':>8} {'ms':>9} {'GB/s':>8} {'TFLOP/s':>8}")
    for b in map(int, args.batches.split(",")):
        for ctx in map(int, args.contexts.split(",")):
            ql, qp, cache, fb = mla_inputs(b, ctx, 1, rng)
            fb = dataclasses.replace(fb, max_context_len=args.max_model_len)
            ms = graph_ms(lambda: mla.mla_attention(ql, qp, cache, fb, scale), calls=CALLS)
            print(f"{'mla decode':12} {b:>6} {ctx:>8} {ms:>9.4f} {b * ctx * (R + P) * 2 / ms / 1e6:>8.0f} {'':>8}")
    for t in map(int, args.prompts.split(",")):
        ql, qp, cache, fb = mla_inputs(1, t, t, rng)
        ms = graph_ms(lambda: mla.mla_attention(ql, qp, cache, fb, scale), calls=CALLS)
        flops = 2 * H * t * t / 2 * (R + P + R)
        print(f"{'mla prefill':12} {1:>6} {t:>8} {ms:>9.4f} {'':>8} {flops / ms / 1e9:>8.1f}")
    for spec in args.layer_runs.split(","):
        run, ctx = map(int, spec.split("@"))
        seen = run * ctx - run * (run - 1) / 2   # keys the run's queries see
        flops = 2 * H * seen * (DN + P + DV)
        for form, ms in zip(("absorbed", "expanded"), mla_layer_ms(run, ctx, rng)):
            if ms is None:
                print(f"{'mla layer':12} {run:>6} {ctx:>8} {'absorbed':>9} {form:>8}")
            else:
                print(f"{'mla layer':12} {run:>6} {ctx:>8} {ms:>9.4f} {form:>8} {flops / ms / 1e9:>8.1f}")
    gate = cp.random.standard_normal((E, D), dtype=cp.float32) * D ** -0.5
    gate_up, down = _normal(E, 2 * I, D, scale=D ** -0.5), _normal(E, D, I, scale=I ** -0.5)
    cfg = RouterConfig(top_k=K)
    for t in map(int, args.tokens.split(",")):
        x = _normal(t, D)

        def layer():
            ids, w = moe.moe_router(x, gate, None, cfg)
            return moe_blas.moe_experts(x, gate_up, down, ids, w, 0)
        ms = graph_ms(layer, calls=CALLS)
        ids, _ = moe.moe_router(x, gate, None, cfg)
        experts = len(np.unique(cp.asnumpy(ids)))
        gbs = experts * 3 * D * I * 2 / ms / 1e6
        flops = t * K * 3 * D * I * 2
        print(f"{'moe':12} {t:>6} {'':>8} {ms:>9.4f} {gbs:>8.0f} {flops / ms / 1e9:>8.1f}")
    expert_rows([int(t) for t in args.expert_tokens.split(",")])


if __name__ == "__main__":
    main()
