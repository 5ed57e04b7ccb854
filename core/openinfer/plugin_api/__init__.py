"""The declared plugin API: everything a model-line or kernel-provider plugin may import from the core.

A plugin imports from here (and, for CUDA kernels, from `openinfer.plugin_api.cuda`; for its tests, from
`openinfer.testing`), never from the core's internal modules, so the core can move its files without
breaking plugins. `tests/test_plugin_api.py` keeps the plugins in this repository to it.

Importing this module is cheap and never touches a GPU.
"""
from __future__ import annotations

from ..contract.hookspecs import hookimpl
from ..contract.model_line import Model, ModelLine, Probe, StateGroup
from ..engine.batch import Array, ForwardBatch
from ..kernels.numpy_ops import sequence_runs
from ..kernels.registry import KernelRegistry, Ops
from ..kv.pool import StatePools
from ..layers.attention import AttentionWeights, GQAAttention
from ..layers.mla import (OPS as MLA_OPS, MLADims, MLAttention, MLAWeights, load_mla_weights, mla_softmax_scale,
                          mla_state_group, mla_weight_shapes)
from ..layers.mla_moe_decoder import (MLAMoEConfig, MLAMoEDecoder, mla_moe_kernel_plan, mla_moe_weight_shapes,
                                      parse_mla_moe)
from ..layers.mlp import SwiGLU, load_swiglu, swiglu_shapes
from ..layers.moe import OPS as MOE_OPS, MoE, MoEWeights, RouterConfig, load_moe_weights, moe_weight_shapes
from ..layers.quant_linear import QuantOps, load_linear, quant_ops_needed
from ..layers.rope import RopeConfig, cos_sin, rope_config
from ..loading.config import ConfigError, optional, require
from ..loading.disk_cache import cache_root, write_atomic
from ..loading.weights import WeightSource
from ..parallel import Communicator, expert_shard
from ..quant import QuantScheme, QuantizedTensorError, quant_scheme
from ..quant.scheme import host_linear
from ..sampling.structured import JSON_DUMPS_LAYOUT, lark_json, lark_literal
from ..text.detokenize import partial_suffix_len
from ..text.parsers import (ChatFormat, ContentTrimmer, ParsedDelta, ReasoningParser, SteppedToolCallParser,
                            ThinkTagReasoningParser, ToolCall, ToolCallDelta, ToolCallParser, collect_tool_calls,
                            new_call_id)
from ..text.tiktoken_bpe import bpe_tokenizer_json, load_ranks
from ..text.tokenizer import ChatTemplateError, Tokenizer, byte_level_chars
from ..text.tool_args import convert_value, is_text, param_types, schema_types, with_object_arguments

__all__ = [
    "Array", "AttentionWeights", "ChatFormat", "ChatTemplateError", "ConfigError", "ContentTrimmer", "ForwardBatch",
    "GQAAttention", "KernelRegistry", "Model", "ModelLine", "Ops", "ParsedDelta", "Probe", "ReasoningParser",
    "RopeConfig", "StatePools", "StateGroup", "ThinkTagReasoningParser", "Tokenizer", "ToolCall", "ToolCallDelta",
    "WeightSource", "byte_level_chars", "collect_tool_calls", "cos_sin", "hookimpl", "JSON_DUMPS_LAYOUT", "lark_json",
    "lark_literal", "partial_suffix_len", "optional", "require", "rope_config", "ToolCallParser", "new_call_id",
    "convert_value", "is_text", "param_types", "schema_types", "with_object_arguments",
    "MLA_OPS", "MLADims", "MLAttention", "MLAWeights", "MOE_OPS", "MoE", "MoEWeights", "RouterConfig",
    "load_mla_weights", "load_moe_weights", "mla_softmax_scale", "mla_state_group", "mla_weight_shapes",
    "moe_weight_shapes", "SwiGLU", "load_swiglu",
    "MLAMoEConfig", "MLAMoEDecoder", "mla_moe_kernel_plan", "mla_moe_weight_shapes", "parse_mla_moe", "QuantScheme",
    "QuantizedTensorError", "quant_scheme", "SteppedToolCallParser", "bpe_tokenizer_json", "cache_root", "load_ranks",
    "write_atomic", "Communicator", "expert_shard", "sequence_runs",
    "QuantOps", "host_linear", "load_linear", "quant_ops_needed", "swiglu_shapes",
]
