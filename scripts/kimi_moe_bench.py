"""Kimi-K2's quantized weight paths at the real width on one GPU, against their bytes-moved floor, and the page rows of
a reduced-depth engine run.

    python scripts/kimi_moe_bench.py ops [--tokens 1,8,32,64,128] [--prefill 1024,8192] [--json OUT.json]
    python scripts/kimi_moe_bench.py page --ops OUT.json --latency LAT.json --preset kimi-k2-thinking --num-layers N

`ops` times quant.cu as the engine runs it (random weights and routing, bf16 activations):
- experts: moe_experts_quant for T tokens, hidden 7168, 384 experts top-8 of width 2048, on INT4 stacks
  (Kimi-K2-Thinking: packed words + bf16 scales per 32 weights) and FP8 stacks (Kimi-K2-Instruct: e4m3 bytes +
  float32 row scales per 128). CALLS calls with routing of their own go into one CUDA graph (no call finds the
  previous one's experts in L2), whose replays are timed with CUDA events. The floor is the bytes of the distinct
  experts the calls' routing selects (each read once) over the copy bandwidth; "% floor" is floor / time.
  The per-kernel rows time the same calls eagerly between CUDA events, each kernel against its own bytes.
- experts (prefill): moe_experts_quant for a prefill of T tokens (one routing, one call a graph), on the path it picks
  (quant.expert_tile_rows: the tensor-core GEMM from 16 pairs an expert on average), then each path forced over the
  same routing ("gemv": quant.cu's GEMV kernels in MOE_CHUNK passes; "mma m2" / "mma m8": the GEMM in 32- / 128-row
  tiles in MMA_CHUNK passes), so the crossover can be read off; the picked path's kernels are timed one by one too.
  A summary line gives each prefill's µs and TFLOP/s (2 * T * top-8 * 3 * 7168 * 2048 FLOPs, the real products only).
- linear: FP8 q_gemv (decode rows) and the dequantize + GEMM path (more rows) at Kimi-K2-Instruct's Linear shapes.
The copy bandwidth is measured here: bytes read + written per second by a 1 GiB device-to-device copy.

`page` prints the Markdown rows of a reduced-depth `openinfer bench latency` run: each batch's decode step against the
floor of the weights a step reads (every weight but the embedding and the routed experts, plus the experts the
batch's tokens select: top-k per MoE layer at batch 1; at larger batches the expected number of distinct experts under
uniform routing, said so) and the KV cache of its context, over the copy bandwidth of the `ops` run.
"""
from __future__ import annotations

import argparse
import json
import time
from collections import defaultdict
from pathlib import Path
from typing import Any, Callable

import numpy as np

D, I, E, K = 7168, 2048, 384, 8          # hidden, expert width, routed experts, experts per token
INT4_BYTES = 0.5 + 2 / 32                # per weight: a nibble and a bf16 scale per 32
FP8_BYTES = 1 + 4 / 128                  # per weight: a byte and a float32 scale per 128 (per row)
CALLS = 8
FP8_LINEARS = {"q_a+kv_a": (2112, 7168), "q_b": (12288, 1536), "o_proj": (7168, 8192),
               "shared gate_up": (4096, 7168), "shared down": (7168, 2048), "dense gate_up": (36864, 7168),
               "dense down": (7168, 18432)}


def expert_bytes(per_weight: float) -> dict[str, float]:
    """Bytes of one expert's gate_up and down stacks in a format."""
    return {"gate_up": 2 * I * D * per_weight, "down": D * I * per_weight}


# ---- ops (GPU) ----

def stacks(cp: Any, fmt: str) -> tuple[Any, Any]:
    """Random expert stacks at the real shapes (no zeros: the dequantized weights have the dummies' spread)."""
    from openinfer.kernels.cuda.module import BF16
    from openinfer.quant import Fp8Weight, Int4Weight
    from openinfer.quant.dummy import FP8_SCALE, INT4_SCALE
    from openinfer.quant.int4 import tiled_shapes

    def one(rows: int, cols: int) -> Any:
        if fmt == "int4":
            words, scales = tiled_shapes(rows, cols)   # the staged tiles
            packed = random_words(cp, (E, *words)).view(cp.int32)
            return Int4Weight(packed, cp.full((E, *scales), INT4_SCALE, cp.float32).astype(BF16), tiled=True)
        return Fp8Weight(fp8_bytes(cp, (E, rows, cols)), cp.full((E, rows, -(-cols // 128)), FP8_SCALE, cp.float32))
    return one(2 * I, D), one(D, I)


def random_words(cp: Any, shape: tuple[int, ...]) -> Any:
    """Uniform random 32-bit words (drawn as such: no wider temporary)."""
    return cp.random.randint(0, 2**32, shape, dtype=cp.uint32)


def fp8_bytes(cp: Any, shape: tuple[int, ...]) -> Any:
    """Random e4m3 bytes of both signs with exponent bit 3 clear (finite, below 2 in magnitude: no NaN), drawn one
    matrix at a time (a draw of billions of words at once is more than one generator call takes)."""
    out = cp.empty(shape, cp.uint8)
    for part in out.reshape(-1, shape[-2] * shape[-1]):
        n = part.size
        part[...] = random_words(cp, (-(-n // 4),)).view(cp.uint8)[:n] & 0xBF
    return out


def routings(cp: Any, rng: np.random.Generator, T: int, n: int) -> list[tuple[Any, Any, int]]:
    """n routings of T tokens: top-8 of 384 distinct per token, uniform; (ids, weights, distinct experts)."""
    out = []
    for _ in range(n):
        ids = np.argsort(rng.random((T, E)), axis=1)[:, :K].astype(np.int32)
        w = rng.random((T, K)).astype(np.float32)
        out.append((cp.asarray(ids), cp.asarray(w), len(np.unique(ids))))
    return out


def forced_path(cp: Any, quant: Any, fmt: str, mt: int, x: Any, gate_up: Any, down: Any, ids: Any, w: Any) -> Any:
    """The routed experts on one path whatever moe_experts_quant would pick: quant.cu's GEMV kernels (mt 0) in
    MOE_CHUNK passes, or the tensor-core GEMM in row tiles of 16 * mt in MMA_CHUNK passes."""
    from openinfer.kernels.cuda.module import NULL
    T = x.shape[0]
    y = cp.empty_like(x)
    chunk = quant.MMA_CHUNK if mt else quant.MOE_CHUNK
    for t0 in range(0, T, chunk):
        part = slice(t0, min(T, t0 + chunk))
        args = (x[part], gate_up, down, ids[part], w[part], 0, NULL, y[part])
        if mt:
            quant.moe_chunk_mma(fmt, mt, *args)
        else:
            quant.moe_chunk_gemv(fmt, *args)
    return y


def per_kernel_ms(cp: Any, quant: Any, calls: list[Callable[[], Any]]) -> dict[str, float]:
    """Mean ms of each kernel over the calls, run eagerly with CUDA events around every launch (quant.py's launches
    and those it makes through moe.py: moe_align)."""
    from openinfer.kernels.cuda import moe
    marks, real = [], quant.launch

    def timed(source, name, *args, **kwargs):
        start, end = cp.cuda.Event(), cp.cuda.Event()
        start.record()
        real(source, name, *args, **kwargs)
        end.record()
        marks.append((name, start, end))
    for fn in calls:   # warm: the kernels are loaded
        fn()
    quant.launch = moe.launch = timed
    try:
        for fn in calls:
            fn()
    finally:
        quant.launch = moe.launch = real
    cp.cuda.Device().synchronize()
    total: dict[str, float] = defaultdict(float)
    for name, start, end in marks:
        total[name] += cp.cuda.get_elapsed_time(start, end) / len(calls)
    return dict(total)


def run_ops(args: argparse.Namespace) -> None:
    import cupy as cp

    from openinfer.kernels.cuda import quant
    from openinfer.kernels.cuda.module import BF16
    from openinfer.quant import Fp8Weight
    from openinfer.quant.dummy import FP8_SCALE
    from openinfer.testing.cuda import copy_bandwidth, graph_ms

    rng = np.random.default_rng(0)
    name = cp.cuda.runtime.getDeviceProperties(0)["name"].decode()
    bw = copy_bandwidth()
    print(f"{name}; copy bandwidth {bw / 1e9:.0f} GB/s (1 GiB device-to-device copy, read + write); "
          f"floor = bytes to read / that")
    rows: list[dict[str, Any]] = []
    summary: list[str] = []

    def row(op: str, fmt: str, T: int, ms: float, nbytes: float, experts: float | None = None, flops: float = 0.0):
        floor_ms = nbytes / bw * 1e3
        r = {"op": op, "fmt": fmt, "tokens": T, "experts": experts, "ms": ms, "bytes": nbytes,
             "gb_s": nbytes / ms / 1e6, "floor_ms": floor_ms, "pct_floor": 100 * floor_ms / ms,
             "tflop_s": flops / ms / 1e9}
        rows.append(r)
        ex = "" if experts is None else f"{experts:.1f}"
        print(f"{op:26} {fmt:5} {T:>6} {ex:>8} {ms:>9.4f} {r['gb_s']:>8.0f} {floor_ms:>9.4f} {r['pct_floor']:>7.1f}"
              f" {r['tflop_s']:>8.1f}", flush=True)
    print(f"{'op':26} {'fmt':5} {'tokens':>6} {'experts':>8} {'ms':>9} {'GB/s':>8} {'floor ms':>9} {'% floor':>7}"
          f" {'TFLOP/s':>8}")
    for fmt, per_weight in (("int4", INT4_BYTES), ("fp8", FP8_BYTES)):
        t0 = time.perf_counter()
        gate_up, down = stacks(cp, fmt)
        cp.cuda.Device().synchronize()
        print(f"# {fmt} stacks: {(gate_up.shape[0] * 3 * D * I * per_weight) / 1e9:.1f} GB drawn in "
              f"{time.perf_counter() - t0:.1f} s", flush=True)
        eb = expert_bytes(per_weight)
        for T in args.tokens:
            x = (cp.random.standard_normal((T, D), dtype=cp.float32) * 0.5).astype(BF16)
            routes = routings(cp, rng, T, CALLS)
            turn = iter(range(1 << 30))

            def call() -> Any:
                ids, w, _ = routes[next(turn) % CALLS]
                return quant.moe_experts_quant(x, gate_up, down, ids, w, 0)
            ms = graph_ms(call, calls=CALLS)
            experts = float(np.mean([n for _, _, n in routes]))
            row("experts", fmt, T, ms, experts * sum(eb.values()), experts, T * K * 3 * D * I * 2)
            kernels = per_kernel_ms(cp, quant, [lambda r=r: quant.moe_experts_quant(x, gate_up, down, r[0], r[1], 0)
                                                for r in routes])
            for kname, kms in kernels.items():
                part = "gate_up" if "gate_up" in kname else "down" if "down" in kname else None
                row(f"  {kname}", fmt, T, kms, experts * eb[part] if part else 0.0, experts)
        for T in args.prefill:
            x = (cp.random.standard_normal((T, D), dtype=cp.float32) * 0.5).astype(BF16)
            (ids, w, n), = routings(cp, rng, T, 1)
            flops, nbytes = T * K * 3 * D * I * 2, n * sum(eb.values())
            picked = quant.expert_tile_rows(BF16, min(T, quant.MMA_CHUNK), K, E, D, I) // 16
            ms = graph_ms(lambda: quant.moe_experts_quant(x, gate_up, down, ids, w, 0), repeats=3)
            row("experts (prefill)", fmt, T, ms, nbytes, n, flops)
            summary.append(f"prefill {fmt} {T:>5} tokens: {ms * 1e3:9.0f} µs {flops / ms / 1e9:7.1f} TFLOP/s "
                           f"({f'mma m{picked}' if picked else 'gemv'}, picked)")
            for mt in args.prefill_paths:
                fms = graph_ms(lambda: forced_path(cp, quant, fmt, mt, x, gate_up, down, ids, w), repeats=3)
                path = f"mma m{mt}" if mt else "gemv"
                row(f"  {path}", fmt, T, fms, nbytes, n, flops)
                summary.append(f"prefill {fmt} {T:>5} tokens: {fms * 1e3:9.0f} µs {flops / fms / 1e9:7.1f} TFLOP/s "
                               f"({path}, forced)")
            kernels = per_kernel_ms(cp, quant, [lambda: quant.moe_experts_quant(x, gate_up, down, ids, w, 0)])
            for kname, kms in kernels.items():
                part = "gate_up" if "gate_up" in kname else "down" if "down" in kname else None
                row(f"  {kname}", fmt, T, kms, n * eb[part] if part else 0.0, n)
        gate_up = down = None   # freed before the next format is drawn
        cp.get_default_memory_pool().free_all_blocks()
    for lname, (N, Kin) in FP8_LINEARS.items():
        w = Fp8Weight(fp8_bytes(cp, (N, Kin)), cp.full((N, -(-Kin // 128)), FP8_SCALE, cp.float32))
        for M in args.linear_rows:
            x = (cp.random.standard_normal((M, Kin), dtype=cp.float32) * 0.5).astype(BF16)
            ms = graph_ms(lambda: quant.linear_quant(x, w), calls=CALLS)
            row(f"linear {lname} {N}x{Kin}", "fp8", M, ms, N * Kin * FP8_BYTES, None, 2 * M * N * Kin)
    print("\n".join(["", f"# routed experts at prefill ({name})", *summary]))
    if args.json:
        args.json.write_text(json.dumps({"device": name, "copy_bytes_per_s": bw, "rows": rows}, indent=1))


# ---- page (CPU) ----

def expected_distinct(batch: int, experts: int, top_k: int) -> float:
    """Distinct experts that `batch` tokens select under uniform top-k routing."""
    return experts * (1 - (1 - top_k / experts) ** batch)


def step_floor_bytes(preset: str, num_layers: int, batch: int, context: int) -> tuple[float, float, bool]:
    """(bytes a decode step reads, routed experts per MoE layer, whether that count is exact) at `num_layers`."""
    from openinfer.testing import get_plugins, with_num_layers
    from openinfer.quant.dummy import quantized_kind
    line, config = get_plugins().preset(preset)
    cfg = line.parse_config(with_num_layers(config, num_layers))
    shapes = line.weight_shapes(cfg)
    size = {"I32": 4, "BF16": 2, "F8_E4M3": 1, "F32": 4}
    dense, per_expert, moe_layers = 0.0, 0.0, set()
    for n, s in shapes.items():
        kind = quantized_kind(n, shapes) or "BF16"   # float tensors are bf16 on the device
        nbytes = float(np.prod(s)) * size[kind]
        if ".mlp.experts." in n:
            moe_layers.add(n.split(".layers.")[1].split(".")[0])
            per_expert += nbytes if ".experts.0." in n else 0.0   # expert 0 of every MoE layer
        elif "embed_tokens" not in n:
            dense += nbytes
    per_expert /= max(1, len(moe_layers))
    top_k, n = cfg.model.router.top_k, cfg.model.n_routed_experts
    experts = float(top_k) if batch == 1 else expected_distinct(batch, n, top_k)
    m = cfg.model.mla
    kv = batch * context * (m.kv_lora_rank + m.qk_rope_head_dim) * 2 * num_layers
    return dense + len(moe_layers) * experts * per_expert + kv, experts, batch == 1


def run_page(args: argparse.Namespace) -> None:
    ops = json.loads(args.ops.read_text())
    lat = json.loads(args.latency.read_text())
    bw = ops["copy_bytes_per_s"]
    print(f"Device: {ops['device']}; copy bandwidth {bw / 1e9:.0f} GB/s (read + write, 1 GiB device-to-device copy).")
    print(f"Model: {args.preset} at {args.num_layers} layers (the real width, dummy weights), bf16 activations, "
          "CUDA graphs.\n")
    print("| batch | context | decode step ms | tokens/s | floor ms | % of floor | routed experts per MoE layer |")
    print("|---:|---:|---:|---:|---:|---:|---|")
    for p in lat["points"]:
        b, ctx = p["batch_size"], p["input_len"] + p["output_len"] // 2
        nbytes, experts, exact = step_floor_bytes(args.preset, args.num_layers, b, ctx)
        floor_ms = nbytes / bw * 1e3
        step = p["median_decode_step_ms"]
        note = f"{experts:.0f}" if exact else f"~{experts:.0f} (uniform routing)"
        print(f"| {b} | {p['input_len']} | {step:.2f} | {p['decode_tokens_per_s']:.0f} | {floor_ms:.2f} | "
              f"{100 * floor_ms / step:.0f} | {note} |")
    print(f"\nPrefill ({args.num_layers} layers):")
    for p in lat["points"]:
        print(f"- batch {p['batch_size']} x {p['input_len']} tokens: {p['median_prefill_ms']:.0f} ms "
              f"({p['prefill_tokens_per_s']:.0f} tokens/s)")
    print("\nRouted experts alone (moe_experts_quant, CUDA graph of several calls with routing of their own):\n")
    print("| format | tokens | distinct experts | ms | GB/s | floor ms | % of floor |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for r in ops["rows"]:
        if r["op"] == "experts":
            print(f"| {r['fmt']} | {r['tokens']} | {r['experts']:.1f} | {r['ms']:.3f} | {r['gb_s']:.0f} | "
                  f"{r['floor_ms']:.3f} | {r['pct_floor']:.0f} |")


def _ints(text: str) -> list[int]:
    return [int(t) for t in text.split(",") if t.strip()]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    o = sub.add_parser("ops", help="time the quantized expert and linear paths on the GPU")
    o.add_argument("--tokens", type=_ints, default=[1, 8, 32, 64, 128])
    o.add_argument("--prefill", type=_ints, default=[1024, 8192], help="token counts of a prefill (empty: none)")
    o.add_argument("--prefill-paths", type=_ints, default=[0, 2, 8],
                   help="expert paths forced at each prefill size as well: 0 the GEMV kernels, 2 / 8 the tensor-core "
                        "GEMM's 32- / 128-row tiles (empty: only the picked path)")
    o.add_argument("--linear-rows", type=_ints, default=[1, 16, 32])
    o.add_argument("--json", type=Path, default=None)
    o.set_defaults(func=run_ops)
    p = sub.add_parser("page", help="Markdown rows from an ops JSON and a bench latency JSON")
    p.add_argument("--ops", type=Path, required=True)
    p.add_argument("--latency", type=Path, required=True)
    p.add_argument("--preset", default="kimi-k2-thinking")
    p.add_argument("--num-layers", type=int, required=True)
    p.set_defaults(func=run_page)
    args = ap.parse_args()
    args.func(args)


if __name__ == "__main__":
    main()
