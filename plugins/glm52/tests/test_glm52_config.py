"""GLM-5.x config.json parsing: the real shapes, the IndexShare schedule as transformers derives it, and
refusals that name the field."""
from __future__ import annotations

import pytest

from openinfer.plugin_api import ConfigError
from openinfer_glm52.config import Glm52Config, indexer_schedule
from openinfer_glm52.line import PRESETS


def test_glm52_schedule_is_21_full_layers():
    cfg = Glm52Config.from_dict(PRESETS["glm-5.2"])
    assert cfg.full_layers == (0, 1, 2) + tuple(range(6, 78, 4))
    assert len(cfg.full_layers) == 21 and cfg.num_layers == 78
    assert cfg.mlp_layer_types == ("dense",) * 3 + ("sparse",) * 75
    assert (cfg.rope.theta, cfg.max_position_embeddings, cfg.num_mtp_layers) == (8e6, 1048576, 1)
    assert cfg.qk_head_dim == 256 and cfg.indexer_rope_interleave


def test_glm5_has_an_indexer_on_every_layer():
    cfg = Glm52Config.from_dict(PRESETS["glm-5"])
    assert cfg.full_layers == tuple(range(78)) and cfg.rope.theta == 1e6


@pytest.mark.parametrize("kw", [dict(index_topk_freq=4, index_skip_topk_offset=3),
                                dict(index_topk_freq=2, index_skip_topk_offset=2),
                                dict(index_topk_pattern="FFSFSS"), dict()])
def test_schedule_matches_transformers(kw):
    pytest.importorskip("transformers")
    from transformers import GlmMoeDsaConfig
    n = 6 if "index_topk_pattern" in kw else 13
    want = GlmMoeDsaConfig(num_hidden_layers=n, **kw).indexer_types
    assert list(indexer_schedule(kw, n)) == want


def test_indexer_types_win_over_the_schedule():
    types = ["full", "shared", "full"]
    assert indexer_schedule({"indexer_types": types, "index_topk_freq": 1}, 3) == tuple(types)


@pytest.mark.parametrize("change, field", [
    ({"indexer_types": ["shared"] + ["full"] * 77}, "indexer_types[0]"),
    ({"indexer_types": ["full"] * 5}, "indexer_types"),
    ({"index_topk_pattern": "FXS"}, "index_topk_pattern"),
    ({"mlp_layer_types": ["dense", "moe"] * 39}, "mlp_layer_types"),
    ({"q_lora_rank": None}, "q_lora_rank"),
    ({"scoring_func": "softmax"}, "scoring_func"),
    ({"rope_interleave": False}, "rope_interleave"),
    ({"index_head_dim": 32}, "index_head_dim"),
    ({"n_group": 3}, "n_group"),
    ({"quantization_config": {"quant_method": "gptq"}}, "quant_method 'gptq'"),
    ({"quantization_config": {"quant_method": "fp8", "fmt": "e5m2"}}, "quantization_config.fmt"),
    ({"attention_bias": True}, "attention_bias"),
    ({"index_topk_pattern": 3}, "index_topk_pattern"),
    ({"index_topk": 0}, "'index_topk' is 0"),
    ({"max_position_embeddings": 0}, "'max_position_embeddings' is 0"),
    ({"rms_norm_eps": 0}, "'rms_norm_eps' is 0"),
    ({"topk_group": 0}, "'topk_group' is 0"),
    ({"norm_topk_prob": "yes"}, "'norm_topk_prob' has type str"),
])
def test_refusals_name_the_field(change, field):
    with pytest.raises(ConfigError, match=field.replace("[", r"\[")):
        Glm52Config.from_dict({**PRESETS["glm-5.2"], **change})


def test_indexer_rope_layout_is_read_from_the_config():
    assert Glm52Config.from_dict(PRESETS["glm-5.2"]).indexer_rope_interleave is True
    assert Glm52Config.from_dict({**PRESETS["glm-5.2"], "indexer_rope_interleave": False}).indexer_rope_interleave \
        is False


def test_fp8_scheme_keeps_weights_proj_in_float():
    """GLM-5-FP8's config: every Linear FP8 but lm_head and the indexer's weights_proj (transformers keeps it in
    float32 in any quantized GLM-5, listed or not); modules_to_not_convert adds to them."""
    quant = {"quant_method": "fp8", "fmt": "e4m3", "weight_block_size": [128, 128],
             "modules_to_not_convert": ["model.layers.0.mlp.down_proj"]}
    scheme = Glm52Config.from_dict({**PRESETS["glm-5"], "quantization_config": quant}).quant
    p = "model.layers.3."
    for module in ("self_attn.q_a_proj", "self_attn.kv_b_proj", "self_attn.indexer.wq_b", "self_attn.indexer.wk",
                   "mlp.experts.7.up_proj", "mlp.shared_experts.down_proj"):
        assert scheme.format_of(p + module) == "fp8", module
    for module in (p + "self_attn.indexer.weights_proj", "lm_head", "model.layers.0.mlp.down_proj"):
        assert scheme.format_of(module) == "dense", module
    assert Glm52Config.from_dict(PRESETS["glm-5"]).quant.method == "dense"
