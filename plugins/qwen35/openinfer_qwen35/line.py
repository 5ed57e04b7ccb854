"""The Qwen3.5 model line: detection, tensor names, state groups, kernel plan, presets."""
from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping

from openinfer.plugin_api import ChatFormat, ModelLine, StateGroup

from .config import Qwen35Config
from .layers import GDN_GROUP
from .ops import OPS


def _preset(hidden: int, layers: int, inter: int, heads: int, v_heads: int, tied: bool, **text_overrides: Any
            ) -> dict[str, Any]:
    """config.json of a real Qwen3.5 checkpoint shape (text part; the vision tower is ignored)."""
    text = {"model_type": "qwen3_5_text", "hidden_size": hidden, "num_hidden_layers": layers,
            "layer_types": ["full_attention" if (i + 1) % 4 == 0 else "linear_attention" for i in range(layers)],
            "full_attention_interval": 4, "intermediate_size": inter, "num_attention_heads": heads,
            "num_key_value_heads": 4, "head_dim": 256, "linear_num_key_heads": 16, "linear_num_value_heads": v_heads,
            "linear_key_head_dim": 128, "linear_value_head_dim": 128, "linear_conv_kernel_dim": 4,
            "vocab_size": 248320, "max_position_embeddings": 262144, "rms_norm_eps": 1e-6, "hidden_act": "silu",
            "attention_bias": False, "attn_output_gate": True, "mamba_ssm_dtype": "float32",
            "tie_word_embeddings": tied, "eos_token_id": 248044,
            "rope_parameters": {"rope_type": "default", "rope_theta": 10000000.0, "partial_rotary_factor": 0.25,
                                "mrope_section": [11, 11, 10], "mrope_interleaved": True}, **text_overrides}
    return {"architectures": ["Qwen3_5ForConditionalGeneration"], "model_type": "qwen3_5",
            "tie_word_embeddings": tied, "torch_dtype": "bfloat16", "text_config": text}


PRESETS: dict[str, dict[str, Any]] = {
    "qwen3.5-4b": _preset(2560, 32, 9216, 16, 32, tied=True),
    "qwen3.5-9b": _preset(4096, 32, 12288, 16, 32, tied=False),
    "qwen3.5-27b": _preset(5120, 64, 17408, 24, 48, tied=False),
    # tiny shapes with the real vocabulary, for quick runs and kernel work (head_dim 64 as on CUDA)
    "qwen3.5-tiny": _preset(64, 4, 128, 4, 4, tied=True, num_key_value_heads=2, head_dim=64,
                            linear_num_key_heads=2, linear_key_head_dim=32, linear_value_head_dim=32,
                            max_position_embeddings=4096,
                            rope_parameters={"rope_type": "default", "rope_theta": 10000000.0, "partial_rotary_factor": 0.25,
                                             "mrope_section": [3, 3, 2], "mrope_interleaved": True}),
}

SHARED_OPS = ["embedding", "rms_norm", "add_rms_norm", "linear", "linear_silu_mul", "qk_norm_rope",
              "write_kv", "paged_attention", "gather_rows"]


class Qwen35Line(ModelLine):
    name = "qwen35"
    model_types = ("qwen3_5", "qwen3_5_text")
    presets = PRESETS

    def parse_config(self, config: Mapping[str, Any]) -> Qwen35Config:
        return Qwen35Config.from_dict(config)

    def weight_shapes(self, cfg: Qwen35Config) -> dict[str, tuple[int, ...]]:
        H, I, P = cfg.hidden_size, cfg.intermediate_size, cfg.prefix
        d, nh, nkv = cfg.head_dim, cfg.num_heads, cfg.num_kv_heads
        nv, vd = cfg.linear_num_value_heads, cfg.linear_value_head_dim
        shapes = {P + "embed_tokens.weight": (cfg.vocab_size, H), P + "norm.weight": (H,)}
        if not cfg.tie_word_embeddings:
            shapes["lm_head.weight"] = (cfg.vocab_size, H)
        for i, kind in enumerate(cfg.layer_types):
            p = f"{P}layers.{i}."
            shapes.update({p + "input_layernorm.weight": (H,), p + "post_attention_layernorm.weight": (H,),
                           p + "mlp.gate_proj.weight": (I, H), p + "mlp.up_proj.weight": (I, H),
                           p + "mlp.down_proj.weight": (H, I)})
            if kind == "linear_attention":
                la = p + "linear_attn."
                shapes.update({
                    la + "in_proj_qkv.weight": (cfg.conv_dim, H), la + "in_proj_z.weight": (nv * vd, H),
                    la + "in_proj_b.weight": (nv, H), la + "in_proj_a.weight": (nv, H),
                    la + "conv1d.weight": (cfg.conv_dim, 1, cfg.conv_kernel), la + "dt_bias": (nv,),
                    la + "A_log": (nv,), la + "norm.weight": (vd,), la + "out_proj.weight": (H, nv * vd)})
            else:
                sa = p + "self_attn."
                shapes.update({
                    sa + "q_proj.weight": (nh * 2 * d, H), sa + "k_proj.weight": (nkv * d, H),
                    sa + "v_proj.weight": (nkv * d, H), sa + "o_proj.weight": (H, nh * d),
                    sa + "q_norm.weight": (d,), sa + "k_norm.weight": (d,)})
        return shapes

    def ignored_weights(self, cfg: Qwen35Config) -> tuple[str, ...]:
        # the vision tower and the multi-token-prediction head of the real checkpoints
        ignored = ("model.visual.", "mtp.")
        return ignored + ("lm_head.weight",) if cfg.tie_word_embeddings else ignored

    def state_spec(self, cfg: Qwen35Config) -> list[StateGroup]:
        n_full = cfg.layer_types.count("full_attention")
        kv = (cfg.num_kv_heads, cfg.head_dim)
        gdn = {"conv": (cfg.conv_kernel - 1, cfg.conv_dim),
               "ssm": (cfg.linear_num_value_heads, cfg.linear_key_head_dim, cfg.linear_value_head_dim)}
        return [StateGroup("kv", "paged", n_full, {"k": kv, "v": kv}, fp8=True),
                StateGroup(GDN_GROUP, "slots", cfg.num_layers - n_full, gdn, dtype="float32")]

    def kernel_plan(self, cfg: Qwen35Config) -> list[str]:
        return SHARED_OPS + list(OPS)

    def build(self, cfg: Qwen35Config, weights, backend, ops):
        from .model import Qwen35Model
        return Qwen35Model(cfg, weights, backend, ops)

    def tokenizer_dir(self) -> Path:
        from .chat import TOKENIZER_DIR
        return TOKENIZER_DIR

    def chat_format(self) -> ChatFormat:
        from .chat import Qwen35ChatFormat
        return Qwen35ChatFormat()
