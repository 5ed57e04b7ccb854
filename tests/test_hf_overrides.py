"""`--hf-overrides JSON`: config.json fields set before the model line reads the config (serve, generate and
bench latency), for a checkpoint folder, a preset and the demo model alike."""
from __future__ import annotations

import json

import pytest

from openinfer.cli import build_parser
from openinfer.loading.config import ConfigError, with_overrides
from openinfer.testing import EngineArgs, build_engine, get_plugins, read_source


def test_an_object_merges_into_the_field_and_anything_else_replaces_it():
    config = {"rope_parameters": {"rope_type": "default", "rope_theta": 1e6}, "layer_types": ["a", "b"], "n": 1}
    got = with_overrides(config, {"rope_parameters": {"rope_theta": 8e6}, "layer_types": ["c"], "new": {"x": 1}})
    assert got == {"rope_parameters": {"rope_type": "default", "rope_theta": 8e6}, "layer_types": ["c"], "n": 1,
                   "new": {"x": 1}}
    assert config["rope_parameters"]["rope_theta"] == 1e6   # the input is left as it was


def test_the_demo_model_is_built_from_the_overridden_config():
    eng = build_engine(None, EngineArgs(hf_overrides={"max_position_embeddings": 512}))
    assert eng.max_model_len == 512


def test_a_checkpoint_is_detected_after_the_overrides(tmp_path):
    """An override may name the architecture the checkpoint folder's config.json lacks (read_source only reads the
    config here: dummy weights)."""
    config = {**get_plugins().preset("qwen3-tiny")[1], "model_type": "unknown", "architectures": ["Unknown"]}
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="unknown"):
        read_source(str(tmp_path), EngineArgs(load_format="dummy"), get_plugins())
    fixed = {"model_type": "qwen3", "architectures": ["Qwen3ForCausalLM"], "num_hidden_layers": 1}
    src = read_source(str(tmp_path), EngineArgs(load_format="dummy", hf_overrides=fixed), get_plugins())
    assert src.line.name == "qwen3" and src.cfg.num_layers == 1


def test_a_value_the_line_refuses_is_named_at_load():
    with pytest.raises(ConfigError, match="num_hidden_layers"):
        read_source("qwen3-tiny", EngineArgs(load_format="dummy", hf_overrides={"num_hidden_layers": "two"}),
                    get_plugins())


@pytest.mark.parametrize("command", [["serve"], ["generate", "hi"], ["bench", "latency"]])
@pytest.mark.parametrize("text, why", [("{index_topk: 4}", "not valid JSON"), ("[1, 2]", "must be a JSON object")])
def test_bad_json_is_refused_naming_the_flag(command, text, why, capsys):
    with pytest.raises(SystemExit) as e:
        build_parser().parse_args([*command, "--hf-overrides", text])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert "argument --hf-overrides" in err and why in err


def test_the_flag_reaches_the_engine_args():
    from openinfer.cli import _engine_args
    a = build_parser().parse_args(["serve", "--hf-overrides", '{"index_topk": 65536}'])
    assert _engine_args(a).hf_overrides == {"index_topk": 65536}
    assert _engine_args(build_parser().parse_args(["serve"])).hf_overrides == {}
