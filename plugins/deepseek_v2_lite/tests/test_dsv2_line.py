"""The DeepSeek-V2 line beyond fidelity: an expert shard it cannot hold, checkpoints it must refuse at load
(naming what is wrong), presets, `openinfer synth` and --load-format dummy."""
from __future__ import annotations

import json
import math
import shutil

import numpy as np
import pytest

from openinfer.plugin_api import ConfigError
from openinfer.testing import read_model_config
from openinfer.testing import EngineArgs, build_engine
from openinfer.testing import NumpyBackend
from openinfer.testing import LoadError
from openinfer.testing import get_plugins
from openinfer.testing import synthesize
from openinfer.testing.engine import generate, greedy
from openinfer.testing import Checkpoint
from openinfer_deepseek_v2_lite.line import PRESETS, DeepseekV2Line

from dsv2_tiny import VOCAB


def test_a_shard_past_the_experts_is_refused(full):
    """Expert parallelism (test_dsv2_expert_parallel.py) gives each rank an even shard; the model refuses any
    shard its experts cannot hold."""
    from openinfer.plugin_api import MLAMoEDecoder
    ckpt, _ = full
    plugins = get_plugins()
    line = plugins.lines["deepseek_v2"]
    cfg = line.parse_config(read_model_config(ckpt))
    ops = plugins.kernels.resolve(line.kernel_plan(cfg), "numpy", "float32")
    with pytest.raises(ValueError, match=r"expert shard \(6, 3\) does not fit 8 routed experts"):
        MLAMoEDecoder(cfg, Checkpoint(ckpt), NumpyBackend(), ops, (6, 3))


def _copy(ckpt, tmp_path, config_edit=None, tensors_edit=None):
    out = tmp_path / "ckpt"
    shutil.copytree(ckpt, out)
    if config_edit:
        config = json.loads((out / "config.json").read_text())
        config_edit(config)
        (out / "config.json").write_text(json.dumps(config))
    if tensors_edit:
        from safetensors.numpy import load_file, save_file
        tensors = load_file(out / "model.safetensors")
        tensors_edit(tensors)
        save_file(tensors, out / "model.safetensors")
    return out


@pytest.mark.parametrize("edit, error", [
    (lambda c: c.update(topk_method="noaux_tc"), r"topk_method 'noaux_tc' is not supported"),
    (lambda c: c.update(scoring_func="sigmoid"), r"scoring_func 'sigmoid' is not supported"),
    (lambda c: c.update(norm_topk_prob=True), r"norm_topk_prob: true is not supported"),
    (lambda c: c.update(topk_method="group_limited_greedy", n_group=3, topk_group=1), r"n_group 3 must divide"),
    (lambda c: c.update(num_experts_per_tok=9), r"num_experts_per_tok 9 must lie in 1 \.\. n_routed_experts \(8\)"),
    (lambda c: c.update(num_key_value_heads=2), r"num_key_value_heads 2 differs"),
    (lambda c: c.pop("kv_lora_rank"), r"config.json lacks 'kv_lora_rank'"),
    (lambda c: c.update(moe_layer_freq=2), r"moe_layer_freq 2 is not supported"),
    # values of the right name and the wrong kind or range, which would load and compute garbage or crash later
    (lambda c: c.update(kv_lora_rank=0), r"field 'kv_lora_rank' is 0; it must be at least 1"),
    (lambda c: c.update(max_position_embeddings=0), r"field 'max_position_embeddings' is 0; it must be at least 1"),
    (lambda c: c.update(rms_norm_eps=-1e-6), r"field 'rms_norm_eps' is -1e-06; it must be above 0"),
    (lambda c: c.update(routed_scaling_factor=0), r"field 'routed_scaling_factor' is 0; it must be above 0"),
    (lambda c: c.update(tie_word_embeddings="yes"), r"field 'tie_word_embeddings' has type str"),
    (lambda c: c.update(n_shared_experts="2"), r"field 'n_shared_experts' has type str"),
    # (transformers writes the rope fields as rope_parameters)
    (lambda c: c["rope_parameters"].update(rope_theta=0), r"rope_theta 0 must be a number above 0"),
    (lambda c: c["rope_parameters"].update(factor="4"), r"factor '4' must be a number above 0"),
    (lambda c: c.update(eos_token_id="1"), r"end-of-sequence ids \['1'\] are not token ids"),
])
def test_configs_the_line_cannot_serve_fail_at_load_naming_the_field(lite, tmp_path, edit, error):
    with pytest.raises(ConfigError, match=error):
        build_engine(str(_copy(lite[0], tmp_path, config_edit=edit)), EngineArgs())


def test_a_missing_tensor_fails_at_load_naming_it(lite, tmp_path):
    name = "model.layers.2.mlp.experts.5.down_proj.weight"
    ckpt = _copy(lite[0], tmp_path, tensors_edit=lambda t: t.pop(name))
    with pytest.raises(LoadError, match=f"lacks 1 tensor.*{name.replace('.', '[.]')}"):
        build_engine(str(ckpt), EngineArgs())


def test_a_tensor_of_the_wrong_shape_fails_at_load_naming_it(lite, tmp_path):
    name = "model.layers.1.self_attn.kv_b_proj.weight"
    ckpt = _copy(lite[0], tmp_path, tensors_edit=lambda t: t.update({name: t[name][:, :16].copy()}))
    with pytest.raises(LoadError, match=rf"tensor {name} has shape \(128, 16\), config.json implies \(128, 32\)"):
        build_engine(str(ckpt), EngineArgs())


def test_a_q_lora_config_wants_the_q_lora_tensors(lite, tmp_path):
    """A config that says q-LoRA against a checkpoint with a plain q_proj: refused, naming the tensors."""
    ckpt = _copy(lite[0], tmp_path, config_edit=lambda c: c.update(q_lora_rank=24))
    with pytest.raises(LoadError, match=r"q_a_layernorm|q_a_proj|q_b_proj"):
        build_engine(str(ckpt), EngineArgs())


def test_presets_are_the_real_checkpoints_sizes():
    """V2-Lite: 15.7B parameters, the full V2: 236B (their model cards); the latent cache is 576 values a
    token a layer."""
    line = DeepseekV2Line()
    sizes = {}
    for name in ("deepseek-v2-lite", "deepseek-v2"):
        cfg = line.parse_config(PRESETS[name])
        sizes[name] = sum(math.prod(s) for s in line.weight_shapes(cfg).values()) / 1e9
        [group] = line.state_spec(cfg)
        assert (group.name, dict(group.parts), group.layers) == ("mla", {"latent": (576,)}, cfg.num_layers)
    assert sizes["deepseek-v2-lite"] == pytest.approx(15.7, abs=0.05)
    assert sizes["deepseek-v2"] == pytest.approx(236, abs=1)
    full = line.parse_config(PRESETS["deepseek-v2"])
    assert (full.mla.q_lora_rank, full.router.method, full.router.n_group, full.router.topk_group) == \
        (1536, "group_limited_greedy", 8, 3)


def test_synth_preset_and_dummy_weights_serve_on_the_cpu(tmp_path, tokenizer_dir):
    """`openinfer synth --preset deepseek-v2-lite-tiny` writes a checkpoint that loads and generates; loading
    its config with --load-format dummy draws the same weights (same seed) and gives the same tokens."""
    out = tmp_path / "synth"
    synthesize("deepseek-v2-lite-tiny", out, dtype="F32")
    for f in tokenizer_dir.iterdir():
        shutil.copy(f, out / f.name)
    ids = [int(t) for t in np.random.default_rng(2).integers(2, VOCAB, 30)]
    [(tokens, _, _)] = generate(build_engine(str(out), EngineArgs()), [ids], greedy(8))
    [(dummy, _, _)] = generate(build_engine(str(out), EngineArgs(load_format="dummy")), [ids], greedy(8))
    assert tokens == dummy and len(tokens) == 8


def test_a_preset_loads_with_a_tokenizer_given_and_is_refused_without(tmp_path, tokenizer_dir):
    """The line ships no tokenizer: a preset with dummy weights needs --tokenizer, and then generates."""
    with pytest.raises(LoadError, match="--tokenizer DIR"):
        build_engine("deepseek-v2-lite-tiny", EngineArgs(load_format="dummy"))
    with pytest.raises(LoadError, match="no such folder"):
        build_engine("deepseek-v2-lite-tiny", EngineArgs(load_format="dummy", tokenizer=str(tmp_path / "absent")))
    engine = build_engine("deepseek-v2-lite-tiny", EngineArgs(load_format="dummy", tokenizer=str(tokenizer_dir)))
    [(tokens, _, _)] = generate(engine, [[5, 6, 7, 8]], greedy(4))
    assert len(tokens) == 4
