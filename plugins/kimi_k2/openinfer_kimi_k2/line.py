"""The Kimi-K2 model line (Kimi-K2-Instruct / -Thinking, Kimi-K2.5 / K2.6, and DeepSeek-V3 checkpoints): the
shared MLA + MoE decoder with noaux_tc sigmoid routing, INT4 pack-quantized or FP8 block-scaled weights read as
stored, Kimi's tiktoken tokenizer and chat format."""
from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, Mapping

from openinfer.plugin_api import (MLAMoEDecoder, ModelLine, Probe, StateGroup, Tokenizer, expert_shard,
                                  mla_moe_kernel_plan, mla_moe_weight_shapes, mla_state_group)

from .config import BODY_TYPES, WRAPPER_TYPE, KimiConfig, parse

log = logging.getLogger("openinfer.kimi_k2")

_YARN = {"type": "yarn", "factor": 32.0, "beta_fast": 1.0, "beta_slow": 1.0, "mscale": 1.0, "mscale_all_dim": 1.0,
         "original_max_position_embeddings": 4096}
_K2 = {"architectures": ["DeepseekV3ForCausalLM"], "model_type": "kimi_k2", "hidden_act": "silu",
       "hidden_size": 7168, "num_hidden_layers": 61, "num_attention_heads": 64, "num_key_value_heads": 64,
       "vocab_size": 163840, "intermediate_size": 18432, "moe_intermediate_size": 2048, "first_k_dense_replace": 1,
       "moe_layer_freq": 1, "n_routed_experts": 384, "num_experts_per_tok": 8, "n_shared_experts": 1, "n_group": 1,
       "topk_group": 1, "topk_method": "noaux_tc", "scoring_func": "sigmoid", "norm_topk_prob": True,
       "routed_scaling_factor": 2.827, "q_lora_rank": 1536, "kv_lora_rank": 512, "qk_nope_head_dim": 128,
       "qk_rope_head_dim": 64, "v_head_dim": 128, "rope_theta": 50000.0, "rope_scaling": _YARN,
       "max_position_embeddings": 131072, "num_nextn_predict_layers": 0, "tie_word_embeddings": False,
       "rms_norm_eps": 1e-6, "bos_token_id": 163584, "eos_token_id": 163585, "attention_bias": False,
       "torch_dtype": "bfloat16"}
_FP8 = {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic", "weight_block_size": [128, 128]}
# compressed-tensors INT4 for the routed experts only: everything else is in the ignore list
_INT4 = {"quant_method": "compressed-tensors", "format": "pack-quantized", "quantization_status": "compressed",
         "config_groups": {"group_0": {"targets": ["Linear"], "input_activations": None, "output_activations": None,
                                       "weights": {"num_bits": 4, "type": "int", "symmetric": True,
                                                   "strategy": "group", "group_size": 32, "dynamic": False,
                                                   "actorder": None, "observer": "minmax"}}},
         "ignore": ["lm_head", "re:.*self_attn.*", "re:.*shared_experts.*", "re:.*mlp\\.(gate|up|down)_proj.*"],
         "kv_cache_scheme": None}

PRESETS: dict[str, dict[str, Any]] = {
    # moonshotai/Kimi-K2-Instruct: FP8 block-scaled Linears, 128k context
    "kimi-k2-instruct": {**_K2, "quantization_config": _FP8},
    # moonshotai/Kimi-K2-Thinking (and -Instruct-0905's shape): INT4 routed experts, 256k context
    "kimi-k2-thinking": {**_K2, "max_position_embeddings": 262144, "rope_scaling": {**_YARN, "factor": 64.0},
                         "quantization_config": _INT4},
}
# the same structures (dense layer 0, then MoE; q-LoRA MLA; both formats) at a size the CPU runs in seconds
_TINY = {"hidden_size": 64, "num_hidden_layers": 3, "num_attention_heads": 4, "num_key_value_heads": 4,
         "intermediate_size": 128, "moe_intermediate_size": 64, "n_routed_experts": 16, "q_lora_rank": 48,
         "kv_lora_rank": 32, "qk_nope_head_dim": 16, "qk_rope_head_dim": 8, "v_head_dim": 16,
         "max_position_embeddings": 4096, "rope_scaling": {**_YARN, "original_max_position_embeddings": 256}}
PRESETS["kimi-k2-instruct-tiny"] = {**PRESETS["kimi-k2-instruct"], **_TINY}
PRESETS["kimi-k2-thinking-tiny"] = {**PRESETS["kimi-k2-thinking"], **_TINY}


class KimiK2Line(ModelLine):
    name = "kimi_k2"
    model_types = (*BODY_TYPES, WRAPPER_TYPE)
    presets = PRESETS

    def probe(self, config: Mapping[str, Any]) -> Probe:
        probe = super().probe(config)
        if probe.ok and config.get("model_type") == WRAPPER_TYPE:
            text = config.get("text_config") or {}
            if text.get("model_type") not in BODY_TYPES:
                return Probe(False, f"kimi_k25 text_config.model_type {text.get('model_type')!r} is not "
                                    f"{' or '.join(BODY_TYPES)}")
        return probe

    def parse_config(self, config: Mapping[str, Any]) -> KimiConfig:
        return parse(config)

    def weight_shapes(self, cfg: KimiConfig) -> dict[str, tuple[int, ...]]:
        return mla_moe_weight_shapes(cfg.model)

    def ignored_weights(self, cfg: KimiConfig) -> tuple[str, ...]:
        return tuple(cfg.skipped_prefixes())

    def state_spec(self, cfg: KimiConfig) -> list[StateGroup]:
        return [mla_state_group(cfg.model.mla, cfg.model.num_layers)]

    def kernel_plan(self, cfg: KimiConfig) -> list[str]:
        return mla_moe_kernel_plan(cfg.model)

    def num_experts(self, cfg: KimiConfig) -> int:
        return cfg.model.n_routed_experts if cfg.model.has_moe else 0

    def build(self, cfg: KimiConfig, weights, backend, ops):
        """On an expert-parallel rank (`backend.comm`), only its share of the routed experts is loaded, and the
        communicator sums the ranks' routed outputs."""
        _log_skipped(cfg, weights)
        comm = backend.comm
        shard = None if comm is None else expert_shard(cfg.model.n_routed_experts, comm.rank, comm.world_size)
        return MLAMoEDecoder(cfg.model, weights, backend, ops, shard, comm)

    def chat_format(self):
        from .chat import KIMI_CHAT_FORMAT
        return KIMI_CHAT_FORMAT

    def load_tokenizer(self, path: Path) -> Tokenizer:
        from .tokenizer import load_kimi_tokenizer
        return load_kimi_tokenizer(path)

    def max_model_len(self, cfg: KimiConfig) -> int:
        return cfg.model.max_position_embeddings

    def vocab_size(self, cfg: KimiConfig) -> int:
        return cfg.model.vocab_size


def _log_skipped(cfg: KimiConfig, weights: Any) -> None:
    """Name the checkpoint parts the line leaves out (MTP layers, a vision tower)."""
    skipped = cfg.skipped_prefixes()
    counts = dict.fromkeys(skipped, 0)
    for name in weights.names():
        for prefix in skipped:
            if name.startswith(prefix):
                counts[prefix] += 1
    for prefix, n in counts.items():
        if n:
            log.info("skipping the %s %s* (%d tensors): the kimi_k2 line does not run it", skipped[prefix], prefix, n)
