"""Detection, presets, the state spec and checkpoint layouts of the Qwen3.5 line."""
from __future__ import annotations

import logging
import math
import shutil

import numpy as np
import pytest

from openinfer.testing import EngineArgs, build_engine, detect_line, get_plugins, save_safetensors
from openinfer.testing.engine import prompt_logits
from openinfer_qwen35.line import PRESETS, Qwen35Line


def test_detects_real_and_text_only_configs_and_not_qwen3():
    plugins = get_plugins()
    assert detect_line(PRESETS["qwen3.5-4b"], plugins, "4b").name == "qwen35"
    assert detect_line(dict(PRESETS["qwen3.5-9b"]["text_config"]), plugins, "text").name == "qwen35"
    assert not Qwen35Line().probe({"model_type": "qwen3"}).ok


@pytest.mark.parametrize("preset, billions, tied", [("qwen3.5-4b", 4.21, True), ("qwen3.5-9b", 8.95, False),
                                                    ("qwen3.5-27b", 26.9, False)])
def test_presets_have_the_real_shapes(preset, billions, tied):
    line = Qwen35Line()
    cfg = line.parse_config(PRESETS[preset])
    shapes = line.weight_shapes(cfg)
    assert sum(math.prod(s) for s in shapes.values()) / 1e9 == pytest.approx(billions, abs=0.01)
    assert ("lm_head.weight" in shapes) != tied and cfg.prefix == "model.language_model."
    assert cfg.rope.rotary_dim == 64 and cfg.layer_types[3] == "full_attention" == cfg.layer_types[-1]
    kv, gdn = line.state_spec(cfg)
    assert (kv.kind, kv.layers, gdn.kind, gdn.layers, gdn.dtype) == ("paged", cfg.num_layers // 4, "slots",
                                                                     cfg.num_layers * 3 // 4, "float32")
    nv = cfg.linear_num_value_heads
    assert dict(gdn.parts) == {"conv": (3, 2 * 16 * 128 + nv * 128), "ssm": (nv, 128, 128)}


def test_real_layout_skips_vision_and_mtp_tensors(untied, tmp_path, caplog):
    ckpt, _ = untied
    for f in ckpt.iterdir():
        shutil.copy(f, tmp_path / f.name)
    shapes = {"mtp.fc.weight": (64, 128), "mtp.layers.0.input_layernorm.weight": (64,)}
    save_safetensors(tmp_path / "mtp.safetensors", shapes, lambda n: np.ones(shapes[n], np.float32), "F32")
    with caplog.at_level(logging.WARNING, logger="openinfer.loading.loader"):
        eng = build_engine(str(tmp_path), EngineArgs())
    # the tiny model's 256 rows hold none of the borrowed tokenizer's end ids: that warning is not about tensors
    assert not [r for r in caplog.records if "end-of-sequence" not in r.getMessage()]
    ids = [5, 6, 7, 8, 9]
    np.testing.assert_array_equal(prompt_logits(eng, ids), prompt_logits(build_engine(str(ckpt), EngineArgs()), ids))


def test_synthesized_tiny_preset_serves_consistently(tmp_path):
    """`openinfer synth` output of the tiny preset (dummy weights) loads and decodes the same
    alone, batched, chunked and from a prefix hit."""
    from openinfer.testing import synthesize
    from openinfer.testing.engine import generate, greedy
    synthesize("qwen3.5-tiny", tmp_path, dtype="F32")   # writes the genuine Qwen3.5 tokenizer too
    prompts = [[int(t) for t in np.random.default_rng(i).integers(0, 151000, size=20 + 7 * i)] for i in range(3)]
    eng = build_engine(str(tmp_path), EngineArgs(block_size=16))
    alone = [generate(eng, [p], greedy(10))[0][0] for p in prompts]
    batched = generate(eng, prompts, greedy(10))
    assert [out for out, _, _ in batched] == alone and [c for _, _, c in batched] == [16, 16, 32]
    chunked = build_engine(str(tmp_path), EngineArgs(max_num_batched_tokens=6, enable_prefix_caching=False))
    assert [out for out, _, _ in generate(chunked, prompts, greedy(10))] == alone


def test_a_preset_name_loads_with_dummy_weights(tmp_path):
    """`--model qwen3.5-4b --load-format dummy` (benchmarks): the preset's config and the line's
    tokenizer, no folder; the same model as a synthesized folder loaded with dummy weights."""
    from openinfer.testing import LoadError, synthesize
    synthesize("qwen3.5-tiny", tmp_path, dtype="F32")
    by_name = build_engine("qwen3.5-tiny", EngineArgs(load_format="dummy"))
    by_dir = build_engine(str(tmp_path), EngineArgs(load_format="dummy"))
    assert by_name.name == "qwen3.5-tiny" and by_name.vocab_size == 248320
    np.testing.assert_array_equal(prompt_logits(by_name, [5, 6, 7]), prompt_logits(by_dir, [5, 6, 7]))
    assert by_name.tokenizer.encode("hello world") == by_dir.tokenizer.encode("hello world")
    with pytest.raises(LoadError, match="--load-format dummy"):
        build_engine("qwen3.5-tiny", EngineArgs())
