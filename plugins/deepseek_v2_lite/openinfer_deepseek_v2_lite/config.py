"""DeepSeek-V2's config.json (`model_type: deepseek_v2`), parsed and validated.

One parser for every V2 shape: V2-Lite (plain q_proj, greedy routing over 64 experts) and V2 / V2-Chat /
V2.5 (q-LoRA, group_limited_greedy over 160 experts in 8 groups). Layers below first_k_dense_replace
have a dense MLP, the others MoE with shared experts, as transformers builds them.
"""
from __future__ import annotations

from typing import Any, Mapping

from openinfer.plugin_api import ConfigError, MLAMoEConfig, RouterConfig, optional, parse_mla_moe, require

# DeepSeek-V2's MoE gate always scores with a softmax; these are its two routings
TOPK_METHODS = ("greedy", "group_limited_greedy")


def parse(c: Mapping[str, Any]) -> MLAMoEConfig:
    """config.json -> the shared MLA + MoE decoder's config, with DeepSeek-V2's softmax router."""
    if c.get("scoring_func", "softmax") != "softmax":
        raise ConfigError(f"scoring_func {c['scoring_func']!r} is not supported by the deepseek_v2 line (softmax; "
                          "sigmoid routing is DeepSeek-V3's, served by its own line)")
    method = c.get("topk_method") or "greedy"
    if method not in TOPK_METHODS:
        raise ConfigError(f"topk_method {method!r} is not supported by the deepseek_v2 line "
                          f"({', '.join(TOPK_METHODS)})")
    if c.get("norm_topk_prob"):
        # transformers' DeepSeek-V2 ignores the flag while DeepSeek's own code renormalises; no released V2
        # checkpoint sets it, so the line refuses it rather than pick one reading
        raise ConfigError("norm_topk_prob: true is not supported by the deepseek_v2 line (transformers ignores "
                          "it for DeepSeek-V2; every released V2 checkpoint has false)")
    g = dict(c)
    experts = require(g, "n_routed_experts", int)
    router = RouterConfig(top_k=require(g, "num_experts_per_tok", int), scoring="softmax", method=method,
                          n_group=optional(g, "n_group", int, 1, minimum=1),
                          topk_group=optional(g, "topk_group", int, 1, minimum=1), norm_topk_prob=False,
                          routed_scaling_factor=optional(g, "routed_scaling_factor", float, 1.0, positive=True))
    router.check(experts)
    return parse_mla_moe(c, router, "deepseek_v2", default_max_position=2048)
