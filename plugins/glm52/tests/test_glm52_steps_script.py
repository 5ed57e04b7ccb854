"""scripts/gpu_glm52_steps.sh and scripts/glm52_steps.py on the CPU: the floors' arithmetic at GLM-5.2's real shapes
against sums written out by hand, and the whole script at the tiny preset (its sparse and dense runs, the summary)."""
from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from argparse import Namespace
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
POINTS = [(1, 128), (1, 256), (4, 128)]


def _script():
    spec = importlib.util.spec_from_file_location("glm52_steps", ROOT / "scripts" / "glm52_steps.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module   # its dataclass looks its module up there
    spec.loader.exec_module(module)
    return module


steps = _script()


def test_glm52_five_layers_bytes_by_hand():
    """Layers 0-2 dense MLP with their own indexer, 3-4 MoE sharing layer 2's selection; bf16 but the float32 routers
    and weights_proj."""
    m = steps.model_shape("glm-5.2", 5)
    H, V, E = 6144, 154880, 256
    mla = H * 2048 + 2048 * 64 * 256 + H * 576 + 512 * 64 * (192 + 256) + 64 * 256 * H + 2048 + 512   # + 2 norms
    indexer = 2048 * 32 * 128 + H * 128 + 2 * 128                  # wq_b, wk, k_norm (weights_proj apart)
    dense_mlp, expert, shared = 3 * H * 12288, 3 * H * 2048, 3 * H * 2048
    router = 4 * (E * H + E)                                       # float32 gate and e_score_correction_bias
    layer_norms = 2 * H
    bf16 = 2 * (2 * V * H + H + 5 * (mla + layer_norms) + 3 * (indexer + dense_mlp) + 2 * (E * expert + shared))
    assert m.total == bf16 + 2 * router + 3 * 4 * 32 * H
    assert m.expert == 2 * expert and m.weights_proj == 3 * 4 * 32 * H
    assert m.token_kv_bytes() == 2 * (5 * 576 + 3 * 128)
    always = 2 * (V * H + H + 5 * (mla + layer_norms) + 3 * (indexer + dense_mlp) + 2 * shared) + 2 * router
    for L in (8192, 131072):
        w, kv = steps.decode_bytes(m, 1, L, sparse=False)
        assert w == always + 2 * H + 2 * 8 * 2 * expert
        assert kv == 2 * 5 * L * 576 + m.token_kv_bytes()
        w_sparse, kv_sparse = steps.decode_bytes(m, 1, L, sparse=True)
        assert w_sparse == w + 3 * 4 * 32 * H
        assert kv_sparse == 2 * (3 * L * 128 + 5 * 2048 * 576) + m.token_kv_bytes()
    w32, _ = steps.decode_bytes(m, 32, 8192, sparse=True)
    distinct = E * (1 - (1 - 8 / E) ** 32)   # ~163 of the 256 experts a layer under uniform routing
    assert w32 == pytest.approx(always + 3 * 4 * 32 * H + 32 * 2 * H + 2 * distinct * 2 * expert)


def test_prefill_flops_and_reads_by_hand():
    m = steps.model_shape("glm-5.2", 5)
    T = 65536
    _, dense = steps.prefill_cost(m, 1, T, 8192, sparse=False)
    _, sparse = steps.prefill_cost(m, 1, T, 8192, sparse=True)
    pairs, selected = T * (T + 1) / 2, 2048 * 2049 / 2 + (T - 2048) * 2048
    per_pair = 5 * 64 * 2 * (576 + 512)
    assert dense - sparse == pytest.approx(per_pair * (pairs - selected) - 3 * pairs * 2 * 32 * 128
                                           - 2 * T * 3 * 32 * 6144)
    assert steps.attention_reads(2, 10, 4) == 4 + 8 + (10 + 2) + 6 + 10   # steps [0,4) [4,8) [8,12) [12,16) [16,20)
    assert steps.attention_reads(1, 8192, 8192) == 8192


def test_summary_names_the_points_a_run_did_not_reach(tmp_path):
    point = {"batch_size": 1, "input_len": 128, "median_decode_step_ms": 2.0, "median_prefill_ms": 30.0}
    (tmp_path / "sparse.json").write_text(json.dumps({"points": [point]}))
    (tmp_path / "dense.json").write_text(json.dumps({"points": [{**point, "median_decode_step_ms": 3.0}]}))
    text = steps.summary(Namespace(preset="glm-5.2-tiny", num_layers=5, itemsize=4, dir=tmp_path, points=POINTS,
                                   output_len=4, chunk=128, copy_rate_gbs=100.0, peak_tflops=1.0))
    assert "| 1 | 128 | 2.00 | 3.00 | 1.5× | 200 |" in text   # (3 - 2) ms over 5 layers
    assert "Not measured" in text and "sparse 1x256, sparse 4x128, dense 1x256, dense 4x128" in text


def test_the_script_on_the_cpu_at_the_tiny_preset(tmp_path):
    """The GPU command's plumbing: both runs, their JSON, the summary with a sparse and a dense figure per point."""
    env = {**os.environ, "OUT": str(tmp_path), "GLM_NO_INSTALL": "1", "GLM_DEVICE": "cpu",
           "GLM_PRESET": "glm-5.2-tiny", "GLM_POINTS": ",".join(f"{b}x{i}" for b, i in POINTS), "GLM_CHUNK": "128",
           "GLM_OUTPUT_LEN": "4", "PYTHON": sys.executable,
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    run = subprocess.run(["bash", str(ROOT / "scripts" / "gpu_glm52_steps.sh")], env=env, capture_output=True,
                         text=True, timeout=300)
    assert run.returncode == 0, run.stdout + run.stderr
    for mode in ("sparse", "dense"):
        got = json.loads((tmp_path / f"{mode}.json").read_text())["points"]
        assert [(p["batch_size"], p["input_len"]) for p in got] == POINTS
        assert all(p["median_decode_step_ms"] > 0 and p["median_prefill_ms"] > 0 for p in got)
    assert "index_topk=1048576" in (tmp_path / "dense.log").read_text()
    assert "--hf-overrides" not in (tmp_path / "sparse.log").read_text()
    summary = (tmp_path / "summary.md").read_text()
    rows = [line for line in summary.splitlines() if line.startswith("| 1 | 128 |") or line.startswith("| 4 | 128 |")]
    assert len(rows) == 4 and not any("| — |" in r.split("× |")[0] for r in rows), summary
    assert "Not measured" not in summary and summary in run.stdout
