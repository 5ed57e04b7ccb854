"""RoPE frequency tables: default and YaRN (transformers' formula), legacy and new config keys."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Mapping

import numpy as np

from ..loading.config import ConfigError


@dataclass(frozen=True)
class RopeConfig:
    theta: float
    rotary_dim: int
    kind: str = "default"             # default | yarn
    factor: float = 1.0
    original_max_position: int | None = None
    beta_fast: float = 32.0
    beta_slow: float = 1.0
    mscale: float | None = None
    mscale_all_dim: float | None = None
    attention_factor: float | None = None


def rope_config(config: Mapping[str, Any], rotary_dim: int) -> RopeConfig:
    """Accepts both `rope_parameters` (transformers 5) and legacy `rope_theta` + `rope_scaling`."""
    params, scaling = config.get("rope_parameters") or {}, config.get("rope_scaling") or {}
    if not isinstance(params, dict) or not isinstance(scaling, dict):
        raise ConfigError(f"rope_parameters / rope_scaling must be objects (got {params!r}, {scaling!r})")
    merged = {**scaling, **params}
    theta = _positive("rope_theta", merged.get("rope_theta", config.get("rope_theta", 10000.0)))
    kind = merged.get("rope_type", merged.get("type", "default"))
    if kind not in ("default", "yarn"):
        raise ConfigError(f"rope type {kind!r} is not supported (default, yarn)")
    if kind == "default":
        return RopeConfig(theta, rotary_dim)
    original = merged.get("original_max_position_embeddings") or config.get("max_position_embeddings")
    if isinstance(original, bool) or not isinstance(original, int) or original < 1:
        raise ConfigError(f"original_max_position_embeddings {original!r} must be a positive integer")
    if "factor" not in merged:
        raise ConfigError("yarn rope scaling lacks its 'factor'")
    extra = {k: merged.get(k) for k in ("mscale", "mscale_all_dim", "attention_factor")}
    for k, v in extra.items():
        if v is not None:
            _positive(k, v, zero=True)
    return RopeConfig(theta, rotary_dim, "yarn", _positive("factor", merged["factor"]), original,
                      _positive("beta_fast", merged.get("beta_fast") or 32.0),
                      _positive("beta_slow", merged.get("beta_slow") or 1.0), *extra.values())


def _positive(key: str, value: Any, zero: bool = False) -> float:
    """A rope field's number, above zero (or zero too, with `zero`); a ConfigError naming it otherwise."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not (value >= 0 if zero else value > 0):
        raise ConfigError(f"{key} {value!r} must be a number {'of at least 0' if zero else 'above 0'}")
    return float(value)


def yarn_mscale(scale: float, m: float = 1.0) -> float:
    return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0


def inv_freq_and_factor(rc: RopeConfig) -> tuple[np.ndarray, float]:
    d = rc.rotary_dim
    base = rc.theta ** (-np.arange(0, d, 2, dtype=np.float64) / d)
    if rc.kind == "default":
        return base, 1.0
    s, L0 = rc.factor, rc.original_max_position

    def corr(r: float) -> float:
        return d * math.log(L0 / (2 * math.pi * r)) / (2 * math.log(rc.theta))

    lo = max(math.floor(corr(rc.beta_fast)), 0)
    hi = min(math.ceil(corr(rc.beta_slow)), d - 1)
    if lo == hi:
        hi += 0.001
    ramp = np.clip((np.arange(d // 2, dtype=np.float64) - lo) / (hi - lo), 0, 1)
    inv = (base / s) * ramp + base * (1 - ramp)
    if rc.attention_factor is not None:
        factor = rc.attention_factor
    elif rc.mscale is not None and rc.mscale_all_dim is not None:
        factor = yarn_mscale(s, rc.mscale) / yarn_mscale(s, rc.mscale_all_dim)
    else:
        factor = yarn_mscale(s)
    return inv, factor


def cos_sin(rc: RopeConfig, max_positions: int) -> tuple[np.ndarray, np.ndarray]:
    """[max_positions, rotary_dim / 2] float32 tables (attention factor folded in)."""
    inv, factor = inv_freq_and_factor(rc)
    freqs = np.outer(np.arange(max_positions, dtype=np.float64), inv)
    return (np.cos(freqs) * factor).astype(np.float32), (np.sin(freqs) * factor).astype(np.float32)
