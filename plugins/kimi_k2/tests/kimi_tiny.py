"""The Kimi tests' tiny world: a small Kimi tokenizer folder of their own (tiktoken ranks trained on a fixed text,
Kimi's special tokens and chat template) and tiny random DeepSeek-V3 / Kimi checkpoints built with transformers,
INT4 and FP8 ones included. (A module of its own name: `from conftest import` would find another plugin's.)"""
from __future__ import annotations

import base64
import json
from pathlib import Path

import pytest

# the special tokens of Kimi-K2's tokenizer_config.json, by offset from the first id after the ranks
SPECIALS = {0: "[BOS]", 1: "[EOS]", 2: "<|im_end|>", 3: "<|im_user|>", 4: "<|im_assistant|>", 6: "<|start_header_id|>",
            7: "<|end_header_id|>", 9: "[EOT]", 10: "<|im_system|>", 11: "<|tool_calls_section_begin|>",
            12: "<|tool_calls_section_end|>", 13: "<|tool_call_begin|>", 14: "<|tool_call_argument_begin|>",
            15: "<|tool_call_end|>", 17: "<|im_middle|>", 22: "<think>", 23: "</think>", 254: "[UNK]", 255: "[PAD]"}

# Kimi-K2-Instruct's chat template (as shipped in its tokenizer_config.json)
CHAT_TEMPLATE = """{%- if tools -%}
  <|im_system|>tool_declare<|im_middle|>{{ tools | tojson(separators=(',', ':')) }}<|im_end|>
{%- endif -%}
{%- for message in messages -%}
  {%- if loop.first and messages[0]['role'] != 'system' -%}
    <|im_system|>system<|im_middle|>You are Kimi, an AI assistant created by Moonshot AI.<|im_end|>
  {%- endif -%}
  {%- set role_name =  message.get('name') or  message['role'] -%}
  {%- if message['role'] == 'user' -%}
    <|im_user|>{{role_name}}<|im_middle|>
  {%- elif message['role'] == 'assistant' -%}
    <|im_assistant|>{{role_name}}<|im_middle|>
  {%- else -%}
    <|im_system|>{{role_name}}<|im_middle|>
  {%- endif -%}
  {%- if message['role'] == 'assistant' and message.get('tool_calls') -%}
    {%- if message['content'] -%}{{ message['content'] }}{%- endif -%}
    <|tool_calls_section_begin|>
    {%- for tool_call in message['tool_calls'] -%}
      {%- set formatted_id = tool_call['id'] -%}
      <|tool_call_begin|>{{ formatted_id }}<|tool_call_argument_begin|>{% if tool_call['function']['arguments'] is string %}{{ tool_call['function']['arguments'] }}{% else %}{{ tool_call['function']['arguments'] | tojson }}{% endif %}<|tool_call_end|>
    {%- endfor -%}
    <|tool_calls_section_end|>
  {%- elif message['role'] == 'tool' -%}
    ## Return of {{ message.tool_call_id }}
{{ message['content'] }}
  {%- elif message['content'] is string -%}
    {{ message['content'] }}
  {%- endif -%}
  <|im_end|>
{%- endfor -%}
{%- if add_generation_prompt -%}
  <|im_assistant|>assistant<|im_middle|>
{%- endif -%}"""

CORPUS = ("The quick brown fox jumps over the lazy dog. Name three prime numbers and explain why 1 is not prime. "
          "What is the weather in Paris today? It's sunny; don't forget HTMLParser and camelCase identifiers. "
          "中文字。日本語です。今日はいい天気ですね。北京的天气怎么样？ 한국어 텍스트입니다. Ünïcödé àccents. "
          "def get_weather(city):\n    return {\"city\": city, \"temp\": 21}\n\n0123456789 3.14159 2026-12-06 "
          "functions.get_weather:0 {\"city\": \"Paris\"} ## Return of You are Kimi, an AI assistant.\n")
RANKS = 420


def write_ranks(path: Path, ranks: dict[bytes, int]) -> None:
    path.write_bytes(b"".join(base64.b64encode(t) + b" " + str(r).encode() + b"\n"
                              for t, r in sorted(ranks.items(), key=lambda kv: kv[1])))


def train_ranks(text: str, pattern: str, merges: int) -> dict[bytes, int]:
    """Byte-level BPE ranks: the 256 bytes, then up to `merges` most frequent adjacent pairs inside the pattern's
    pieces (ties by the pair's bytes, so every run trains the same ranks)."""
    import regex
    ranks = {bytes([b]): b for b in range(256)}
    words = [[bytes([b]) for b in piece.encode("utf-8")] for piece in regex.findall(pattern, text)]
    for _ in range(merges):
        counts: dict[tuple[bytes, bytes], int] = {}
        for w in words:
            for pair in zip(w, w[1:]):
                counts[pair] = counts.get(pair, 0) + 1
        if not counts:
            break
        best = min(counts, key=lambda p: (-counts[p], p))
        ranks[best[0] + best[1]] = len(ranks)
        for w in words:
            i = 0
            while i < len(w) - 1:
                if (w[i], w[i + 1]) == best:
                    w[i: i + 2] = [best[0] + best[1]]
                i += 1
    return ranks


def tokenizer_config(n: int) -> dict:
    return {"added_tokens_decoder": {str(n + k): {"content": v, "special": True, "lstrip": False, "rstrip": False,
                                                  "normalized": False, "single_word": False}
                                     for k, v in SPECIALS.items()},
            "bos_token": "[BOS]", "eos_token": "[EOS]", "pad_token": "[PAD]", "unk_token": "[UNK]",
            "chat_template": CHAT_TEMPLATE, "tokenizer_class": "TikTokenTokenizer",
            "auto_map": {"AutoTokenizer": ["tokenization_kimi.TikTokenTokenizer", None]}}


# models.md §6.5: DeepSeek-V3 proper (16 experts in 4 groups, 2 kept), one dense layer then two MoE layers
V3 = dict(hidden_size=64, intermediate_size=128, moe_intermediate_size=64, num_hidden_layers=3,
          num_attention_heads=4, num_key_value_heads=4, q_lora_rank=48, kv_lora_rank=32, qk_nope_head_dim=16,
          qk_rope_head_dim=8, v_head_dim=16, n_routed_experts=16, num_experts_per_tok=4, n_shared_experts=1,
          first_k_dense_replace=1, n_group=4, topk_group=2, norm_topk_prob=True, routed_scaling_factor=2.827,
          max_position_embeddings=2048, rope_theta=50000.0, rms_norm_eps=1e-6, tie_word_embeddings=False,
          rope_scaling={"type": "yarn", "factor": 32.0, "beta_fast": 1.0, "beta_slow": 1.0, "mscale": 1.0,
                        "mscale_all_dim": 1.0, "original_max_position_embeddings": 64})
# Kimi-K2's routing: one group (one dense layer, one MoE layer)
KIMI = dict(V3, n_group=1, topk_group=1, num_experts_per_tok=8, num_hidden_layers=2)
KIMI_INT4_QUANT = {
    "quant_method": "compressed-tensors", "format": "pack-quantized", "quantization_status": "compressed",
    "config_groups": {"group_0": {"targets": ["Linear"], "input_activations": None, "output_activations": None,
                                  "weights": {"num_bits": 4, "type": "int", "symmetric": True, "strategy": "group",
                                              "group_size": 32, "dynamic": False, "actorder": None,
                                              "observer": "minmax", "observer_kwargs": {}, "block_structure": None}}},
    "ignore": ["lm_head", "re:.*self_attn.*", "re:.*shared_experts.*", "re:.*mlp\\.(gate|up|down)_proj.*"],
    "kv_cache_scheme": None}
FP8_QUANT = {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic", "weight_block_size": [128, 128]}


def _random_router_bias(model) -> None:
    import torch
    for layer in model.model.layers:
        gate = getattr(layer.mlp, "gate", None)
        if gate is not None and hasattr(gate, "e_score_correction_bias"):
            gate.e_score_correction_bias.copy_(0.3 * torch.randn_like(gate.e_score_correction_bias))


def build_v3(out: Path, config: dict, tokenizer_dir: Path, vocab: int, adjust=None):
    """A tiny random DeepseekV3ForCausalLM saved to `out` with the Kimi tokenizer files; returns the torch model."""
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from openinfer.testing.hf_reference import build_hf_checkpoint

    def adjust_all(model):
        _random_router_bias(model)
        if adjust is not None:
            adjust(model)
    return build_hf_checkpoint(out, "deepseek_v3", dict(config, vocab_size=vocab, bos_token_id=vocab - 256,
                                                        eos_token_id=vocab - 255),
                               tokenizer_dir=tokenizer_dir, adjust=adjust_all)


def _quantized_weights(model, fmt: str):
    """(checkpoint module name, the torch tensor holding its [out, in] weight) of every Linear the format quantizes:
    INT4 the routed experts, FP8 every Linear but lm_head and the router."""
    from openinfer.testing.hf_reference import checkpoint_linears
    for name, weight in checkpoint_linears(model):
        if ".experts." in name or (fmt == "fp8" and name != "lm_head"):
            yield name, weight


def quantized_checkpoint(out: Path, ref_dir: Path, model, fmt: str) -> None:
    """`model` (whose quantized weights already hold their dequantized values, see quantize_in_place) written to
    `out` in the Kimi layout: config model_type kimi_k2 with the format's quantization_config, the quantized
    Linears as packed INT4 (weight_packed / weight_scale / weight_shape) or FP8 (weight / weight_scale_inv)."""
    import shutil

    import torch
    from safetensors.torch import load_file, save_file

    from openinfer.testing import pack_int4
    out.mkdir(parents=True, exist_ok=True)
    for f in ref_dir.iterdir():
        if f.is_file() and not f.name.endswith(".safetensors") and f.name != "config.json":
            shutil.copy(f, out / f.name)
    config = json.loads((ref_dir / "config.json").read_text())
    config.update(model_type="kimi_k2", quantization_config=KIMI_INT4_QUANT if fmt == "int4" else FP8_QUANT)
    (out / "config.json").write_text(json.dumps(config, indent=1))
    tensors = load_file(str(ref_dir / "model.safetensors"))
    for name, codes in model._openinfer_codes.items():
        ref = tensors.pop(name + ".weight")   # the saved reference holds the dequantized values
        assert torch.equal(ref, torch.from_numpy(model._openinfer_deq[name])), f"{name}: not the quantized tensor"
        if fmt == "int4":
            q, scale = codes
            tensors[name + ".weight_packed"] = torch.from_numpy(pack_int4(q))
            tensors[name + ".weight_scale"] = torch.from_numpy(scale).bfloat16()
            tensors[name + ".weight_shape"] = torch.tensor(list(q.shape), dtype=torch.int32)
        else:
            data, scale_inv = codes
            tensors[name + ".weight"] = torch.from_numpy(data).view(torch.float8_e4m3fn)
            tensors[name + ".weight_scale_inv"] = torch.from_numpy(scale_inv)
    save_file(tensors, str(out / "model.safetensors"))


def quantize_in_place(model, fmt: str) -> None:
    """Replace each quantized Linear's weight by its dequantized value (the reference's weights) and keep the codes
    on the model for quantized_checkpoint: INT4 group-32 with bf16 scales, or FP8 with 128x128 block scales."""
    import numpy as np
    import torch

    from openinfer.testing import Fp8Weight, quantize_fp8, quantize_int4, row_scales, unpack_int4
    codes, deqs = {}, {}
    with torch.no_grad():
        for name, weight in _quantized_weights(model, fmt):
            w = weight.float().numpy()
            if fmt == "int4":
                packed, scale = quantize_int4(w, lambda s: torch.from_numpy(s).bfloat16().float().numpy())
                q = unpack_int4(packed)
                deq = q.astype(np.float32) * np.repeat(scale, 32, axis=-1)
                codes[name] = (q, scale)
            else:
                data, scale_inv = quantize_fp8(w)
                deq = Fp8Weight(data, row_scales(scale_inv, w.shape[0])).dequant()
                codes[name] = (data, scale_inv)
            weight.copy_(torch.from_numpy(deq))
            deqs[name] = deq.astype(np.float32)
    model._openinfer_codes, model._openinfer_deq = codes, deqs


VOCAB_SPECIALS = 256


def build_checkpoint(tmp_path_factory, kimi_tokenizer_dir: Path, vocab: int, name: str, config: dict,
                     fmt: str | None = None):
    """(checkpoint folder, its transformers reference): deepseek_v3 as saved, or (fmt "int4" / "fp8") the Kimi
    layout of it whose reference holds the dequantized weights."""
    out = tmp_path_factory.mktemp(name)
    if fmt is None:
        return out, build_v3(out, config, kimi_tokenizer_dir, vocab)
    model = build_v3(out / "ref", config, kimi_tokenizer_dir, vocab, adjust=lambda m: quantize_in_place(m, fmt))
    quantized_checkpoint(out / "kimi", out / "ref", model, fmt)
    return out / "kimi", model
