"""Plugin discovery: entry points in group "openinfer", loaded one by one so a broken plugin is
reported (name + error) and never takes the others down."""
from __future__ import annotations

import importlib
import importlib.metadata
import logging
import os
import traceback
from dataclasses import dataclass, field
from typing import Any

import pluggy

from . import hookspecs
from ..kernels.registry import KernelRegistry
from .model_line import ModelLine

log = logging.getLogger("openinfer.contract.plugins")
GROUP = "openinfer"


@dataclass
class PluginError:
    plugin: str
    distribution: str
    error: str
    detail: str = ""


@dataclass
class PluginInfo:
    name: str
    distribution: str
    version: str
    model_lines: list[str] = field(default_factory=list)


class Plugins:
    """The loaded plugin set: model lines, kernel registry, and what failed to load."""

    def __init__(self) -> None:
        self.pm = pluggy.PluginManager("openinfer")
        self.pm.add_hookspecs(hookspecs)
        self.lines: dict[str, ModelLine] = {}
        self.line_owner: dict[str, str] = {}
        self.kernels = KernelRegistry()
        self.errors: list[PluginError] = []
        self.infos: list[PluginInfo] = []

    def preset(self, name: str) -> tuple[ModelLine, dict[str, Any]] | None:
        """The model line that owns preset `name` (e.g. "qwen3.5-4b") and its config.json, or None."""
        for line in self.lines.values():
            if name in line.presets:
                return line, dict(line.presets[name])
        return None

    def load(self, entry_points: bool = True) -> Plugins:
        from . import builtin_kernels
        self._add("openinfer", "openinfer", importlib.metadata.version("openinfer") if _installed("openinfer") else "dev",
                  builtin_kernels)
        if entry_points and os.environ.get("OPENINFER_DISABLE_PLUGIN_AUTOLOAD") != "1":
            allow = os.environ.get("OPENINFER_PLUGINS")
            allowed = None if allow is None else {p.strip() for p in allow.split(",") if p.strip()}
            for ep in importlib.metadata.entry_points(group=GROUP):
                if allowed is not None and ep.name not in allowed:
                    continue
                dist = ep.dist.name if ep.dist else "?"
                version = ep.dist.version if ep.dist else "?"
                try:
                    module = ep.load()
                except Exception as e:  # noqa: BLE001 — any import failure is reported, not fatal
                    self._fail(ep.name, dist, e)
                    continue
                self._add(ep.name, dist, version, module)
        return self

    def register(self, name: str, module: Any, distribution: str = "(in-process)", version: str = "") -> None:
        """Register a plugin object directly (tests, embedding applications)."""
        self._add(name, distribution, version, module)

    def _add(self, name: str, dist: str, version: str, module: Any) -> None:
        if self.pm.has_plugin(name):
            return
        lines_before = dict(self.lines)
        try:
            self.pm.register(module, name=name)
            info = PluginInfo(name, dist, version)
            impls = {h.name for h in self.pm.get_hookcallers(module) or []}

            def register_line(line: Any) -> None:
                line = _instantiate(line)
                if line.name in self.lines:
                    raise ValueError(f"model line {line.name!r} is already registered by {self.line_owner[line.name]}")
                self.lines[line.name] = line
                self.line_owner[line.name] = name
                info.model_lines.append(line.name)

            def register_kernel(op: str, backend: str, impl: Any, **kw: Any) -> None:
                self.kernels.register(op, backend, impl, provider=name, **kw)

            plugin_hooks = self.pm.subset_hook_caller  # call this plugin's impls only
            others = [p for p in self.pm.get_plugins() if p is not module]
            if "register_model_lines" in impls:
                plugin_hooks("register_model_lines", others)(register=register_line)
            if "register_kernels" in impls:
                plugin_hooks("register_kernels", others)(register=register_kernel)
            self.infos.append(info)
        except Exception as e:  # noqa: BLE001
            self.lines = lines_before
            self.line_owner = {k: v for k, v in self.line_owner.items() if k in self.lines}
            self.kernels.remove_provider(name)
            if self.pm.is_registered(module):
                self.pm.unregister(module)
            self._fail(name, dist, e)

    def _fail(self, name: str, dist: str, e: BaseException) -> None:
        err = PluginError(name, dist, f"{type(e).__name__}: {e}", traceback.format_exc())
        self.errors.append(err)
        log.warning("plugin %s (%s) failed to load: %s", name, dist, err.error)
        if os.environ.get("OPENINFER_STRICT_PLUGINS") == "1":
            raise e


def _instantiate(line: Any) -> ModelLine:
    if isinstance(line, str):
        module, _, attr = line.partition(":")
        line = getattr(importlib.import_module(module), attr)
    if isinstance(line, type):
        line = line()
    if not isinstance(line, ModelLine):
        raise TypeError(f"{line!r} is not an openinfer.contract.model_line.ModelLine")
    return line


def _installed(dist: str) -> bool:
    try:
        importlib.metadata.version(dist)
        return True
    except importlib.metadata.PackageNotFoundError:
        return False


_loaded: Plugins | None = None


def get_plugins() -> Plugins:
    """The process-wide plugin set, loaded once."""
    global _loaded
    if _loaded is None:
        _loaded = Plugins().load()
    return _loaded
