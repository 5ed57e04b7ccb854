"""The DeepSeek-V2 model line: detection, tensor names, the latent cache, kernel plan, presets."""
from __future__ import annotations

from typing import Any

from openinfer.plugin_api import (MLAMoEConfig, MLAMoEDecoder, ModelLine, StateGroup, expert_shard, mla_moe_kernel_plan,
                                  mla_moe_weight_shapes, mla_state_group)

from .config import parse

_YARN = {"type": "yarn", "factor": 40, "beta_fast": 32, "beta_slow": 1, "mscale": 0.707, "mscale_all_dim": 0.707,
         "original_max_position_embeddings": 4096}
_BASE = {"architectures": ["DeepseekV2ForCausalLM"], "model_type": "deepseek_v2", "hidden_act": "silu",
         "attention_bias": False, "rms_norm_eps": 1e-6, "rope_theta": 10000, "rope_scaling": _YARN,
         "max_position_embeddings": 163840, "vocab_size": 102400, "bos_token_id": 100000, "eos_token_id": 100001,
         "tie_word_embeddings": False, "kv_lora_rank": 512, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64,
         "v_head_dim": 128, "first_k_dense_replace": 1, "moe_layer_freq": 1, "n_shared_experts": 2,
         "num_experts_per_tok": 6, "norm_topk_prob": False, "scoring_func": "softmax", "torch_dtype": "bfloat16"}

PRESETS: dict[str, dict[str, Any]] = {
    # deepseek-ai/DeepSeek-V2-Lite(-Chat): 15.7B parameters, 2.4B active
    "deepseek-v2-lite": {**_BASE, "hidden_size": 2048, "num_hidden_layers": 27, "num_attention_heads": 16,
                         "num_key_value_heads": 16, "intermediate_size": 10944, "moe_intermediate_size": 1408,
                         "n_routed_experts": 64, "topk_method": "greedy", "n_group": 1, "topk_group": 1,
                         "routed_scaling_factor": 1.0, "q_lora_rank": None},
    # deepseek-ai/DeepSeek-V2(-Chat), DeepSeek-V2.5: 236B parameters, 21B active
    "deepseek-v2": {**_BASE, "hidden_size": 5120, "num_hidden_layers": 60, "num_attention_heads": 128,
                    "num_key_value_heads": 128, "intermediate_size": 12288, "moe_intermediate_size": 1536,
                    "n_routed_experts": 160, "topk_method": "group_limited_greedy", "n_group": 8, "topk_group": 3,
                    "routed_scaling_factor": 16.0, "q_lora_rank": 1536},
    # the V2-Lite structure (dense layer 0, then MoE with shared experts) at a size the CPU runs in seconds
    "deepseek-v2-lite-tiny": {**_BASE, "hidden_size": 64, "num_hidden_layers": 3, "num_attention_heads": 4,
                              "num_key_value_heads": 4, "intermediate_size": 128, "moe_intermediate_size": 32,
                              "n_routed_experts": 8, "num_experts_per_tok": 3, "topk_method": "greedy",
                              "n_group": 1, "topk_group": 1, "routed_scaling_factor": 1.0, "q_lora_rank": None,
                              "kv_lora_rank": 32, "qk_nope_head_dim": 16, "qk_rope_head_dim": 8, "v_head_dim": 16,
                              "max_position_embeddings": 4096,
                              "rope_scaling": {**_YARN, "original_max_position_embeddings": 256}},
}


class DeepseekV2Line(ModelLine):
    name = "deepseek_v2"
    model_types = ("deepseek_v2",)
    presets = PRESETS

    def parse_config(self, config) -> MLAMoEConfig:
        return parse(config)

    def weight_shapes(self, cfg: MLAMoEConfig) -> dict[str, tuple[int, ...]]:
        return mla_moe_weight_shapes(cfg)

    def ignored_weights(self, cfg: MLAMoEConfig) -> tuple[str, ...]:
        return ("lm_head.weight",) if cfg.tie_word_embeddings else ()

    def state_spec(self, cfg: MLAMoEConfig) -> list[StateGroup]:
        return [mla_state_group(cfg.mla, cfg.num_layers)]

    def kernel_plan(self, cfg: MLAMoEConfig) -> list[str]:
        return mla_moe_kernel_plan(cfg)

    def num_experts(self, cfg: MLAMoEConfig) -> int:
        return cfg.n_routed_experts if cfg.has_moe else 0

    def build(self, cfg: MLAMoEConfig, weights, backend, ops):
        """On an expert-parallel rank (`backend.comm`), only its share of the routed experts is loaded, and
        the communicator sums the ranks' routed outputs."""
        comm = backend.comm
        shard = None if comm is None else expert_shard(cfg.n_routed_experts, comm.rank, comm.world_size)
        return MLAMoEDecoder(cfg, weights, backend, ops, shard, comm)

    def chat_format(self):
        from .chat import DEEPSEEK_V2_CHAT_FORMAT
        return DEEPSEEK_V2_CHAT_FORMAT
