"""GLM-5 / GLM-5.1 / GLM-5.2 config.json (`model_type: glm_moe_dsa`), parsed and validated.

Every layer is MLA attention with DeepSeek Sparse Attention (DSA): a lightning indexer picks the
`index_topk` keys each query attends to. GLM-5.2's IndexShare runs the indexer only on "full"
layers; a "shared" layer reuses the selection of the last full layer before it and has no indexer
weights. The per-layer list is `indexer_types`, or derived as transformers derives it from
`index_topk_pattern` ("FSSF…") or from `index_topk_freq` / `index_skip_topk_offset`.

Checkpoints are bf16 / float32 or FP8 e4m3 with 128x128 block scales (GLM-5-FP8: `quantization_config`
quant_method "fp8"): every Linear but lm_head, those in `modules_to_not_convert` and the indexer's weights_proj,
which transformers keeps in float32 in any quantized GLM-5 (`_keep_in_fp32_modules`), as the router.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Mapping

from openinfer.plugin_api import (ConfigError, QuantScheme, RopeConfig, optional, quant_scheme, require,
                                  rope_config)

# transformers' GlmMoeDsaPreTrainedModel._keep_in_fp32_modules: never quantized, whatever modules_to_not_convert says
KEEP_FLOAT = (r"re:.*\.indexer\.weights_proj$",)


def indexer_schedule(c: Mapping[str, Any], num_layers: int) -> tuple[str, ...]:
    """Per-layer "full" / "shared", exactly as transformers' GlmMoeDsaConfig derives it."""
    types = c.get("indexer_types")
    if types is None:
        pattern = c.get("index_topk_pattern")
        if pattern is not None:
            if isinstance(pattern, str):
                if set(pattern) - {"F", "S"}:
                    raise ConfigError(f"index_topk_pattern {pattern!r} may only hold F (full) and S (shared)")
                types = [{"F": "full", "S": "shared"}[ch] for ch in pattern]
            elif isinstance(pattern, list):
                types = pattern
            else:
                raise ConfigError(f"index_topk_pattern {pattern!r} must be a string of F / S or a list")
        else:
            freq = max(int(c.get("index_topk_freq", 1)), 1)
            offset = int(c.get("index_skip_topk_offset", 2))
            types = ["full" if max(i - offset + 1, 0) % freq == 0 else "shared" for i in range(num_layers)]
    types = tuple(types)
    if len(types) != num_layers or set(types) - {"full", "shared"}:
        raise ConfigError(f"indexer_types must list {num_layers} entries of 'full' / 'shared', got {list(types)}")
    if types[0] != "full":
        raise ConfigError("indexer_types[0] is 'shared', but a shared layer reuses an earlier full layer's "
                          "selection and layer 0 has none before it")
    return types


def _mlp_types(c: Mapping[str, Any], num_layers: int) -> tuple[str, ...]:
    types = c.get("mlp_layer_types")
    if types is None:
        dense = min(int(c.get("first_k_dense_replace", 3)), num_layers)
        types = ["dense"] * dense + ["sparse"] * (num_layers - dense)
    types = tuple(types)
    if len(types) != num_layers or set(types) - {"dense", "sparse"}:
        raise ConfigError(f"mlp_layer_types must list {num_layers} entries of 'dense' / 'sparse', got {list(types)}")
    return types


def _quant(c: Mapping[str, Any]) -> QuantScheme:
    scheme = quant_scheme(c)   # an unknown quant_method / fmt / block size is refused there, naming the field
    if scheme.method not in ("dense", "fp8"):
        raise ConfigError(f"quantization_config (quant_method {c['quantization_config'].get('quant_method')!r}) is "
                          "not supported by the glm52 line: it serves bf16 / float32 checkpoints and FP8 e4m3 ones "
                          "with 128x128 block scales (quant_method 'fp8')")
    return replace(scheme, keep_dense=scheme.keep_dense + KEEP_FLOAT)


def _reject(c: Mapping[str, Any], key: str, allowed: tuple[Any, ...]) -> None:
    if key in c and c[key] is not None and c[key] not in allowed:
        raise ConfigError(f"{key} {c[key]!r} is not supported by the glm52 line (supported: "
                          f"{', '.join(repr(a) for a in allowed)})")


@dataclass(frozen=True)
class Glm52Config:
    hidden_size: int
    intermediate_size: int            # dense layers' MLP
    moe_intermediate_size: int        # one routed expert (shared experts: × n_shared_experts)
    num_heads: int
    q_lora_rank: int
    kv_lora_rank: int
    qk_nope_head_dim: int
    qk_rope_head_dim: int
    v_head_dim: int
    n_routed_experts: int
    n_shared_experts: int
    num_experts_per_tok: int
    n_group: int
    topk_group: int
    norm_topk_prob: bool
    routed_scaling_factor: float
    mlp_layer_types: tuple[str, ...]  # "dense" or "sparse" (MoE) per layer
    index_n_heads: int
    index_head_dim: int
    index_topk: int
    indexer_types: tuple[str, ...]    # "full" (own indexer) or "shared" per layer
    indexer_rope_interleave: bool     # the indexer's RoPE on its first qk_rope_head_dim dims: pairs or halves
    vocab_size: int
    max_position_embeddings: int
    rms_norm_eps: float
    tie_word_embeddings: bool
    rope: RopeConfig                  # rotary_dim = qk_rope_head_dim
    num_mtp_layers: int               # next-token-prediction layers after the last one (not served)
    quant: QuantScheme = field(default_factory=QuantScheme)   # the Linears' storage formats

    @property
    def num_layers(self) -> int:
        return len(self.indexer_types)

    @property
    def qk_head_dim(self) -> int:
        return self.qk_nope_head_dim + self.qk_rope_head_dim

    @property
    def full_layers(self) -> tuple[int, ...]:
        """The layers that run their own indexer (and hold indexer keys), in order."""
        return tuple(i for i, t in enumerate(self.indexer_types) if t == "full")

    @classmethod
    def from_dict(cls, c: Mapping[str, Any]) -> Glm52Config:
        c = dict(c)
        n = require(c, "num_hidden_layers", int)
        heads = require(c, "num_attention_heads", int)
        if c.get("q_lora_rank") is None:
            raise ConfigError("q_lora_rank is null: the glm52 line needs the q-LoRA projection (its indexer reads "
                              "the normalised q_a_proj output)")
        if c.get("attention_bias"):
            raise ConfigError("attention_bias: true is not supported by the glm52 line")
        if c.get("mlp_bias"):
            raise ConfigError("mlp_bias: true is not supported by the glm52 line")
        _reject(c, "hidden_act", ("silu",))
        _reject(c, "scoring_func", ("sigmoid",))
        _reject(c, "topk_method", ("noaux_tc",))
        _reject(c, "moe_layer_freq", (1,))
        if c.get("rope_interleave", True) is not True:
            raise ConfigError("rope_interleave: false is not supported by the glm52 line (GLM's MLA rotates "
                              "interleaved pairs)")
        experts, groups = require(c, "n_routed_experts", int), optional(c, "n_group", int, 1, minimum=1)
        if experts % groups:
            raise ConfigError(f"n_routed_experts {experts} is not a multiple of n_group {groups}")
        rope_dim, index_dim = require(c, "qk_rope_head_dim", int), require(c, "index_head_dim", int)
        if rope_dim % 2 or index_dim < rope_dim:
            raise ConfigError(f"index_head_dim {index_dim} must hold the qk_rope_head_dim {rope_dim} rotary dims "
                              "(an even number)")
        topk = require(c, "index_topk", int)
        return cls(
            hidden_size=require(c, "hidden_size", int), intermediate_size=require(c, "intermediate_size", int),
            moe_intermediate_size=require(c, "moe_intermediate_size", int), num_heads=heads,
            q_lora_rank=require(c, "q_lora_rank", int), kv_lora_rank=require(c, "kv_lora_rank", int),
            qk_nope_head_dim=require(c, "qk_nope_head_dim", int), qk_rope_head_dim=rope_dim,
            v_head_dim=require(c, "v_head_dim", int), n_routed_experts=experts,
            n_shared_experts=optional(c, "n_shared_experts", int, 0, minimum=0),
            num_experts_per_tok=require(c, "num_experts_per_tok", int), n_group=groups,
            topk_group=optional(c, "topk_group", int, 1, minimum=1),
            norm_topk_prob=optional(c, "norm_topk_prob", bool, True),
            routed_scaling_factor=optional(c, "routed_scaling_factor", float, 2.5, positive=True),
            mlp_layer_types=_mlp_types(c, n),
            index_n_heads=require(c, "index_n_heads", int), index_head_dim=index_dim, index_topk=topk,
            indexer_types=indexer_schedule(c, n),
            indexer_rope_interleave=optional(c, "indexer_rope_interleave", bool, True),
            vocab_size=require(c, "vocab_size", int),
            max_position_embeddings=optional(c, "max_position_embeddings", int, 202752, minimum=1),
            rms_norm_eps=optional(c, "rms_norm_eps", float, 1e-5, positive=True),
            tie_word_embeddings=optional(c, "tie_word_embeddings", bool, False), rope=rope_config(c, rope_dim),
            num_mtp_layers=optional(c, "num_nextn_predict_layers", int, 0, minimum=0), quant=_quant(c))
