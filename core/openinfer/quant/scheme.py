"""Which format each Linear of a checkpoint is stored in, its tensors, and loading it onto a backend.

`quant_scheme(config)` reads config.json's `quantization_config`: none (bf16/f32), `fp8` with 128x128 block
scales (every Linear but those in `modules_to_not_convert`), or compressed-tensors `pack-quantized` INT4
(symmetric, group 32; the `ignore` list keeps modules in bf16). Anything else fails at parse time naming the
field; a tensor whose stored dtype the format does not allow fails at load naming the tensor.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any, Iterable, Mapping

import numpy as np

from ..loading.config import ConfigError
from .fp8 import FP8_BLOCK, Fp8Weight, row_scales
from .int4 import INT4_GROUP, Int4Weight

DENSE, INT4, FP8 = "dense", "int4", "fp8"


class QuantizedTensorError(ValueError):
    """A checkpoint tensor is stored in a format this line cannot serve."""


@dataclass(frozen=True)
class QuantScheme:
    method: str = DENSE                   # dense | int4 | fp8
    keep_dense: tuple[str, ...] = ()      # module names / "re:" patterns left unquantized
    targets: tuple[str, ...] = ("Linear",)

    def _matches(self, module: str, patterns: Iterable[str]) -> bool:
        for p in patterns:
            if p.startswith("re:"):
                if re.match(p[3:], module):
                    return True
            elif p == module or p == "Linear":
                return True
        return False

    def format_of(self, module: str) -> str:
        """The storage format of Linear `module` (e.g. "model.layers.3.mlp.experts.7.up_proj")."""
        if self.method == DENSE or module.endswith("lm_head") or self._matches(module, self.keep_dense):
            return DENSE
        return self.method if self._matches(module, self.targets) else DENSE

    def linear_shapes(self, module: str, out: int, inp: int) -> dict[str, tuple[int, ...]]:
        """Checkpoint tensor names and shapes of Linear `module` [out, inp] in its format."""
        fmt = self.format_of(module)
        if fmt == INT4:
            return {f"{module}.weight_packed": (out, inp // 8), f"{module}.weight_scale": (out, inp // INT4_GROUP),
                    f"{module}.weight_shape": (2,)}
        if fmt == FP8:
            return {f"{module}.weight": (out, inp),
                    f"{module}.weight_scale_inv": (math.ceil(out / FP8_BLOCK), math.ceil(inp / FP8_BLOCK))}
        return {f"{module}.weight": (out, inp)}


def _fp8_scheme(q: Mapping[str, Any]) -> QuantScheme:
    if q.get("fmt", "e4m3") != "e4m3":
        raise ConfigError(f"quantization_config.fmt {q.get('fmt')!r}: only FP8 e4m3 weights are served")
    if list(q.get("weight_block_size") or []) != [FP8_BLOCK, FP8_BLOCK]:
        raise ConfigError(f"quantization_config.weight_block_size {q.get('weight_block_size')!r}: only "
                          f"{FP8_BLOCK}x{FP8_BLOCK} block-scaled FP8 is served")
    return QuantScheme(FP8, tuple(q.get("modules_to_not_convert") or ()))


def _int4_scheme(q: Mapping[str, Any]) -> QuantScheme:
    if q.get("format") != "pack-quantized":
        raise ConfigError(f"quantization_config.format {q.get('format')!r}: of compressed-tensors checkpoints only "
                          "pack-quantized INT4 is served")
    groups = q.get("config_groups") or {}
    if len(groups) != 1:
        raise ConfigError(f"quantization_config.config_groups has {len(groups)} groups; one INT4 group is served")
    [(name, group)] = groups.items()
    w = group.get("weights") or {}
    want = {"num_bits": 4, "type": "int", "symmetric": True, "strategy": "group", "group_size": INT4_GROUP}
    for key, value in want.items():
        if w.get(key) != value:
            raise ConfigError(f"quantization_config.config_groups.{name}.weights.{key} is {w.get(key)!r}; only "
                              f"symmetric INT4 with group size {INT4_GROUP} is served ({key} {value!r})")
    if group.get("input_activations") or group.get("output_activations"):
        raise ConfigError(f"quantization_config.config_groups.{name}: quantized activations are not served "
                          "(weight-only INT4)")
    return QuantScheme(INT4, tuple(q.get("ignore") or ()), tuple(group.get("targets") or ("Linear",)))


def quant_scheme(config: Mapping[str, Any]) -> QuantScheme:
    """The scheme of config.json (a text config's own quantization_config, or the top level's)."""
    q = config.get("quantization_config")
    if not q:
        return QuantScheme()
    method = q.get("quant_method")
    if method == "fp8":
        return _fp8_scheme(q)
    if method == "compressed-tensors":
        return _int4_scheme(q)
    raise ConfigError(f"quantization_config.quant_method {method!r} is not served (fp8 block-scaled, "
                      "compressed-tensors pack-quantized INT4, or an unquantized checkpoint)")


def _raw(weights: Any, name: str, allowed: tuple[str, ...], fmt: str) -> np.ndarray:
    kind, _, arr = weights.raw(name)
    if kind not in allowed:
        raise QuantizedTensorError(f"tensor {name} is stored as {kind}; the {fmt} format needs "
                                   f"{' or '.join(allowed)}")
    return arr


def _float(weights: Any, name: str, fmt: str) -> np.ndarray:
    _raw(weights, name, ("BF16", "F16", "F32"), fmt)
    return weights.get(name)


def host_linear(weights: Any, scheme: QuantScheme, module: str) -> np.ndarray | Int4Weight | Fp8Weight:
    """Linear `module` from the checkpoint as host arrays in its format (float32 dense; packed INT4 with float32
    scales; fp8 bytes with per-row float32 scales). Dummy weights (no raw bytes) are drawn per tensor."""
    fmt = scheme.format_of(module)
    if fmt == INT4:
        packed = _raw(weights, f"{module}.weight_packed", ("I32",), "INT4 pack-quantized")
        return Int4Weight(packed, _float(weights, f"{module}.weight_scale", "INT4 pack-quantized"))
    if fmt == FP8:
        data = _raw(weights, f"{module}.weight", ("F8_E4M3",), "FP8 block-scaled")
        scale = _float(weights, f"{module}.weight_scale_inv", "FP8 block-scaled")
        return Fp8Weight(data, row_scales(scale, data.shape[0]))
    return _float(weights, f"{module}.weight", "unquantized")
