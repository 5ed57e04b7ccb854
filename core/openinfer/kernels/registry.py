"""The op registry: op name -> implementations, resolved once at model load.

A model line declares the ops it calls (its kernel plan); `resolve` picks, for each op, the
highest-priority implementation that supports the backend and dtype. A missing op fails at load
with a message naming it, never mid-request. Plugins add implementations through the
`register_kernels` hook, so a faster provider needs no change to any model.
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from typing import Any, Callable


@dataclass
class KernelImpl:
    op: str
    backend: str                      # "numpy" or "cuda"
    impl: Callable[..., Any] | str    # a callable or a lazy "module:attr" string
    dtypes: tuple[str, ...] = ()      # empty = any compute dtype
    priority: int = 0
    provider: str = "openinfer"
    _loaded: Callable[..., Any] | None = field(default=None, repr=False)

    def load(self) -> Callable[..., Any]:
        if self._loaded is None:
            self._loaded = _load(self.impl) if isinstance(self.impl, str) else self.impl
        return self._loaded

    @property
    def label(self) -> str:
        name = self.impl if isinstance(self.impl, str) else f"{self.impl.__module__}:{self.impl.__qualname__}"
        return f"{name} [{self.provider}, priority {self.priority}]"


def _load(ref: str) -> Callable[..., Any]:
    module, _, attr = ref.partition(":")
    obj: Any = importlib.import_module(module)
    for part in attr.split("."):
        obj = getattr(obj, part)
    return obj


class KernelPlanError(RuntimeError):
    """An op the model needs has no implementation for this backend/dtype."""


class Ops:
    """The resolved ops of one model: attribute access, e.g. `ops.rms_norm(x, w, eps)`."""

    def __init__(self, table: dict[str, KernelImpl]) -> None:
        self._table = table
        for name, impl in table.items():
            setattr(self, name, impl.load())

    def describe(self) -> dict[str, str]:
        return {name: impl.label for name, impl in sorted(self._table.items())}


class KernelRegistry:
    def __init__(self) -> None:
        self._impls: dict[str, list[KernelImpl]] = {}

    def register(self, op: str, backend: str, impl: Callable[..., Any] | str, *,
                 dtypes: tuple[str, ...] = (), priority: int = 0, provider: str = "openinfer") -> None:
        self._impls.setdefault(op, []).append(KernelImpl(op, backend, impl, tuple(dtypes), priority, provider))

    def remove_provider(self, provider: str) -> None:
        """Forget a provider's implementations (its plugin failed half-way through registering)."""
        for op, impls in self._impls.items():
            self._impls[op] = [k for k in impls if k.provider != provider]

    def ops(self) -> list[str]:
        return sorted(self._impls)

    def candidates(self, op: str, backend: str, dtype: str) -> list[KernelImpl]:
        found = [k for k in self._impls.get(op, []) if k.backend == backend and (not k.dtypes or dtype in k.dtypes)]
        return sorted(found, key=lambda k: -k.priority)

    def resolve(self, plan: list[str] | tuple[str, ...], backend: str, dtype: str) -> Ops:
        table, missing = {}, []
        for op in plan:
            found = self.candidates(op, backend, dtype)
            if found:
                table[op] = found[0]
            else:
                missing.append(op)
        if missing:
            raise KernelPlanError(
                f"no implementation for op(s) {', '.join(missing)} on backend {backend!r} with dtype {dtype}; "
                "install a kernel provider that registers them, or choose another --device/--dtype")
        return Ops(table)
