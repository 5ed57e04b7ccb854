"""The engine requests behind one API request (n choices per prompt), read as one merged stream.

Abort discipline: every exit path — client disconnect, cancellation,
an error in another choice — ends in `close()`, which aborts exactly the engine requests that
have not finished (no flood of no-op aborts). A stop-string match aborts its request at once.
`interrupt()` ends a submission from outside (the server's shutdown grace period is over): its reader raises the
given error, as a 503 before the first byte or an error event after it.
"""
from __future__ import annotations

import asyncio
import time
import uuid
from dataclasses import dataclass
from typing import AsyncIterator, Awaitable, Callable, TypeVar

from openinfer.engine.request import Event, Failed, Finished, PromptLogprobs, Rejected, RequestStream, Scheduled, Tokens
from openinfer.sampling.sampler import SamplingParams
from openinfer.sampling.structured import Constraint

from .errors import APIError, bad_request, engine_error
from .metrics import ModelMetrics
from .output import ChoiceOutput, Piece

T = TypeVar("T")


@dataclass
class Choice:
    index: int
    prompt_index: int
    request_id: str
    stream: RequestStream
    out: ChoiceOutput
    first: Event | None = None       # read by started(), handled by pieces()
    done: bool = False
    cached_tokens: int = 0
    completion_tokens: int = 0
    last_token: float | None = None   # when its last tokens came (the inter-token latency metric)


class Submission:
    def __init__(self, engine, metrics: ModelMetrics, arrival: float, prefix: str,
                 max_tokens_param: str = "max_tokens", live: set[Submission] | None = None) -> None:
        """`max_tokens_param`: the field the client set the token limit with, named where the engine refuses it.
        `live`: the submissions in flight, which this one is part of until it closes."""
        self.engine = engine
        self.live = live if live is not None else set()
        self.live.add(self)
        self.interrupted: APIError | None = None
        self._stop: asyncio.Future[None] | None = None   # done once interrupted, for the waits in started()
        self._wake: asyncio.Future[None] | None = None   # what pieces() awaits: an event for a choice, or interrupt()
        self.max_tokens_param = max_tokens_param
        self.metrics = metrics
        self.arrival = arrival
        self.id = f"{prefix}-{uuid.uuid4().hex}"
        self.choices: list[Choice] = []
        self._first: dict[int, str] = {}   # prompt index -> the request id of its first choice

    def add(self, prompt_index: int, prompt_ids: list[int], params: SamplingParams, out: ChoiceOutput,
            cache_salt: str = "", constraint: Constraint | None = None, priority: int = 0) -> None:
        index = len(self.choices)
        request_id = f"{self.id}-{index}"
        # a prompt's other choices wait for its first to compute it, and take it from the prefix cache
        leader = self._first.setdefault(prompt_index, request_id)
        stream = self.engine.submit(prompt_ids, params, request_id, cache_salt, constraint,
                                    after=None if leader == request_id else leader, priority=priority)
        self.choices.append(Choice(index, prompt_index, request_id, stream, out))

    async def started(self, wait: bool = True) -> None:
        """Wait for each choice's first event, so a request the engine refuses becomes a plain 400
        (or 500) before any streamed byte. Without `wait`, only what the engine refused at submit (it answers those
        at once) is raised; the rest comes to the run loop."""
        for c in self.choices:
            c.first = ev = await self._until_interrupted(c.stream.aget()) if wait else c.stream.get_nowait()
            if isinstance(ev, Rejected):
                c.done = True
                raise self._refused(ev)
            if isinstance(ev, Failed):
                c.done = True
                raise engine_error(ev.message)

    async def _until_interrupted(self, wait: Awaitable[T]) -> T:
        if self._stop is None:
            self._stop = asyncio.get_running_loop().create_future()
        task = asyncio.ensure_future(wait)
        await asyncio.wait({task, self._stop}, return_when=asyncio.FIRST_COMPLETED)
        if not task.done():
            task.cancel()
            assert self.interrupted is not None
            raise self.interrupted
        return task.result()

    def interrupt(self, error: APIError) -> None:
        """End this submission with `error`: whoever reads it raises it; its engine requests are aborted."""
        self.interrupted = error
        if self._stop is not None and not self._stop.done():
            self._stop.set_result(None)
        if self._wake is not None and not self._wake.done():
            self._wake.set_result(None)
        self.close()

    async def pieces(self) -> AsyncIterator[tuple[Choice, Piece]]:
        """Every choice's pieces as they come, a choice's in order; raises the first choice error. No task or queue
        per choice: the reader takes what its choices' streams hold, then waits on one future they all resolve (the
        engine resolves it once a step)."""
        loop = asyncio.get_running_loop()
        running = [c for c in self.choices if not c.done]
        while running and self.interrupted is None:
            for c in running:
                events = c.stream.drain()
                if c.first is not None:
                    events.insert(0, c.first)
                    c.first = None
                for ev in events:
                    if (piece := self._handle(c, ev)) is not None:
                        yield c, piece
                    if c.done:
                        break   # a stop string ended it: what the engine made after it is dropped
            if running := [c for c in running if not c.done]:
                self._wake = wake = loop.create_future()
                if all(c.stream.wake_on(loop, wake) for c in running):   # (False: an event came meanwhile)
                    await wake
        if self.interrupted is not None:
            raise self.interrupted

    def _handle(self, c: Choice, ev: Event) -> Piece | None:
        """One engine event of `c`: the piece it adds to the output, if any."""
        if isinstance(ev, Tokens):
            now = time.perf_counter()
            if c.last_token is None:
                self.metrics.ttft.observe(now - self.arrival)
            else:
                self.metrics.itl.observe(now - c.last_token)
            c.last_token = now
            piece = c.out.add(ev.token_ids, ev.samples)
            if c.out.finish_reason is not None:  # a stop string: the engine need not go on
                c.done, c.completion_tokens = True, c.out.num_tokens
                self.engine.abort(c.request_id)
                self._finished(c)
                return piece
            return piece if piece else None
        if isinstance(ev, Scheduled):
            c.cached_tokens = ev.cached_tokens
        elif isinstance(ev, PromptLogprobs):
            c.out.prompt_samples = ev.samples
        elif isinstance(ev, Finished):
            c.done, c.completion_tokens = True, ev.completion_tokens
            c.cached_tokens = ev.cached_tokens or c.cached_tokens
            piece = c.out.finish(ev.reason)
            self._finished(c)
            return piece
        elif isinstance(ev, Failed):
            c.done = True
            raise engine_error(ev.message)
        elif isinstance(ev, Rejected):
            c.done = True
            raise self._refused(ev)
        return None

    def _refused(self, ev: Rejected) -> APIError:
        """The engine's refusal as a 400 naming the client's field (the engine calls the token limit max_tokens)."""
        if ev.param == "max_tokens":
            return bad_request(ev.reason, self.max_tokens_param, "context_length_exceeded")
        return bad_request(ev.reason, ev.param)

    def _finished(self, c: Choice) -> None:
        self.metrics.e2e.observe(time.perf_counter() - self.arrival)
        self.metrics.success[c.out.finish_reason] += 1

    def close(self) -> None:
        self.live.discard(self)
        for c in self.choices:
            if not c.done:
                c.done = True
                self.engine.abort(c.request_id)

    def usage(self, num_prompt_tokens: list[int]) -> dict:
        """OpenAI usage: each prompt counted once however many choices it has (its first choice's cached tokens);
        a running choice counts the tokens it has so far."""
        completion = sum(c.completion_tokens if c.done else c.out.num_tokens for c in self.choices)
        first: dict[int, Choice] = {}
        for c in self.choices:
            first.setdefault(c.prompt_index, c)
        cached = sum(c.cached_tokens for c in first.values())
        prompt = sum(num_prompt_tokens)
        return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion,
                "prompt_tokens_details": {"cached_tokens": cached}}


class ClientDisconnected(Exception):
    pass


async def until_disconnect(receive: Callable[[], Awaitable[dict]], work: Awaitable[T]) -> T:
    """Run `work`, cancelling it if the client disconnects first. Starlette never cancels a
    non-streaming handler on disconnect, so the handler races `http.disconnect` itself; the
    body must already have been read."""
    async def disconnected() -> None:
        while (await receive())["type"] != "http.disconnect":
            pass

    task = asyncio.ensure_future(work)
    watch = asyncio.ensure_future(disconnected())
    try:
        await asyncio.wait({task, watch}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watch.cancel()
        if not task.done():
            task.cancel()
            await asyncio.wait({task})  # let its cleanup (the aborts) run before we return
    if task.cancelled():
        raise ClientDisconnected()
    return task.result()
