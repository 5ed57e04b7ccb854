"""The glm52 line on a GLM-5-FP8 layout (every Linear but lm_head, the router and the indexer's weights_proj in
FP8 e4m3 with 128x128 block scales) against transformers holding the dequantized weights: logits and greedy
tokens, the weights kept FP8 on the backend, the memory plan's FP8 bytes, and the checkpoints it refuses."""
from __future__ import annotations

import json
import math
import shutil

import numpy as np
import pytest

from openinfer.plugin_api import ConfigError, QuantizedTensorError
from openinfer.testing import (Checkpoint, EngineArgs, Fp8Weight, build_engine, get_plugins, memory_need,
                               read_model_config, save_safetensors)
from openinfer.testing.engine import generate, greedy, prompt_logits
from openinfer.testing.hf_reference import hf_greedy, hf_logits
from openinfer.testing.parallel import assert_ranks_match, replay_on_ranks
from openinfer_glm52.line import Glm52Line
from test_glm52_expert_parallel import EP_ARGS, run_one_rank
from test_glm52_fidelity import assert_logits_close, chat_prompt


def test_logits_and_greedy_match_transformers(fp8):
    ckpt, hf = fp8
    eng = build_engine(str(ckpt), EngineArgs())
    ids = chat_prompt(eng)
    assert len(ids) > 16   # longer than index_topk: the attention is sparse
    assert_logits_close(prompt_logits(eng, ids), hf_logits(hf, ids))
    [(tokens, _, _)] = generate(eng, [ids], greedy(12))
    assert tokens == hf_greedy(hf, ids, 12)


def test_batched_chunked_and_expert_parallel(fp8):
    """Batched prompts in 24-token chunks and a prefix-cache hit give transformers' tokens; EP = 2 ranks (threads)
    holding half the FP8 experts each replay the steps with equal logits."""
    ckpt, hf = fp8
    steps, tokens, prompts = run_one_rank(ckpt)
    assert tokens == [hf_greedy(hf, p, 8) for p in prompts + prompts[-1:]]
    per_rank, recorders = replay_on_ranks(str(ckpt), EP_ARGS, get_plugins(), steps, 2)
    assert_ranks_match(steps, per_rank, recorders)


def test_weights_stay_fp8_on_the_backend(fp8):
    model = build_engine(str(fp8[0]), EngineArgs()).runner.model
    dense, moe = model.layers[0], model.layers[1]
    for w in (dense.attn.w.o, dense.indexer.w.wq_b, dense.indexer.w.wk, dense.mlp.down, moe.mlp.w.gate_up,
              moe.mlp.w.down):
        assert isinstance(w, Fp8Weight) and w.data.dtype == np.uint8
    assert moe.mlp.w.gate_up.data.shape == (8, 64, 64)   # 8 experts of gate + up rows (2 x 32)
    assert isinstance(dense.indexer.w.weights_proj, np.ndarray) and dense.indexer.w.weights_proj.dtype == np.float32
    plan = Glm52Line().kernel_plan(model.cfg)
    assert "linear_fp8" in plan and "moe_experts_fp8" in plan


def test_memory_plan_counts_fp8_bytes(fp8):
    line = Glm52Line()
    cfg = line.parse_config(read_model_config(str(fp8[0])))
    shapes = line.weight_shapes(cfg)
    ck = Checkpoint(fp8[0])
    assert {n: ck.raw(n)[1] for n in shapes} == shapes
    assert "model.layers.0.self_attn.indexer.wq_b.weight_scale_inv" in shapes
    assert "model.layers.0.self_attn.indexer.weights_proj.weight_scale_inv" not in shapes
    fp8_names = [n for n in shapes if n + "_scale_inv" in shapes]
    assert fp8_names and all(ck.raw(n)[0] == "F8_E4M3" for n in fp8_names)
    want = sum(math.prod(s) * (1 if n in fp8_names else 2) for n, s in shapes.items())
    assert memory_need(line, cfg, shapes, ck, 2, 1, 64, 16).weights_per_rank == want
    dense = sum(math.prod(s) * 2 for n, s in shapes.items() if not n.endswith("_scale_inv"))
    assert want < dense


def _copy(src, dst, config_change=None, retype=None):
    """`src` copied to `dst`, its config updated by `config_change`, tensor `retype` stored as F32."""
    for f in src.iterdir():
        if f.is_file():
            shutil.copy(f, dst / f.name)
    if config_change is not None:
        config = json.loads((src / "config.json").read_text())
        (dst / "config.json").write_text(json.dumps({**config, **config_change}))
    if retype is not None:
        ck = Checkpoint(src)
        kinds = {n: "F32" if n == retype else ck.raw(n)[0] for n in ck.names()}
        save_safetensors(dst / "model.safetensors", {n: ck.raw(n)[1] for n in ck.names()},
                         lambda n: ck.get(n).astype(np.float32) if n == retype else ck.raw(n)[2], "F32", kinds.get)


@pytest.mark.parametrize("quant, message", [
    ({"quant_method": "gptq", "bits": 4}, "quant_method 'gptq'"),
    ({"quant_method": "fp8", "fmt": "e4m3", "weight_block_size": [64, 64]}, "weight_block_size"),
    ({"quant_method": "compressed-tensors", "format": "pack-quantized",
      "config_groups": {"g": {"targets": ["Linear"], "weights": {"num_bits": 4, "type": "int", "symmetric": True,
                                                                "strategy": "group", "group_size": 32}}}},
     "quant_method 'compressed-tensors'.*glm52"),
])
def test_unsupported_quantization_fails_at_load_naming_it(fp8, tmp_path, quant, message):
    _copy(fp8[0], tmp_path, {"quantization_config": quant})
    with pytest.raises(ConfigError, match=message):
        build_engine(str(tmp_path), EngineArgs())


def test_fp8_linear_stored_as_float_fails_at_load_naming_it(fp8, tmp_path):
    victim = "model.layers.1.self_attn.indexer.wk.weight"
    _copy(fp8[0], tmp_path, retype=victim)
    with pytest.raises(QuantizedTensorError, match=f"tensor {victim} is stored as F32"):
        build_engine(str(tmp_path), EngineArgs())
