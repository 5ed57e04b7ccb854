"""The Qwen3 model line: detection, tensor names, state, kernel plan, presets, demo."""
from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping

from openinfer.plugin_api import ModelLine, Probe, StateGroup

from .config import Qwen3Config

_BASE = {"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "hidden_act": "silu",
         "attention_bias": False, "rms_norm_eps": 1e-6, "rope_theta": 1000000.0, "rope_scaling": None,
         "bos_token_id": 151643, "eos_token_id": 151645, "use_sliding_window": False, "torch_dtype": "bfloat16"}

PRESETS: dict[str, dict[str, Any]] = {
    "qwen3-4b": {**_BASE, "hidden_size": 2560, "intermediate_size": 9728, "num_hidden_layers": 36,
                 "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128, "vocab_size": 151936,
                 "max_position_embeddings": 40960, "tie_word_embeddings": True},
    "qwen3-8b": {**_BASE, "hidden_size": 4096, "intermediate_size": 12288, "num_hidden_layers": 36,
                 "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128, "vocab_size": 151936,
                 "max_position_embeddings": 40960, "tie_word_embeddings": False},
    # tiny shapes with the real vocabulary: the demo model and quick tests
    "qwen3-tiny": {**_BASE, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
                   "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 64, "vocab_size": 151936,
                   "max_position_embeddings": 4096, "tie_word_embeddings": True},
    "qwen3-tiny-untied": {**_BASE, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
                          "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 64, "vocab_size": 151936,
                          "max_position_embeddings": 4096, "tie_word_embeddings": False},
}


class Qwen3Line(ModelLine):
    name = "qwen3"
    model_types = ("qwen3",)
    presets = PRESETS

    def probe(self, config: Mapping[str, Any]) -> Probe:
        probe = super().probe(config)
        if probe.ok and config.get("num_experts"):
            return Probe(False, "a Qwen3 MoE config (num_experts) is not the dense qwen3 line")
        return probe

    def parse_config(self, config: Mapping[str, Any]) -> Qwen3Config:
        return Qwen3Config.from_dict(config)

    def weight_shapes(self, cfg: Qwen3Config) -> dict[str, tuple[int, ...]]:
        H, I, d = cfg.hidden_size, cfg.intermediate_size, cfg.head_dim
        shapes = {"model.embed_tokens.weight": (cfg.vocab_size, H), "model.norm.weight": (H,)}
        if not cfg.tie_word_embeddings:
            shapes["lm_head.weight"] = (cfg.vocab_size, H)
        for i in range(cfg.num_layers):
            p = f"model.layers.{i}."
            shapes.update({
                p + "input_layernorm.weight": (H,), p + "post_attention_layernorm.weight": (H,),
                p + "self_attn.q_proj.weight": (cfg.num_heads * d, H),
                p + "self_attn.k_proj.weight": (cfg.num_kv_heads * d, H),
                p + "self_attn.v_proj.weight": (cfg.num_kv_heads * d, H),
                p + "self_attn.o_proj.weight": (H, cfg.num_heads * d),
                p + "self_attn.q_norm.weight": (d,), p + "self_attn.k_norm.weight": (d,),
                p + "mlp.gate_proj.weight": (I, H), p + "mlp.up_proj.weight": (I, H), p + "mlp.down_proj.weight": (H, I),
            })
        return shapes

    def ignored_weights(self, cfg: Qwen3Config) -> tuple[str, ...]:
        # some exports keep lm_head.weight even when tied; it equals the embedding
        return ("lm_head.weight",) if cfg.tie_word_embeddings else ()

    def state_spec(self, cfg: Qwen3Config) -> list[StateGroup]:
        kv = (cfg.num_kv_heads, cfg.head_dim)
        return [StateGroup("kv", "paged", cfg.num_layers, {"k": kv, "v": kv}, fp8=True)]

    def kernel_plan(self, cfg: Qwen3Config) -> list[str]:
        return ["embedding", "rms_norm", "add_rms_norm", "linear", "linear_silu_mul", "rope_write_kv",
                "paged_attention", "gather_rows"]

    def build(self, cfg: Qwen3Config, weights, backend, ops):
        from .model import Qwen3Model
        return Qwen3Model(cfg, weights, backend, ops)

    def chat_format(self):
        from .chat import QWEN3_CHAT_FORMAT
        return QWEN3_CHAT_FORMAT

    def demo_checkpoint(self) -> tuple[dict[str, Any], Path]:
        """The built-in demo: tiny random weights with the genuine Qwen3 tokenizer (untied, so
        the random model does not just echo its last input token)."""
        return dict(PRESETS["qwen3-tiny-untied"]), self.tokenizer_dir()

    def tokenizer_dir(self) -> Path:
        return Path(__file__).parent / "demo_tokenizer"
