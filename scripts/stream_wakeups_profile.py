"""Engine-thread CPU time a step spends handing its events to a server's event loop (CPU only).

N streams, each read by an asyncio task on a loop in another thread (as the HTTP server reads them);
each "step" puts one Tokens event into every stream, then sleeps 2 ms (the GPU's share of a step)
so the readers catch up. Compares one loop wakeup per put with the batched wakeups Engine.step uses.
    python scripts/stream_wakeups_profile.py [--streams 128] [--steps 200]
"""
from __future__ import annotations

import argparse
import asyncio
import contextlib
import threading
import time

from openinfer.request import Finished, RequestStream, Scheduled, Tokens, wakeups_batched


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--streams", type=int, default=128)
    ap.add_argument("--steps", type=int, default=200)
    a = ap.parse_args()
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    streams = [RequestStream(f"r{i}") for i in range(a.streams)]
    for s in streams:
        s.put(Scheduled(0))

    async def read(s: RequestStream) -> None:
        async for _ in s:   # until the Finished event
            pass

    tasks = [asyncio.run_coroutine_threadsafe(read(s), loop) for s in streams]
    time.sleep(0.3)

    def step_ms(batched: bool) -> float:
        t = time.thread_time()
        for _ in range(a.steps):
            with wakeups_batched() if batched else contextlib.nullcontext():
                for s in streams:
                    s.put(Tokens([1], []))
            time.sleep(0.002)
        return (time.thread_time() - t) / a.steps * 1e3

    for batched in (False, True, False, True):
        print(f"{'one wakeup a step' if batched else 'one wakeup a put':>18}: "
              f"{step_ms(batched):.3f} ms of engine-thread CPU per step of {a.streams} events")
    for s in streams:
        s.put(Finished("length", 1, 1, 0))
    for t in tasks:
        t.result(timeout=10)
    loop.call_soon_threadsafe(loop.stop)
    thread.join(timeout=10)


if __name__ == "__main__":
    main()
