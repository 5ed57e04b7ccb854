"""ModelHost: the engines one server process serves, by model name.

The request's `model` selects an engine; `/v1/models` lists the names. One engine may be served
under several names (aliases); start() and shutdown() reach each engine once.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Iterable, Iterator, Mapping, Protocol

from openinfer.parsers import ChatFormat
from openinfer.request import RequestStream
from openinfer.sampling import SamplingParams
from openinfer.tokenizer import Tokenizer

from .errors import APIError, model_not_found
from .metrics import ModelMetrics


class Engine(Protocol):
    """What the server needs of an engine (openinfer.engine implements it)."""
    name: str
    tokenizer: Tokenizer
    chat_format: ChatFormat
    max_model_len: int
    vocab_size: int
    eos_token_ids: frozenset[int]    # the ids that end a request (the engine's, which may add to the tokenizer's)
    dead_reason: str | None

    def submit(self, prompt_ids: list[int], params: SamplingParams, request_id: str | None = None,
               cache_salt: str = "") -> RequestStream: ...
    def abort(self, request_id: str) -> None: ...
    def is_alive(self) -> bool: ...
    def stats(self) -> Any: ...
    def start(self) -> None: ...
    def shutdown(self) -> None: ...


@dataclass
class ServedModel:
    name: str
    engine: Engine
    created: int = field(default_factory=lambda: int(time.time()))
    metrics: ModelMetrics = field(default_factory=ModelMetrics)

    def card(self) -> dict[str, Any]:
        return {"id": self.name, "object": "model", "created": self.created, "owned_by": "openinfer",
                "root": self.engine.name, "max_model_len": self.engine.max_model_len}


class ModelHost:
    def __init__(self, engines: Iterable[Engine] | Mapping[str, Engine] = ()) -> None:
        self._models: dict[str, ServedModel] = {}
        items = engines.items() if isinstance(engines, Mapping) else ((e.name, e) for e in engines)
        for name, engine in items:
            self.add(engine, name)

    def add(self, engine: Engine, name: str | None = None) -> None:
        """Serve `engine` as `name` (default: engine.name)."""
        name = name or engine.name
        if name in self._models:
            raise ValueError(f"model name {name!r} is already served")
        self._models[name] = ServedModel(name, engine)

    def get(self, name: str) -> ServedModel:
        """The model a request names: 404 if unknown, 500 if its engine died."""
        model = self._models.get(name)
        if model is None:
            raise model_not_found(name)
        if not model.engine.is_alive():
            raise APIError(500, f"The engine serving '{name}' is dead: {model.engine.dead_reason}",
                           code="engine_dead")
        return model

    def __iter__(self) -> Iterator[ServedModel]:
        return iter(self._models.values())

    def __len__(self) -> int:
        return len(self._models)

    def engines(self) -> list[Engine]:
        """Each distinct engine once, in the order added."""
        return list({id(m.engine): m.engine for m in self}.values())

    def start(self) -> None:
        for engine in self.engines():
            engine.start()

    def shutdown(self) -> None:
        for engine in self.engines():
            engine.shutdown()
