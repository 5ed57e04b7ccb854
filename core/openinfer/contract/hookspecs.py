"""The hooks a plugin may implement (pluggy project "openinfer", entry-point group "openinfer").

Plugins declare only the arguments they use. Registration takes objects or lazy "module:attr"
strings; importing a plugin must not touch the GPU.
"""
from __future__ import annotations

import pluggy

hookspec = pluggy.HookspecMarker("openinfer")
hookimpl = pluggy.HookimplMarker("openinfer")


@hookspec
def register_model_lines(register) -> None:
    """Call `register(line)` for each ModelLine (an instance, a class, or "module:attr")."""


@hookspec
def register_kernels(register) -> None:
    """Call `register(op, backend, impl, dtypes=(), priority=0)` for each op implementation."""
