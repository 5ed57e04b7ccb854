"""A request inside the engine, and the ordered event stream its client reads.

Events: Scheduled -> PromptLogprobs (when asked) -> Tokens... -> exactly one terminal (Finished,
Failed or Rejected). The order is enforced by `RequestStream.put`; a client reads with
`for ev in stream` (threads) or `async for ev in stream` (asyncio), and the engine thread never
blocks on a slow reader.
"""
from __future__ import annotations

import asyncio
import enum
import threading
from collections import deque
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, AsyncIterator, Iterator, Sequence

import numpy as np

from ..sampling.sampler import SamplingParams, SampleResult

if TYPE_CHECKING:   # sampling/structured.py is only needed by requests that carry a constraint
    from ..sampling.structured import Constraint


@dataclass
class Scheduled:
    cached_tokens: int            # prompt tokens served from the prefix cache


@dataclass(slots=True)   # slots: one is made per running request and step
class Tokens:
    token_ids: list[int]
    # logprob details, one per token; empty for a token that is the plain argmax (its request asks for no logprobs)
    samples: Sequence[SampleResult]


@dataclass
class PromptLogprobs:
    samples: list[SampleResult]   # prompt tokens 1.. (the first has no context to score it), before any Tokens


@dataclass
class Finished:
    reason: str                   # "stop" (eos / stop token), "length", "abort"
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int
    stop_token: int | None = None


@dataclass
class Failed:
    message: str                  # an engine error during this request's step


@dataclass
class Rejected:
    reason: str                   # why it can never run (context length, KV budget)
    param: str | None = None


Event = Scheduled | PromptLogprobs | Tokens | Finished | Failed | Rejected
TERMINAL = (Finished, Failed, Rejected)


class EventOrderError(RuntimeError):
    pass


class _Held(threading.local):
    """The asyncio wakeups this thread holds back until the end of a step (None: none held, wake at once). A class
    default rather than getattr(..., None): put() reads it once per running request and step."""
    wakeups: list[tuple[asyncio.AbstractEventLoop, asyncio.Future]] | None = None


_held = _Held()


@contextmanager
def wakeups_batched() -> Iterator[None]:
    """Within, put() on this thread holds back the asyncio wakeups of waiting readers; on exit, one
    call_soon_threadsafe per event loop resolves them all. A step puts an event for every running
    request, and each call_soon_threadsafe writes the loop's self-pipe: one write a step, not one
    a running request."""
    held: list[tuple[asyncio.AbstractEventLoop, asyncio.Future]] = []
    _held.wakeups = held
    try:
        yield
    finally:
        _held.wakeups = None
        for loop in {loop for loop, _ in held}:   # comprehensions, not a Python step per running request
            try:
                loop.call_soon_threadsafe(_resolve, [fut for at, fut in held if at is loop])
            except RuntimeError:   # the loop is closed: nobody is left to read these streams
                pass


def _resolve(futs: list[asyncio.Future]) -> None:
    for fut in futs:
        if not fut.done():
            fut.set_result(None)


class RequestStream:
    """Thread-safe, ordered, single-consumer event queue of one request."""

    def __init__(self, request_id: str) -> None:
        self.request_id = request_id
        self._events: deque[Event] = deque()
        # put() takes the lock itself (Condition's own enter/exit are Python calls) and notifies only
        # while a get() is blocked: it runs once per running request and step on the engine thread
        self._lock = threading.RLock()
        self._cond = threading.Condition(self._lock)
        self._blocked = 0              # threads inside get()'s wait
        self._state = "new"            # new -> scheduled -> streaming (tokens came) -> done
        self._waiter: tuple[asyncio.AbstractEventLoop, asyncio.Future] | None = None

    @property
    def done(self) -> bool:
        return self._state == "done"

    def put(self, ev: Event) -> None:
        with self._lock:
            if type(ev) is Tokens and self._state == "streaming":
                pass   # in order; tested first, as one comes per running request and step
            elif self._state == "done":
                raise EventOrderError(f"{self.request_id}: {type(ev).__name__} after the terminal event")
            elif isinstance(ev, Scheduled):
                if self._state != "new":
                    raise EventOrderError(f"{self.request_id}: scheduled twice")
                self._state = "scheduled"
            elif isinstance(ev, (Tokens, PromptLogprobs)):
                if self._state != "scheduled":
                    raise EventOrderError(f"{self.request_id}: {type(ev).__name__} "
                                          f"{'before scheduled' if self._state == 'new' else 'after tokens'}")
                if isinstance(ev, Tokens):
                    self._state = "streaming"
            elif isinstance(ev, TERMINAL):
                if isinstance(ev, Finished) and self._state == "new" and ev.reason != "abort":
                    raise EventOrderError(f"{self.request_id}: finished before scheduled")
                self._state = "done"
            self._events.append(ev)
            if self._blocked:
                self._cond.notify_all()
            waiter, self._waiter = self._waiter, None
        if waiter is not None:
            held = _held.wakeups
            if held is not None:
                held.append(waiter)
            else:
                waiter[0].call_soon_threadsafe(_resolve, [waiter[1]])

    def get(self, timeout: float | None = None) -> Event:
        with self._cond:
            self._blocked += 1
            try:
                arrived = self._cond.wait_for(lambda: self._events, timeout)
            finally:
                self._blocked -= 1
            if not arrived:
                raise TimeoutError(f"no event for {self.request_id} within {timeout}s")
            return self._events.popleft()

    def get_nowait(self) -> Event | None:
        """The next event if one is queued, else None."""
        with self._lock:
            return self._events.popleft() if self._events else None

    def drain(self) -> list[Event]:
        """Every event queued so far, without waiting."""
        with self._lock:
            events = list(self._events)
            self._events.clear()
        return events

    def __iter__(self) -> Iterator[Event]:
        while True:
            ev = self.get()
            yield ev
            if isinstance(ev, TERMINAL):
                return

    def wake_on(self, loop: asyncio.AbstractEventLoop, fut: asyncio.Future) -> bool:
        """Have the next put() resolve `fut` (on `loop`; several streams may share one); False, arming nothing, when
        an event is already queued."""
        with self._lock:
            if self._events:
                return False
            self._waiter = (loop, fut)
            return True

    async def aget(self) -> Event:
        while True:
            ev = self.get_nowait()
            if ev is not None:
                return ev
            loop = asyncio.get_running_loop()
            fut = loop.create_future()
            if self.wake_on(loop, fut):
                await fut

    async def __aiter__(self) -> AsyncIterator[Event]:
        while True:
            ev = await self.aget()
            yield ev
            if isinstance(ev, TERMINAL):
                return


class Status(enum.Enum):
    WAITING = "waiting"
    RESTORING = "restoring"     # admitted; its prefix is being copied back from the host tier
    RUNNING = "running"
    FINISHED = "finished"


@dataclass(eq=False)   # compared by identity: the scheduler's queue removals would compare every field of each
class Request:          # request before the one removed (~55 µs for the middle of 256 running)
    """Scheduling state of one sequence. `num_computed` tokens have their KV in the cache."""
    request_id: str
    prompt_ids: list[int]
    params: SamplingParams
    stream: RequestStream
    arrival: float
    output_ids: list[int] = field(default_factory=list)
    status: Status = Status.WAITING
    num_computed: int = 0
    cached_tokens: int = 0
    block_ids: list[int] = field(default_factory=list)
    reserved_blocks: int = 0        # lifetime blocks reserved at admission, not yet allocated
    num_hashed_blocks: int = 0      # leading full blocks already registered in the prefix cache
    block_hashes: list[int] = field(default_factory=list)
    state_slot: int | None = None   # row of its bounded state (hybrid models), held while running
    # (position, state row): the scheduled prefill step saves its state after token `position` there
    state_checkpoint: tuple[int, int] | None = None
    cache_salt: str = ""
    stop_ids: frozenset[int] = frozenset()     # the sampled ids that end it (stop ids, eos unless ignored)
    plain_greedy: bool = False                  # params.is_plain_greedy(), taken once at submit
    rng: np.random.Generator | None = None      # the host sampler's
    sample_stream: int = 0                      # the device sampler's Philox stream when unseeded
    prompt_unique: np.ndarray | None = None     # the prompt's distinct ids (repetition penalty), once
    constraint: Constraint | None = None        # structured output: the grammar its tokens must follow
    prompt_logprobs: list[SampleResult] | None = None   # scored prompt tokens so far, when params ask for them
    priority: int = 0                           # lower is admitted first under the priority scheduling policy
    after: str | None = None                    # submit's `after`: the id of another choice of the same prompt
    leader: Request | None = None               # ... that request, found when the engine takes this one in
    first_token_time: float | None = None
    last_token_time: float | None = None
    aborted: bool = False

    @property
    def all_ids(self) -> list[int]:
        return self.prompt_ids + self.output_ids

    def token_slice(self, start: int, end: int) -> list[int]:
        """all_ids[start:end] without copying the rest of the sequence (a decode step wants one id)."""
        n = len(self.prompt_ids)
        if end <= n:
            return self.prompt_ids[start:end]
        if start >= n:
            return self.output_ids[start - n: end - n]
        return self.prompt_ids[start:] + self.output_ids[: end - n]

    @property
    def masked(self) -> bool:
        """Its tokens come from a subset of the vocabulary (a grammar, allowed_token_ids or bad words): it is
        sampled on the host, where the mask is."""
        p = self.params
        return self.constraint is not None or p.allowed_token_ids is not None or bool(p.bad_words_ids)

    def waits_for_leader(self) -> bool:
        """Whether its leader is still computing the prompt they share (so admitting it now would compute the
        prompt twice); once the leader is done with it, the prefix cache holds it and the link is dropped."""
        lead = self.leader
        if lead is None:
            return False
        if lead.status == Status.FINISHED or lead.num_computed >= len(lead.prompt_ids) - 1:
            self.leader = None
            return False
        return True

    @property
    def reads_prefix_cache(self) -> bool:
        """A request scoring its prompt computes every prompt token: a cached one has no logits."""
        return self.params.prompt_logprobs is None

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_ids) + len(self.output_ids)

    @property
    def max_total_tokens(self) -> int:
        return len(self.prompt_ids) + self.params.max_tokens
