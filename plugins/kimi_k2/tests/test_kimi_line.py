"""The kimi_k2 line's contract: the three config layouts (kimi_k2, deepseek_v3, kimi_k25's text_config) in both
rope forms, what it refuses and names, the MTP layers and vision tower skipped and logged, tensors in a format it
cannot serve refused at load naming them, and `openinfer synth --num-layers` of its quantized presets."""
from __future__ import annotations

import json
import logging

import numpy as np
import pytest

from openinfer.plugin_api import ConfigError, QuantizedTensorError
from openinfer.testing import EngineArgs, get_plugins, load_rank, read_source, synthesize, with_num_layers
from openinfer_kimi_k2.line import PRESETS, KimiK2Line

LINE = KimiK2Line()
K2 = PRESETS["kimi-k2-instruct"]


def test_real_configs_parse():
    cfg = LINE.parse_config(K2).model
    assert (cfg.num_layers, cfg.n_routed_experts, cfg.router.top_k, cfg.router.method) == (61, 384, 8, "noaux_tc")
    assert cfg.router.scoring == "sigmoid" and cfg.router.norm_topk_prob and cfg.router.routed_scaling_factor == 2.827
    assert cfg.rope.kind == "yarn" and cfg.rope.beta_fast == 1.0 and cfg.quant.method == "fp8"
    thinking = LINE.parse_config(PRESETS["kimi-k2-thinking"]).model
    assert thinking.quant.format_of("model.layers.3.mlp.experts.9.down_proj") == "int4"
    assert thinking.quant.format_of("model.layers.3.mlp.shared_experts.down_proj") == "dense"
    assert thinking.quant.format_of("model.layers.3.self_attn.o_proj") == "dense"


def test_rope_parameters_form_equals_the_legacy_form():
    legacy = dict(K2)
    new = {k: v for k, v in K2.items() if k not in ("rope_theta", "rope_scaling")}
    scaling = {k: v for k, v in K2["rope_scaling"].items() if k != "type"}
    new["rope_parameters"] = {"rope_type": "yarn", "rope_theta": K2["rope_theta"], **scaling}
    assert LINE.parse_config(new).model.rope == LINE.parse_config(legacy).model.rope
    assert LINE.parse_config(dict(K2, model_type="deepseek_v3")).model == LINE.parse_config(K2).model


def test_kimi_k25_wrapper():
    text = {k: v for k, v in PRESETS["kimi-k2-thinking"].items() if k != "quantization_config"}
    wrapper = {"model_type": "kimi_k25", "architectures": ["KimiK25ForConditionalGeneration"],
               "text_config": dict(text, num_nextn_predict_layers=1),
               "vision_config": {"hidden_size": 1152}, "quantization_config": PRESETS["kimi-k2-thinking"]["quantization_config"]}
    assert LINE.probe(wrapper).ok
    cfg = LINE.parse_config(wrapper)
    assert cfg.model.prefix == "language_model." and cfg.model.quant.method == "int4"
    assert set(LINE.ignored_weights(cfg)) == {"language_model.model.layers.61.", "vision_tower.", "mm_projector.",
                                              "multi_modal_projector."}
    shapes = LINE.weight_shapes(cfg)
    assert "language_model.model.layers.60.mlp.experts.383.up_proj.weight_packed" in shapes
    assert "language_model.lm_head.weight" in shapes
    assert not LINE.probe({"model_type": "kimi_k25", "text_config": {"model_type": "llama"}}).ok


@pytest.mark.parametrize("change, field", [
    ({"scoring_func": "softmax"}, "scoring_func"), ({"topk_method": "greedy"}, "topk_method"),
    ({"rope_interleave": False}, "rope_interleave"), ({"num_key_value_heads": 8}, "num_key_value_heads"),
    ({"n_group": 5}, "n_group"), ({"quantization_config": {"quant_method": "awq"}}, "quant_method"),
    ({"quantization_config": dict(K2["quantization_config"], weight_block_size=[64, 64])}, "weight_block_size"),
    ({"model_type": "kimi_k25"}, "text_config"),
])
def test_refusals_name_the_field(change, field):
    with pytest.raises(ConfigError, match=field):
        LINE.parse_config(dict(K2, **change))


@pytest.fixture(scope="module", params=["kimi-k2-thinking-tiny", "kimi-k2-instruct-tiny"])
def synthesized(request, tmp_path_factory):
    out = tmp_path_factory.mktemp(request.param)
    synthesize(request.param, out, num_layers=2)
    return out


def _load(path):
    args = EngineArgs(max_model_len=256, max_num_seqs=2)
    return load_rank(read_source(str(path), args, get_plugins()), args, 0)


def test_synth_num_layers_writes_a_loadable_quantized_checkpoint(synthesized):
    config = json.loads((synthesized / "config.json").read_text())
    assert config["num_hidden_layers"] == 2
    ranked = _load(synthesized)
    model = ranked.runner.model
    assert len(model.layers) == 2 and type(model.layers[1].mlp.w.gate_up).__name__ in ("Int4Weight", "Fp8Weight")
    ranked.runner.profile(ranked.runner.dummy_batch(2, 8))   # a forward over the quantized layers


def test_with_num_layers_keeps_width_and_cuts_layer_lists():
    cfg = with_num_layers({"num_hidden_layers": 4, "hidden_size": 7168, "layer_types": ["a", "b", "c", "d"]}, 2)
    assert cfg == {"num_hidden_layers": 2, "hidden_size": 7168, "layer_types": ["a", "b"]}
    wrapped = with_num_layers({"model_type": "kimi_k25", "text_config": {"num_hidden_layers": 61}}, 3)
    assert wrapped["text_config"]["num_hidden_layers"] == 3
    with pytest.raises(ValueError, match="--num-layers 62"):
        with_num_layers({"num_hidden_layers": 61}, 62)


def test_dummy_preset_at_reduced_depth(kimi_tokenizer_dir):
    """`--load-format dummy --num-layers N` (benchmarks at the real width): the preset cut to N layers, loaded and run."""
    args = EngineArgs(load_format="dummy", num_layers=2, tokenizer=str(kimi_tokenizer_dir), max_model_len=256,
                      max_num_seqs=2)
    src = read_source("kimi-k2-thinking-tiny", args, get_plugins())
    assert src.cfg.model.num_layers == 2 and not any(".layers.2." in n for n in src.shapes)
    ranked = load_rank(src, args, 0)
    assert len(ranked.runner.model.layers) == 2
    ranked.runner.profile(ranked.runner.dummy_batch(2, 8))


def test_num_layers_needs_dummy_weights():
    with pytest.raises(ValueError, match="--load-format dummy"):
        EngineArgs(num_layers=2)
    with pytest.raises(ValueError, match="--num-layers 4 must lie in 1 .. 3"):
        read_source("kimi-k2-thinking-tiny", EngineArgs(load_format="dummy", num_layers=4, tokenizer="."),
                    get_plugins())


def test_unservable_tensor_fails_at_load_naming_it(synthesized, tmp_path):
    """An INT4 expert stored as float (or an FP8 weight stored as bf16) is refused with its name and format."""
    from openinfer.testing import Checkpoint, save_safetensors
    ck = Checkpoint(synthesized)
    shapes = {n: ck.raw(n)[1] for n in ck.names()}
    victim = next(n for n in shapes if n.endswith((".weight_packed", "experts.0.up_proj.weight")))
    kinds = {n: ck.raw(n)[0] for n in shapes}
    kinds[victim] = "F32"
    save_safetensors(tmp_path / "model.safetensors", shapes,
                     lambda n: ck.get(n).astype(np.float32) if n == victim else ck.raw(n)[2], "F32", kinds.get)
    for f in synthesized.iterdir():
        if f.name != "model.safetensors":
            (tmp_path / f.name).write_bytes(f.read_bytes())
    with pytest.raises(QuantizedTensorError, match=f"tensor {victim} is stored as F32"):
        _load(tmp_path)


def test_mtp_layers_are_skipped_and_named(synthesized, tmp_path, caplog):
    from openinfer.testing import Checkpoint, save_safetensors
    ck = Checkpoint(synthesized)
    config = json.loads((synthesized / "config.json").read_text())
    config["num_nextn_predict_layers"] = 1
    mtp = {"model.layers.2.eh_proj.weight": (64, 128), "model.layers.2.enorm.weight": (64,)}
    shapes = {**{n: ck.raw(n)[1] for n in ck.names()}, **mtp}
    kinds = {**{n: ck.raw(n)[0] for n in ck.names()}, **{n: "F32" for n in mtp}}
    save_safetensors(tmp_path / "model.safetensors", shapes,
                     lambda n: np.zeros(mtp[n], np.float32) if n in mtp else ck.raw(n)[2], "BF16", kinds.get)
    (tmp_path / "config.json").write_text(json.dumps(config))
    with caplog.at_level(logging.INFO, logger="openinfer"):
        _load(tmp_path)
    assert "skipping the MTP layer model.layers.2.* (2 tensors)" in caplog.text
    assert "not used by the kimi_k2 line" not in caplog.text
