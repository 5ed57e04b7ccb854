"""The op registry: op name -> implementations, resolved once at model load.

A model line declares the ops it calls (its kernel plan); `resolve` picks, for each op, the
highest-priority implementation that applies: its backend, its dtypes and the GPU generations it
needs (`capabilities`; shapes an implementation cannot take it hands, call by call, to a kernel that
can). A missing op fails at load with a message naming it, never mid-request. Plugins add
implementations through the `register_kernels` hook, so a faster provider needs no change to any
model; `--kernel OP=NAME` picks another applicable implementation by name.
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping


@dataclass
class KernelImpl:
    op: str
    backend: str                      # "numpy" or "cuda"
    impl: Callable[..., Any] | str    # a callable or a lazy "module:attr" string
    dtypes: tuple[str, ...] = ()      # empty = any compute dtype
    priority: int = 0
    provider: str = "openinfer"
    name: str = ""                    # what --kernel OP=NAME picks; "" = the provider's name
    capabilities: tuple[int, ...] = ()   # GPU compute capabilities it runs on (90 = sm_90); empty = any
    _loaded: Callable[..., Any] | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        self.name = self.name or self.provider

    def load(self) -> Callable[..., Any]:
        if self._loaded is None:
            self._loaded = _load(self.impl) if isinstance(self.impl, str) else self.impl
        return self._loaded

    def applies(self, backend: str, dtype: str, capability: int | None) -> bool:
        return (self.backend == backend and (not self.dtypes or dtype in self.dtypes)
                and (not self.capabilities or capability in self.capabilities))

    @property
    def label(self) -> str:
        ref = self.impl if isinstance(self.impl, str) else f"{self.impl.__module__}:{self.impl.__qualname__}"
        needs = f", sm_{'/'.join(map(str, self.capabilities))}" if self.capabilities else ""
        return f"{self.name}: {ref} [{self.provider}, priority {self.priority}{needs}]"


def _load(ref: str) -> Callable[..., Any]:
    module, _, attr = ref.partition(":")
    obj: Any = importlib.import_module(module)
    for part in attr.split("."):
        obj = getattr(obj, part)
    return obj


class KernelPlanError(RuntimeError):
    """An op the model needs has no implementation for this backend/dtype, or --kernel names none that applies."""


class Ops:
    """The resolved ops of one model: attribute access, e.g. `ops.rms_norm(x, w, eps)`."""

    def __init__(self, table: dict[str, KernelImpl], others: Mapping[str, list[KernelImpl]] | None = None) -> None:
        self._table = table
        self._others = dict(others or {})
        for name, impl in table.items():
            setattr(self, name, impl.load())

    def describe(self) -> dict[str, str]:
        """op -> the chosen implementation, with the names of the other applicable ones (for --kernel)."""
        out = {}
        for name, impl in sorted(self._table.items()):
            others = [k.name for k in self._others.get(name, []) if k is not impl]
            out[name] = impl.label + (f"; also: {', '.join(others)}" if others else "")
        return out


def parse_kernel_overrides(specs: list[str] | tuple[str, ...]) -> dict[str, str]:
    """`--kernel OP=NAME` values -> {op: name}; a malformed or repeated op is a ValueError naming it."""
    out: dict[str, str] = {}
    for spec in specs:
        op, sep, name = spec.partition("=")
        op, name = op.strip(), name.strip()
        if not (sep and op and name):
            raise ValueError(f"--kernel {spec!r}: write OP=NAME, e.g. paged_attention=mma")
        if op in out:
            raise ValueError(f"--kernel names op {op!r} twice")
        out[op] = name
    return out


class KernelRegistry:
    def __init__(self) -> None:
        self._impls: dict[str, list[KernelImpl]] = {}

    def register(self, op: str, backend: str, impl: Callable[..., Any] | str, *,
                 dtypes: tuple[str, ...] = (), priority: int = 0, provider: str = "openinfer", name: str = "",
                 capabilities: tuple[int, ...] = ()) -> None:
        self._impls.setdefault(op, []).append(
            KernelImpl(op, backend, impl, tuple(dtypes), priority, provider, name, tuple(capabilities)))

    def remove_provider(self, provider: str) -> None:
        """Forget a provider's implementations (its plugin failed half-way through registering)."""
        for op, impls in self._impls.items():
            self._impls[op] = [k for k in impls if k.provider != provider]

    def ops(self) -> list[str]:
        return sorted(self._impls)

    def candidates(self, op: str, backend: str, dtype: str, capability: int | None = None) -> list[KernelImpl]:
        found = [k for k in self._impls.get(op, []) if k.applies(backend, dtype, capability)]
        return sorted(found, key=lambda k: -k.priority)

    def resolve(self, plan: list[str] | tuple[str, ...], backend: str, dtype: str, capability: int | None = None,
                overrides: Mapping[str, str] | None = None) -> Ops:
        """Each op of `plan` -> its highest-priority applicable implementation, or the one `overrides` names. An op
        that two of a model's layer kinds call (`beside`: MLA's and MoE's) may stand in the plan twice; it resolves
        once."""
        plan = list(dict.fromkeys(plan))
        overrides = dict(overrides or {})
        unused = sorted(set(overrides) - set(plan))
        if unused:
            raise KernelPlanError(f"--kernel names op(s) {', '.join(unused)} that this model does not call; "
                                  f"its ops are {', '.join(sorted(plan))}")
        table, others, missing = {}, {}, []
        for op in plan:
            found = self.candidates(op, backend, dtype, capability)
            if not found:
                missing.append(op)
                continue
            if op in overrides:
                named = [k for k in found if k.name == overrides[op]]
                if not named:
                    raise KernelPlanError(
                        f"--kernel {op}={overrides[op]}: no implementation of that name applies on {backend} "
                        f"{dtype}; choose one of {', '.join(k.name for k in found)}")
                found = named + [k for k in found if k is not named[0]]
            table[op], others[op] = found[0], found
        if missing:
            raise KernelPlanError(
                f"no implementation for op(s) {', '.join(missing)} on backend {backend!r} with dtype {dtype}; "
                "install a kernel provider that registers them, or choose another --device/--dtype")
        return Ops(table, others)
