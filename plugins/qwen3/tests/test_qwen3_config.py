"""config.json fields the qwen3 line reads: a value of the wrong kind or range fails at parse, naming the field
(it would otherwise load and compute NaNs, refuse every request, or crash later)."""
from __future__ import annotations

import pytest

from openinfer.plugin_api import ConfigError
from openinfer_qwen3.config import Qwen3Config

BASE = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
        "num_key_value_heads": 2, "vocab_size": 256, "max_position_embeddings": 512, "rms_norm_eps": 1e-6,
        "rope_theta": 1e6, "tie_word_embeddings": True}


def test_the_base_parses_and_fills_defaults() -> None:
    cfg = Qwen3Config.from_dict({k: v for k, v in BASE.items() if k not in ("num_key_value_heads", "rms_norm_eps")})
    assert (cfg.num_kv_heads, cfg.head_dim, cfg.rms_norm_eps) == (4, 16, 1e-6)


@pytest.mark.parametrize("change, message", [
    ({"hidden_size": 0}, "'hidden_size' is 0; it must be at least 1"),
    ({"num_key_value_heads": "2"}, "'num_key_value_heads' has type str"),
    ({"head_dim": 0}, "'head_dim' is 0; it must be at least 1"),
    ({"max_position_embeddings": -1}, "'max_position_embeddings' is -1; it must be at least 1"),
    ({"rms_norm_eps": 0}, "'rms_norm_eps' is 0; it must be above 0"),
    ({"tie_word_embeddings": "false"}, "'tie_word_embeddings' has type str"),
    ({"rope_theta": -1}, "rope_theta -1 must be a number above 0"),
    ({"rope_scaling": 5}, "rope_parameters / rope_scaling must be objects"),
])
def test_a_bad_value_names_its_field(change: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        Qwen3Config.from_dict({**BASE, **change})
