"""Which installed model line claims a checkpoint: exactly one must."""
from __future__ import annotations

from typing import Any, Mapping

from .model_line import ModelLine
from .plugins import Plugins


def install_hint(distribution: str) -> str:
    """How a plugin distribution is installed today: from the repository's plugins/<name> folder, or its wheel
    (scripts/build_dists.sh); none is on a package index."""
    folder = distribution.removeprefix("openinfer-").replace("-", "_")
    return (f"`pip install ./plugins/{folder}` in an openinfer checkout (or its wheel, built by "
            f"scripts/build_dists.sh: {distribution} is not on PyPI)")


# Families with a plugin of their own, so a missing one can be named in the error.
KNOWN_FAMILIES: dict[str, str] = {
    "qwen3": "openinfer-qwen3",
    "qwen3_5": "openinfer-qwen35",
    "qwen3_5_text": "openinfer-qwen35",
    "deepseek_v2": "openinfer-deepseek-v2-lite",
    "kimi_k2": "openinfer-kimi-k2",
    "deepseek_v3": "openinfer-kimi-k2",
    "glm_moe_dsa": "openinfer-glm52",
}


class DetectionError(ValueError):
    pass


def detect_line(config: Mapping[str, Any], plugins: Plugins, source: str = "config.json") -> ModelLine:
    claims, reasons = [], []
    for name, line in sorted(plugins.lines.items()):
        try:
            probe = line.probe(config)
        except Exception as e:  # noqa: BLE001 — a buggy probe must not hide the other lines
            reasons.append(f"  {name}: probe failed: {type(e).__name__}: {e}")
            continue
        if probe.ok:
            claims.append(line)
        else:
            reasons.append(f"  {name}: {probe.reason}")
    if len(claims) == 1:
        return claims[0]
    if len(claims) > 1:
        raise DetectionError(f"{source} is claimed by several model lines ({', '.join(c.name for c in claims)}); "
                             "uninstall one of their plugins or pass --model-line NAME")
    model_type = config.get("model_type") or config.get("text_config", {}).get("model_type")
    lines = [f"no installed model line claims {source} (model_type {model_type!r}, "
             f"architectures {config.get('architectures')})."]
    if model_type in KNOWN_FAMILIES:
        lines.append(f"This is a known family: {install_hint(KNOWN_FAMILIES[model_type])} adds its model line.")
    lines.append("Installed lines said:" if reasons
                 else f"No model lines are installed ({install_hint('openinfer-qwen3')}).")
    lines.extend(reasons)
    for err in plugins.errors:
        lines.append(f"  (plugin {err.plugin} from {err.distribution} failed to load: {err.error})")
    raise DetectionError("\n".join(lines))
