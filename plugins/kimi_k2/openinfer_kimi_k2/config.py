"""Kimi-K2's config.json, parsed into the shared MLA + MoE decoder's config.

Three layouts carry the same DeepSeek-V3 body: `kimi_k2` (Kimi-K2-Instruct / -Thinking, remote code),
`deepseek_v3` (DeepSeek-V3 itself, and Kimi re-saved by transformers), and `kimi_k25` (Kimi-K2.5 / K2.6, a
vision-language wrapper with the body in `text_config` and the checkpoint's names under `language_model.`).
transformers' DeepSeek-V3 always routes with sigmoid scores and noaux_tc (it reads neither topk_method nor
scoring_func), so a config that names another routing is refused rather than served differently.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from openinfer.plugin_api import ConfigError, MLAMoEConfig, RouterConfig, optional, parse_mla_moe, require

BODY_TYPES = ("kimi_k2", "deepseek_v3")
WRAPPER_TYPE = "kimi_k25"
WRAPPER_PREFIX = "language_model."
# the K2.5 wrapper's non-text parts, skipped at load (named in the log)
VISION_PREFIXES = ("vision_tower.", "mm_projector.", "multi_modal_projector.")


@dataclass(frozen=True)
class KimiConfig:
    model: MLAMoEConfig
    num_nextn_predict_layers: int     # MTP layers after the decoder's, skipped
    multimodal: bool                  # a kimi_k25 wrapper: its vision tower is skipped

    def skipped_prefixes(self) -> dict[str, str]:
        """Checkpoint name prefixes the line leaves out -> what they are."""
        p, L = self.model.prefix, self.model.num_layers
        out = {f"{p}model.layers.{L + i}.": "MTP layer" for i in range(self.num_nextn_predict_layers)}
        if self.multimodal:
            out.update({v: "vision tower" for v in VISION_PREFIXES})
        return out


def text_body(config: Mapping[str, Any]) -> tuple[dict[str, Any], str]:
    """(the DeepSeek-V3 body of a config, the checkpoint name prefix)."""
    if config.get("model_type") == WRAPPER_TYPE:
        text = config.get("text_config")
        if not isinstance(text, dict):
            raise ConfigError("config.json of a kimi_k25 checkpoint lacks its text_config")
        body = dict(text)
        if "quantization_config" not in body and config.get("quantization_config"):
            body["quantization_config"] = config["quantization_config"]
        return body, WRAPPER_PREFIX
    return dict(config), ""


def _router(c: Mapping[str, Any], experts: int) -> RouterConfig:
    """The router as transformers' DeepseekV3TopkRouter runs it (its defaults for the fields a config omits)."""
    if c.get("scoring_func", "sigmoid") != "sigmoid":
        raise ConfigError(f"scoring_func {c['scoring_func']!r}: the DeepSeek-V3 architecture routes with sigmoid "
                          "scores")
    if c.get("topk_method", "noaux_tc") != "noaux_tc":
        raise ConfigError(f"topk_method {c['topk_method']!r}: the DeepSeek-V3 architecture routes with noaux_tc")
    g = dict(c)
    router = RouterConfig(top_k=require(g, "num_experts_per_tok", int), scoring="sigmoid", method="noaux_tc",
                          n_group=optional(g, "n_group", int, 8, minimum=1),
                          topk_group=optional(g, "topk_group", int, 4, minimum=1),
                          norm_topk_prob=optional(g, "norm_topk_prob", bool, True),
                          routed_scaling_factor=optional(g, "routed_scaling_factor", float, 2.5, positive=True))
    router.check(experts)
    return router


def parse(config: Mapping[str, Any]) -> KimiConfig:
    c, prefix = text_body(config)
    if c.get("model_type") not in BODY_TYPES:
        raise ConfigError(f"model_type {c.get('model_type')!r} is not a DeepSeek-V3 body ({', '.join(BODY_TYPES)})")
    if c.get("rope_interleave", True) is not True:
        raise ConfigError("rope_interleave: false (rotate-half RoPE on the MLA heads) is not supported; the "
                          "DeepSeek-V3 and Kimi checkpoints use the interleaved pairs")
    model = parse_mla_moe(c, _router(c, require(c, "n_routed_experts", int)), "kimi_k2", prefix)
    return KimiConfig(model, optional(dict(c), "num_nextn_predict_layers", int, 0, minimum=0), prefix == WRAPPER_PREFIX)
