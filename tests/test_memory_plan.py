"""Memory planning: a model that cannot fit the GPUs given (weights per rank + one full-length sequence's KV) is
refused before anything loads, naming the sizes; real shapes (Kimi-K2 presets) give the known answers."""
from __future__ import annotations

import pytest

from openinfer.loading.memory_plan import check_fits, memory_need
from openinfer.contract.plugins import get_plugins
from openinfer.loading.weights import DummyWeights

GIB = 2**30


def _kimi(preset: str):
    found = get_plugins().preset(preset)
    if found is None:
        pytest.skip("the kimi_k2 plugin is not installed")
    line, config = found
    cfg = line.parse_config(config)
    shapes = line.weight_shapes(cfg)
    return line, cfg, shapes


@pytest.mark.parametrize("ep, gpu_gib, fits", [(1, 141, False), (8, 80, False), (8, 141, True)])
def test_kimi_k2_thinking_int4(ep, gpu_gib, fits):
    line, cfg, shapes = _kimi("kimi-k2-thinking")
    need = memory_need(line, cfg, shapes, DummyWeights(shapes), 2, ep, 131072, 16)
    # 1.01T routed-expert weights as INT4 + bf16 group scales (531.5 GiB over the ranks), ~22 GiB on every rank
    assert 525 * GIB / ep + 18 * GIB < need.weights_per_rank < 540 * GIB / ep + 26 * GIB
    assert need.min_kv == 61 * 576 * 2 * 131072   # the MLA latent cache: 576 values a token a layer
    if fits:
        check_fits("Kimi-K2-Thinking", need, gpu_gib * GIB, 0.9, ep)
    else:
        with pytest.raises(MemoryError, match=r"GiB of weights \+ .* GiB of KV for one 131072-token sequence"):
            check_fits("Kimi-K2-Thinking", need, gpu_gib * GIB, 0.9, ep)


def test_serve_refuses_before_loading(monkeypatch, tmp_path):
    """`openinfer serve` of a checkpoint too big for the GPU given fails in read_source, before any device work."""
    from openinfer.loading import loader
    from openinfer.engine.engine_args import EngineArgs
    from openinfer.loading.synth import synthesize
    if get_plugins().preset("qwen3-tiny") is None:
        pytest.skip("the qwen3 plugin is not installed")
    synthesize("qwen3-tiny", tmp_path)
    monkeypatch.setattr(loader, "_gpu_bytes", lambda device, ep: 1 << 20)
    with pytest.raises(loader.LoadError, match=r"does not fit: .* GiB of weights .* 4096-token sequence"):
        loader.read_source(str(tmp_path), EngineArgs(device="cuda"), get_plugins())
    monkeypatch.setattr(loader, "_gpu_bytes", lambda device, ep: 80 * GIB)
    assert loader.read_source(str(tmp_path), EngineArgs(device="cuda"), get_plugins()).line.name == "qwen3"
