"""The GLM-5.x model line: detection, tensor names, state (MLA latents + indexer keys), kernel plan, presets."""
from __future__ import annotations

import logging
from typing import Any, Mapping

from openinfer.plugin_api import (ModelLine, StateGroup, mla_state_group, mla_weight_shapes, moe_weight_shapes,
                                  swiglu_shapes)

from .config import Glm52Config
from .indexer import indexer_state_group, indexer_weight_shapes
from .model import Glm52Model, kernel_plan, mla_dims

log = logging.getLogger("openinfer.glm52")

_GLM5 = {"architectures": ["GlmMoeDsaForCausalLM"], "model_type": "glm_moe_dsa", "hidden_act": "silu",
         "hidden_size": 6144, "num_hidden_layers": 78, "num_attention_heads": 64, "num_key_value_heads": 64,
         "vocab_size": 154880, "intermediate_size": 12288, "moe_intermediate_size": 2048, "first_k_dense_replace": 3,
         "moe_layer_freq": 1, "n_routed_experts": 256, "num_experts_per_tok": 8, "n_shared_experts": 1,
         "n_group": 1, "topk_group": 1, "topk_method": "noaux_tc", "scoring_func": "sigmoid", "norm_topk_prob": True,
         "routed_scaling_factor": 2.5, "q_lora_rank": 2048, "kv_lora_rank": 512, "qk_nope_head_dim": 192,
         "qk_rope_head_dim": 64, "v_head_dim": 256, "index_n_heads": 32, "index_head_dim": 128, "index_topk": 2048,
         "indexer_rope_interleave": True, "rope_interleave": True, "rms_norm_eps": 1e-5, "tie_word_embeddings": False,
         "attention_bias": False, "num_nextn_predict_layers": 1, "bos_token_id": 0,
         "eos_token_id": [154820, 154827, 154829], "torch_dtype": "bfloat16"}

PRESETS: dict[str, dict[str, Any]] = {
    "glm-5": {**_GLM5, "rope_parameters": {"rope_type": "default", "rope_theta": 1000000.0},
              "max_position_embeddings": 202752},
    "glm-5.2": {**_GLM5, "rope_parameters": {"rope_type": "default", "rope_theta": 8000000.0},
                "max_position_embeddings": 1048576, "index_topk_freq": 4, "index_skip_topk_offset": 3,
                "index_topk_pattern": None, "index_share_for_mtp_iteration": True},
}
# GLM-5.2's structure (three dense full-indexer layers, then MoE layers, the indexer on every fourth) at a size the
# CPU runs in seconds; index_topk 64, so contexts past 64 keys attend sparsely
PRESETS["glm-5.2-tiny"] = {**PRESETS["glm-5.2"], "hidden_size": 64, "num_hidden_layers": 8, "num_attention_heads": 4,
                           "num_key_value_heads": 4, "vocab_size": 1024, "intermediate_size": 128,
                           "moe_intermediate_size": 32, "n_routed_experts": 16, "q_lora_rank": 48, "kv_lora_rank": 32,
                           "qk_nope_head_dim": 16, "qk_rope_head_dim": 8, "v_head_dim": 16, "index_n_heads": 4,
                           "index_head_dim": 16, "index_topk": 64, "max_position_embeddings": 4096}


class Glm52Line(ModelLine):
    name = "glm52"
    model_types = ("glm_moe_dsa",)
    presets = PRESETS

    def parse_config(self, config: Mapping[str, Any]) -> Glm52Config:
        return Glm52Config.from_dict(config)

    def weight_shapes(self, cfg: Glm52Config) -> dict[str, tuple[int, ...]]:
        """Every tensor the line loads, the Linears in the checkpoint's formats (FP8: weight + weight_scale_inv)."""
        H, q = cfg.hidden_size, cfg.quant
        shapes = {"model.embed_tokens.weight": (cfg.vocab_size, H), "model.norm.weight": (H,)}
        if not cfg.tie_word_embeddings:
            shapes["lm_head.weight"] = (cfg.vocab_size, H)
        for i in range(cfg.num_layers):
            p, a = f"model.layers.{i}.", f"model.layers.{i}.self_attn."
            shapes.update({p + "input_layernorm.weight": (H,), p + "post_attention_layernorm.weight": (H,)})
            shapes.update(mla_weight_shapes(a, mla_dims(cfg), q))
            if cfg.indexer_types[i] == "full":   # a shared layer has no indexer weights
                shapes.update(indexer_weight_shapes(a + "indexer.", cfg))
            if cfg.mlp_layer_types[i] == "dense":
                shapes.update(swiglu_shapes(p + "mlp.", H, cfg.intermediate_size, q))
            else:
                shapes.update(moe_weight_shapes(p + "mlp.", H, cfg.n_routed_experts, cfg.moe_intermediate_size,
                                                cfg.moe_intermediate_size * cfg.n_shared_experts, True, q))
        return shapes

    def ignored_weights(self, cfg: Glm52Config) -> tuple[str, ...]:
        """The multi-token-prediction layers after the last decoder layer (not served: no speculative decoding)."""
        return tuple(f"model.layers.{cfg.num_layers + k}." for k in range(cfg.num_mtp_layers))

    def state_spec(self, cfg: Glm52Config) -> list[StateGroup]:
        return [mla_state_group(mla_dims(cfg), cfg.num_layers), indexer_state_group(cfg)]

    def kernel_plan(self, cfg: Glm52Config) -> list[str]:
        return kernel_plan(cfg)

    def num_experts(self, cfg: Glm52Config) -> int:
        return cfg.n_routed_experts

    def build(self, cfg: Glm52Config, weights, backend, ops):
        if cfg.num_mtp_layers:
            log.info("GLM multi-token-prediction layer(s) %s are skipped (no speculative decoding)",
                     ", ".join(f"{prefix}*" for prefix in self.ignored_weights(cfg)))
        return Glm52Model(cfg, weights, backend, ops)

    def chat_format(self):
        from .chat import GLM52_CHAT_FORMAT
        return GLM52_CHAT_FORMAT
