"""A fake engine with exactly the Engine API the server uses, replaying scripted token sequences.

It runs its own step thread (one token per running request per step, `step_s` apart), honours
abort, max_tokens, min_tokens, eos / stop_token_ids and ignore_eos like the real engine, keeps a
prefix cache by longest common prefix, and records what it was sent, so server behaviour (tool
calls, reasoning, stop strings, logprobs, disconnect aborts) is tested deterministically.
"""
from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Callable

from openinfer.engine.request import Failed, Finished, Rejected, RequestStream, Scheduled, Tokens
from openinfer.sampling.sampler import SampleResult, SamplingParams
from openinfer.text.tokenizer import Tokenizer
from openinfer_qwen3.chat import DEMO_TOKENIZER_DIR, QWEN3_CHAT_FORMAT

Script = Callable[[list[int], SamplingParams], list[int]]


@lru_cache(maxsize=1)
def demo_tokenizer() -> Tokenizer:
    return Tokenizer.from_dir(DEMO_TOKENIZER_DIR)


@dataclass
class FakeStats:
    num_running: int
    num_waiting: int
    kv_usage: float
    prefix_queries: int
    prefix_hits: int
    prompt_tokens: int
    generation_tokens: int


@dataclass
class _Req:
    rid: str
    prompt: list[int]
    params: SamplingParams
    stream: RequestStream
    script: list[int]
    out: list[int] = field(default_factory=list)
    scheduled: bool = False
    cached: int = 0


class FakeEngine:
    def __init__(self, name: str = "fake", max_model_len: int = 4096, step_s: float = 0.0,
                 kv_tokens: int = 1 << 20) -> None:
        self.name = name
        self.tokenizer = demo_tokenizer()
        self.chat_format = QWEN3_CHAT_FORMAT
        self.max_model_len = max_model_len
        self.max_num_seqs = 256
        self.vocab_size = self.tokenizer.vocab_size
        self.eos_token_ids = self.tokenizer.eos_token_ids
        self.eos = min(self.eos_token_ids)
        self.filler = self.tokenizer.encode(" x")[0]   # what it says once the script runs out
        self.step_s = step_s
        self.paused = False   # True: requests wait unscheduled (a full engine)
        self.scheduling_policy = "fcfs"   # as EngineArgs': a priority other than 0 is refused under fcfs
        self.priorities: dict[str, int] = {}   # request id -> the priority it was submitted with
        self.salts: dict[str, str] = {}        # request id -> the cache_salt it was submitted with
        self.kv_tokens = kv_tokens
        self.dead_reason: str | None = None
        self.sampling_defaults: dict = {}   # a test sets the model's generation_config defaults
        self.submitted: list[tuple[str, list[int], SamplingParams]] = []
        self.aborted: list[str] = []
        self.script: Script = lambda prompt, params: self.tokenizer.encode("Hello from the fake engine.") + [self.eos]
        self._active: dict[str, _Req] = {}
        self._aborts: set[str] = set()
        self._seen: list[list[int]] = []
        self._counters = [0, 0, 0, 0]   # prefix queries, prefix hits, prompt tokens, generation tokens
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stop = False
        self._thread: threading.Thread | None = None

    # ---- test helpers ----
    def say(self, text: str, eos: bool = True) -> None:
        ids = self.tokenizer.encode(text) + ([self.eos] if eos else [])
        self.script = lambda prompt, params: ids

    def reset(self) -> None:
        self.say("Hello from the fake engine.")
        self.step_s = 0.0
        self.paused = False
        self.submitted.clear()
        self.aborted.clear()
        self.priorities.clear()
        self.salts.clear()
        self.scheduling_policy = "fcfs"

    def kill(self, reason: str = "simulated crash") -> None:
        self.dead_reason = reason

    # ---- the Engine API ----
    def submit(self, prompt_ids: list[int], params: SamplingParams, request_id: str | None = None,
               cache_salt: str = "", constraint: object = None, after: str | None = None,
               priority: int = 0) -> RequestStream:
        """A structured output's `constraint` is not followed, nor `after` (each choice runs at once): the script
        is what comes out."""
        rid = request_id or f"fake-{len(self.submitted)}"
        stream = RequestStream(rid)
        self.submitted.append((rid, list(prompt_ids), params))
        self.priorities[rid] = priority
        self.salts[rid] = cache_salt
        if priority and self.scheduling_policy != "priority":
            stream.put(Rejected(f"priority {priority} needs the priority scheduling policy", "priority"))
            return stream
        if len(prompt_ids) + params.max_tokens > self.kv_tokens:
            stream.put(Rejected(f"the request needs {len(prompt_ids) + params.max_tokens} tokens of KV cache "
                                f"but the pool holds {self.kv_tokens}", "max_tokens"))
            return stream
        try:
            script = list(self.script(list(prompt_ids), params))
        except Exception as e:  # a scripted engine failure for this request
            stream.put(Failed(str(e)))
            return stream
        with self._lock:
            self._active[rid] = _Req(rid, list(prompt_ids), params, stream, script)
        self._wake.set()
        return stream

    def abort(self, request_id: str) -> None:
        with self._lock:
            self.aborted.append(request_id)
            self._aborts.add(request_id)
        self._wake.set()

    def is_alive(self) -> bool:
        return self.dead_reason is None

    def stats(self) -> FakeStats:
        with self._lock:
            running = [r for r in self._active.values() if r.scheduled]
            used = sum(len(r.prompt) + len(r.out) for r in running)
            return FakeStats(len(running), len(self._active) - len(running), used / self.kv_tokens, *self._counters)

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._loop, name=f"fake-{self.name}", daemon=True)
            self._thread.start()

    def shutdown(self) -> None:
        self._stop = True
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=5)

    # ---- the step thread ----
    def _loop(self) -> None:
        while not self._stop:
            if self.dead_reason is not None:
                with self._lock:
                    reqs, self._active = list(self._active.values()), {}
                for r in reqs:
                    r.stream.put(Failed(f"engine died: {self.dead_reason}"))
                self._wake.wait(0.05)
                continue
            with self._lock:
                reqs = [r for r in self._active.values() if not self.paused or r.rid in self._aborts]
            if not reqs:
                self._wake.wait(0.05)
                self._wake.clear()
                continue
            for r in reqs:
                self._step(r)
            if self.step_s:
                time.sleep(self.step_s)

    def _finish(self, r: _Req, ev: Finished) -> None:
        with self._lock:
            self._active.pop(r.rid, None)
        r.stream.put(ev)

    def _step(self, r: _Req) -> None:
        with self._lock:
            aborted = r.rid in self._aborts
        if aborted:
            return self._finish(r, Finished("abort", len(r.prompt), len(r.out), r.cached))
        if not r.scheduled:
            r.cached = cached = min(max((_lcp(r.prompt, s) for s in self._seen), default=0), len(r.prompt) - 1)
            with self._lock:
                self._seen.append(r.prompt)
                self._counters[0] += len(r.prompt)
                self._counters[1] += cached
                self._counters[2] += len(r.prompt)
                r.scheduled = True
            r.stream.put(Scheduled(cached))
        p = r.params
        stops = set(p.stop_token_ids) | (set() if p.ignore_eos else self.eos_token_ids)
        k = len(r.out)
        tok = r.script[k] if k < len(r.script) else self.filler
        if tok in stops and k < p.min_tokens:
            tok = self.filler  # the real engine masks stop tokens until min_tokens
        r.out.append(tok)
        with self._lock:
            self._counters[3] += 1
        r.stream.put(Tokens([tok], [_sample(tok, k, p)]))
        if tok in stops:
            self._finish(r, Finished("stop", len(r.prompt), len(r.out), r.cached, tok))
        elif len(r.out) >= p.max_tokens or len(r.prompt) + len(r.out) >= self.max_model_len:
            self._finish(r, Finished("length", len(r.prompt), len(r.out), r.cached))


def _sample(tok: int, k: int, p: SamplingParams) -> SampleResult:
    if p.logprobs is None:
        return SampleResult(tok)
    lp = -0.5 * (k % 3)
    top = [(tok, lp)] + [(tok + i, lp - i) for i in range(1, p.logprobs)]
    return SampleResult(tok, lp, top[:p.logprobs] or None)


def _lcp(a: list[int], b: list[int]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n
