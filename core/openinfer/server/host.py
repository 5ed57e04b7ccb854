"""ModelHost: the engines one server process serves, by model name.

The request's `model` selects an engine; `/v1/models` lists the names. One engine may be served
under several names (aliases); start() and shutdown() reach each engine once. With a waiting limit
(`--max-waiting-requests`) a generation request that finds its engine's queue full is a 503 with
Retry-After, which OpenAI clients retry, instead of a wait with no bound. A request runs at most
`max_sequences` sequences (prompts × n; default the engine's running limit, so that all of them can run at once).
Each model knows its requests in flight (Submission), so that a server at the end of its shutdown grace period
can end them with an error (interrupt).
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Iterable, Iterator, Mapping, Protocol

from openinfer.text.parsers import ChatFormat
from openinfer.engine.request import RequestStream
from openinfer.sampling.sampler import SamplingParams
from openinfer.text.tokenizer import Tokenizer

from .errors import APIError, bad_request, model_not_found
from .metrics import ModelMetrics

if TYPE_CHECKING:
    from openinfer.engine.engine import EngineStats
    from openinfer.sampling.structured import Constraint
    from .submission import Submission


class Engine(Protocol):
    """What the server needs of an engine (openinfer.engine.engine implements it)."""
    name: str
    tokenizer: Tokenizer
    chat_format: ChatFormat
    max_model_len: int
    max_num_seqs: int                # sequences it runs at once
    vocab_size: int
    eos_token_ids: frozenset[int]    # the ids that end a request (the engine's, which may add to the tokenizer's)
    dead_reason: str | None
    sampling_defaults: Mapping[str, Any]   # the model's defaults for the sampling fields a request leaves out

    def submit(self, prompt_ids: list[int], params: SamplingParams, request_id: str | None = None,
               cache_salt: str = "", constraint: Constraint | None = None, after: str | None = None,
               priority: int = 0) -> RequestStream: ...
    def abort(self, request_id: str) -> None: ...
    def is_alive(self) -> bool: ...
    def stats(self) -> EngineStats: ...
    def start(self) -> object: ...
    def shutdown(self) -> None: ...


@dataclass
class ServedModel:
    name: str
    engine: Engine
    max_waiting: int | None = None   # requests queued in the engine beyond which new ones are refused
    max_sequences: int | None = None   # sequences (prompts × n) one request may run; None: the engine's running limit
    created: int = field(default_factory=lambda: int(time.time()))
    metrics: ModelMetrics = field(default_factory=ModelMetrics)
    live: set[Submission] = field(default_factory=set)   # requests in flight
    stopping: APIError | None = None   # set once the server ends what is in flight: new requests get it too

    def check_sequences(self, prompts: int, n: int) -> None:
        """A 400 naming `n` (or `prompt`) when prompts × n exceeds max_sequences."""
        limit = self.max_sequences or self.engine.max_num_seqs
        if prompts * n > limit:
            what = f"{prompts} prompts × n = {n}" if prompts > 1 else f"n = {n}"
            raise bad_request(f"This request asks for {prompts * n} sequences ({what}); this server runs at most "
                              f"{limit} for one request (--max-sequences-per-request). Send fewer.",
                              "n" if n > 1 or prompts == 1 else "prompt")

    def admit(self) -> None:
        """Raise a 503 (Retry-After: 1) when the engine already has max_waiting requests queued, or the server is
        ending what is in flight."""
        if self.stopping is not None:
            raise self.stopping
        if self.max_waiting is None:
            return
        waiting = self.engine.stats().num_waiting
        if waiting >= self.max_waiting:
            raise APIError(503, f"The server is busy: {waiting} requests are already waiting for '{self.name}'. "
                                "Retry later.", code="server_overloaded", headers={"Retry-After": "1"})

    def card(self) -> dict[str, Any]:
        return {"id": self.name, "object": "model", "created": self.created, "owned_by": "openinfer",
                "root": self.engine.name, "max_model_len": self.engine.max_model_len}


class ModelHost:
    def __init__(self, engines: Iterable[Engine] | Mapping[str, Engine] = (),
                 max_waiting_requests: int | None = None, max_sequences_per_request: int | None = None) -> None:
        for name, value in (("max_waiting_requests", max_waiting_requests),
                            ("max_sequences_per_request", max_sequences_per_request)):
            if value is not None and value < 1:
                raise ValueError(f"{name} must be at least 1, not {value}")
        self.max_waiting_requests = max_waiting_requests
        self.max_sequences_per_request = max_sequences_per_request
        self._models: dict[str, ServedModel] = {}
        items = engines.items() if isinstance(engines, Mapping) else ((e.name, e) for e in engines)
        for name, engine in items:
            self.add(engine, name)

    def add(self, engine: Engine, name: str | None = None) -> None:
        """Serve `engine` as `name` (default: engine.name)."""
        name = name or engine.name
        if name in self._models:
            raise ValueError(f"model name {name!r} is already served")
        self._models[name] = ServedModel(name, engine, self.max_waiting_requests, self.max_sequences_per_request)

    def get(self, name: str) -> ServedModel:
        """The model a request names: 404 if unknown, 500 if its engine died."""
        model = self._models.get(name)
        if model is None:
            raise model_not_found(name)
        if not model.engine.is_alive():
            raise APIError(500, f"The engine serving '{name}' is dead: {model.engine.dead_reason}",
                           code="engine_dead")
        return model

    def interrupt(self, error: APIError) -> None:
        """End every request in flight with `error`, and answer it to new ones (the shutdown grace period is over)."""
        for m in self:
            m.stopping = error
            for sub in list(m.live):
                sub.interrupt(error)

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
