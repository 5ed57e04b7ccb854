"""GLM-5.2 at the real width and reduced depth: the floors of its decode steps and prefills, and the summary table of
two `openinfer bench latency` runs over the same points, sparse (DSA as the model runs it) and dense (the indexer's
top-k raised past the model's length with --hf-overrides, so every layer runs dense MLA over the same cache).
scripts/gpu_glm52_steps.sh runs both and then this script's `summary`.

The floors, from the line's own tensor list (weight_shapes) at the measured depth; float tensors in the compute dtype
(bf16 on CUDA), the router and the indexer's weights_proj in float32, as the model holds them:

decode step (batch B, context L keys a sequence), bytes that must cross the memory bus once:
  weights  every tensor but the embedding and the routed experts (attention, indexer, dense MLPs, shared experts,
           routers, norms, lm_head; weights_proj only when the indexer selects, i.e. sparse), + B embedding rows,
           + per MoE layer the distinct routed experts the batch picks x one expert's bytes (B = 1: top_k exactly;
           more rows: E (1 - (1 - top_k / E)^B), uniform routing);
  KV       per sequence: dense, every layer reads L latent rows of (kv_lora_rank + qk_rope_head_dim) elements;
           sparse, every full layer reads L index keys of index_head_dim elements, and every layer min(L, index_topk)
           selected latent rows; both write one latent row a layer and one index key a full layer.
  floor = bytes / the device's copy rate (read + write bytes a second of a device-to-device copy).

prefill (batch B x T prompt tokens from an empty cache, in steps of C tokens):
  bytes    each of the ceil(B T / C) steps reads every weight (C tokens pick every expert), + the KV written
           (B T rows) and the cache the attention reads (once a step: the context up to that step's end);
  FLOPs    2 x the weights a token multiplies (every 2-D weight but the embedding, lm_head and the routed experts,
           + top_k experts a MoE layer) per token, + lm_head once a sequence, + attention: per (query, key) pair and
           head 2 (kv_lora_rank + qk_rope_head_dim + kv_lora_rank) (absorbed MLA: q.c, q_pe.k_pe, p.c), over
           T (T + 1) / 2 pairs dense or sum_i min(i, index_topk) sparse, + the indexer's 2 index_n_heads
           index_head_dim per pair over T (T + 1) / 2 pairs on each full layer (sparse only);
  floor = max(bytes / copy rate, FLOPs / the dense bf16 peak).
"""
from __future__ import annotations

import argparse
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

FLOAT32_TENSORS = (".mlp.gate.weight", ".mlp.gate.e_score_correction_bias", ".indexer.weights_proj.weight")
ITEMSIZE = {"I32": 4, "BF16": 2, "F8_E4M3": 1, "F32": 4}


@dataclass
class Shape:
    """A reduced-depth GLM-5.x model's byte and FLOP counts per class of tensor (itemsize: compute dtype bytes)."""
    cfg: Any
    total: float             # bytes of every weight the model holds
    always: float            # bytes every decode step reads: lm_head, not the embedding, experts, weights_proj
    weights_proj: float      # the indexer's weights_proj, all full layers
    expert: float            # bytes of one routed expert (gate, up, down)
    embed_row: float
    token_macs: float        # multiply-adds a token's linears take (top_k experts, no lm_head, no weights_proj)
    proj_macs: float         # weights_proj's, all full layers
    lm_head_macs: float
    itemsize: int

    @property
    def moe_layers(self) -> int:
        return self.cfg.mlp_layer_types.count("sparse")

    @property
    def full_layers(self) -> int:
        return len(self.cfg.full_layers)

    @property
    def latent(self) -> int:
        return self.cfg.kv_lora_rank + self.cfg.qk_rope_head_dim

    def token_kv_bytes(self) -> float:
        """KV a token adds: a latent row a layer, an index key a full layer."""
        return (self.cfg.num_layers * self.latent + self.full_layers * self.cfg.index_head_dim) * self.itemsize


def model_shape(preset: str, num_layers: int, itemsize: int = 2, overrides: dict | None = None) -> Shape:
    import numpy as np
    from openinfer.loading.config import with_overrides
    from openinfer.quant.dummy import quantized_kind
    from openinfer.testing import get_plugins, with_num_layers
    line, config = get_plugins().preset(preset)
    cfg = line.parse_config(with_num_layers(with_overrides(config, overrides or {}), num_layers))
    shapes = line.weight_shapes(cfg)
    total = always = proj = expert0 = embed_row = lm_head = macs = proj_macs = 0.0
    for name, shape in shapes.items():
        kind = quantized_kind(name, shapes)
        size = ITEMSIZE[kind] if kind else 4 if name.endswith(FLOAT32_TENSORS) else itemsize
        n = float(np.prod(shape))
        nbytes = n * size
        total += nbytes
        elements = n if len(shape) == 2 and kind != "F32" else 0.0   # a 2-D weight's multiply-adds (not scales)
        if name == "model.embed_tokens.weight":
            embed_row = nbytes / shape[0]
        elif name == "lm_head.weight":
            lm_head = nbytes
        elif ".mlp.experts." in name:
            if ".mlp.experts.0." in name:   # every expert has expert 0's shapes
                expert0 += nbytes
                macs += elements * cfg.num_experts_per_tok
        elif name.endswith(".indexer.weights_proj.weight"):
            proj += nbytes
            proj_macs += elements
        else:
            always += nbytes
            macs += elements
    layers = max(1, cfg.mlp_layer_types.count("sparse"))
    lm_head_macs = cfg.vocab_size * cfg.hidden_size
    if cfg.tie_word_embeddings:
        lm_head = embed_row * cfg.vocab_size
    return Shape(cfg, total, always + lm_head, proj, expert0 / layers, embed_row, macs, proj_macs,
                 lm_head_macs, itemsize)


def distinct_experts(batch: int, experts: int, top_k: int) -> float:
    return float(top_k) if batch == 1 else experts * (1 - (1 - top_k / experts) ** batch)


def decode_bytes(m: Shape, batch: int, context: int, sparse: bool) -> tuple[float, float]:
    """(weight bytes, KV bytes) one decode step must move."""
    c = m.cfg
    weights = m.always + batch * m.embed_row + (m.weights_proj if sparse else 0.0) + \
        m.moe_layers * distinct_experts(batch, c.n_routed_experts, c.num_experts_per_tok) * m.expert
    if sparse:
        read = m.full_layers * context * c.index_head_dim + c.num_layers * min(context, c.index_topk) * m.latent
    else:
        read = c.num_layers * context * m.latent
    return weights, batch * (read * m.itemsize + m.token_kv_bytes())


def prefill_cost(m: Shape, batch: int, tokens: int, chunk: int, sparse: bool) -> tuple[float, float]:
    """(bytes, FLOPs) of prefilling `batch` prompts of `tokens` from an empty cache in steps of `chunk` tokens."""
    c = m.cfg
    steps = math.ceil(batch * tokens / chunk)
    nbytes = steps * m.total + batch * tokens * m.token_kv_bytes() + \
        attention_reads(batch, tokens, chunk) * c.num_layers * m.latent * m.itemsize
    pairs = tokens * (tokens + 1) / 2
    k = c.index_topk
    attended = pairs if not sparse or tokens <= k else k * (k + 1) / 2 + (tokens - k) * k
    flops = 2 * batch * tokens * (m.token_macs + (m.proj_macs if sparse else 0.0)) + 2 * batch * m.lm_head_macs
    flops += batch * c.num_layers * attended * c.num_heads * 2 * (m.latent + c.kv_lora_rank)
    if sparse:
        flops += batch * m.full_layers * pairs * 2 * c.index_n_heads * c.index_head_dim
    return nbytes, flops


def attention_reads(batch: int, tokens: int, chunk: int) -> int:
    """Cache rows a chunked prefill's attention reads, once a step: the prompts run in turn, `chunk` tokens a step,
    and a step reads each of its sequences' cache up to the end of that sequence's slice."""
    rows = 0
    for start in range(0, batch * tokens, chunk):
        end = min(start + chunk, batch * tokens)
        for seq in range(start // tokens, (end - 1) // tokens + 1):
            rows += min(end - seq * tokens, tokens)
    return rows


def kv_gib(m: Shape, points: list[tuple[int, int]], output_len: int) -> float:
    """KV pool for the largest point (its sequences at full length) and a quarter more, in quarters of a GiB."""
    need = max(b * (i + output_len) for b, i in points) * m.token_kv_bytes() * 1.25
    return math.ceil(need / 2**28) / 4


def _points(text: str) -> list[tuple[int, int]]:
    return [(int(b), int(i)) for b, i in (p.split("x") for p in text.split(",") if p)]


def _load(path: Path) -> dict[tuple[int, int], dict]:
    """A bench latency JSON's points by (batch, input); none if the run left no file (it failed early)."""
    if not path.exists():
        return {}
    return {(p["batch_size"], p["input_len"]): p for p in json.loads(path.read_text())["points"]}


def _gb(nbytes: float) -> str:
    return f"{nbytes / 1e9:.2f} GB" if nbytes >= 1e9 else f"{nbytes / 1e6:.2f} MB"


def _ms(x: float | None) -> str:
    return "—" if x is None else f"{x:,.2f}" if x < 100 else f"{x:,.0f}"


def _ratio(a: float | None, b: float | None) -> str:
    return "—" if a is None or b is None or not b else f"{a / b:.1f}×"


def summary(a: argparse.Namespace) -> str:
    m = model_shape(a.preset, a.num_layers, a.itemsize)
    c = m.cfg
    sparse, dense = _load(a.dir / "sparse.json"), _load(a.dir / "dense.json")
    rate, peak = a.copy_rate_gbs * 1e9 if a.copy_rate_gbs else None, a.peak_tflops * 1e12
    layers = ", ".join(f"{i}: {t} indexer, {'MoE' if mlp == 'sparse' else 'dense MLP'}"
                       for i, (t, mlp) in enumerate(zip(c.indexer_types, c.mlp_layer_types)))
    out = [f"{a.preset} at {c.num_layers} layers ({layers}); dummy weights {_gb(m.total)} "
           f"({m.itemsize * 8}-bit floats); index_topk {c.index_topk}; KV {m.token_kv_bytes():.0f} bytes a token.",
           f"Copy rate {a.copy_rate_gbs:,.0f} GB/s, dense bf16 peak {a.peak_tflops:.0f} TFLOP/s." if rate else
           "No copy rate given: floors in bytes only.", ""]

    def floor(nbytes: float, flops: float = 0.0) -> tuple[float | None, str]:
        if rate is None:
            return None, _gb(nbytes)
        ms = max(nbytes / rate, flops / peak) * 1e3
        bound = "compute" if flops / peak > nbytes / rate else "bytes"
        return ms, f"{_ms(ms)} ({bound})"

    out += ["Decode step (median ms; context = prompt + half the output):", "",
            "| batch | context | sparse ms | dense ms | dense / sparse | (dense - sparse) / layer µs | sparse floor | "
            "dense floor | sparse / floor | dense / floor |", "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    points = list(dict.fromkeys([*a.points, *sparse, *dense]))
    for b, i in points:
        s, d = sparse.get((b, i)), dense.get((b, i))
        ctx = i + a.output_len // 2
        fs, fs_text = floor(sum(decode_bytes(m, b, ctx, True)))
        fd, fd_text = floor(sum(decode_bytes(m, b, ctx, False)))
        ms_s = s["median_decode_step_ms"] if s else None
        ms_d = d["median_decode_step_ms"] if d else None
        per_layer = "—" if ms_s is None or ms_d is None else f"{(ms_d - ms_s) * 1e3 / c.num_layers:,.0f}"
        out.append(f"| {b} | {i:,} | {_ms(ms_s)} | {_ms(ms_d)} | {_ratio(ms_d, ms_s)} | {per_layer} | {fs_text} | "
                   f"{fd_text} | {_ratio(ms_s, fs)} | {_ratio(ms_d, fd)} |")
    out += ["", f"Cold prefill (ms, steps of {a.chunk:,} tokens; the first point's includes first-use costs):", "",
            "| batch | prompt | sparse ms | dense ms | dense / sparse | sparse floor | dense floor | "
            "sparse / floor | dense / floor |", "|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for b, i in points:
        s, d = sparse.get((b, i)), dense.get((b, i))
        fs, fs_text = floor(*prefill_cost(m, b, i, a.chunk, True))
        fd, fd_text = floor(*prefill_cost(m, b, i, a.chunk, False))
        ms_s = s["median_prefill_ms"] if s else None
        ms_d = d["median_prefill_ms"] if d else None
        out.append(f"| {b} | {i:,} | {_ms(ms_s)} | {_ms(ms_d)} | {_ratio(ms_d, ms_s)} | {fs_text} | {fd_text} | "
                   f"{_ratio(ms_s, fs)} | {_ratio(ms_d, fd)} |")
    missing = [f"{mode} {b}x{i}" for mode, got in (("sparse", sparse), ("dense", dense)) for b, i in a.points
               if (b, i) not in got]
    if missing:
        out += ["", f"Not measured (the run failed or timed out first; see its log): {', '.join(missing)}."]
    return "\n".join(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    for name in ("kv-gib", "summary"):
        p = sub.add_parser(name)
        p.add_argument("--preset", default="glm-5.2")
        p.add_argument("--num-layers", type=int, required=True)
        p.add_argument("--points", type=_points, required=True, help="BxI,... as given to bench latency")
        p.add_argument("--output-len", type=int, required=True)
        p.add_argument("--itemsize", type=int, default=2, help="bytes of a float weight (2: bf16 on CUDA)")
    s = sub.choices["summary"]
    s.add_argument("--dir", type=Path, required=True, help="holds sparse.json and dense.json (bench latency)")
    s.add_argument("--chunk", type=int, required=True, help="--max-num-batched-tokens of the runs")
    s.add_argument("--copy-rate-gbs", type=float, default=None)
    s.add_argument("--peak-tflops", type=float, default=989.0, help="dense bf16 peak (H100 / H200 SXM: 989)")
    a = ap.parse_args()
    if a.cmd == "kv-gib":
        print(kv_gib(model_shape(a.preset, a.num_layers, a.itemsize), a.points, a.output_len))
    else:
        print(summary(a))


if __name__ == "__main__":
    main()
