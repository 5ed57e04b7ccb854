"""A small stderr progress bar (tqdm is not a dependency): count, percent, elapsed, ETA, rate."""

from __future__ import annotations

import sys
import time
from typing import TextIO


def _clock(seconds: float) -> str:
    m, s = divmod(int(seconds), 60)
    return f"{m:02d}:{s:02d}"


class Progress:
    """Redraws one line at most every `min_interval` seconds, so a fast run does not flood the terminal."""

    def __init__(self, total: int, desc: str = "", stream: TextIO | None = None, disable: bool = False,
                 width: int = 30, min_interval: float = 0.1) -> None:
        self.total, self.desc, self.width, self.min_interval = total, desc, width, min_interval
        self.stream = stream if stream is not None else sys.stderr
        self.disable = disable
        self.n = 0
        self._t0 = time.perf_counter()
        self._last_draw = 0.0
        self._drawn = -1  # the count last drawn, so close() does not repeat the final line

    def render(self, elapsed: float) -> str:
        frac = self.n / self.total if self.total else 1.0
        filled = int(frac * self.width)
        rate = self.n / elapsed if elapsed > 0 else 0.0
        eta = (self.total - self.n) / rate if rate > 0 else 0.0
        bar = "#" * filled + "-" * (self.width - filled)
        head = f"{self.desc}: " if self.desc else ""
        return f"{head}{frac:4.0%}|{bar}| {self.n}/{self.total} [{_clock(elapsed)}<{_clock(eta)}, {rate:.2f} it/s]"

    def update(self, n: int = 1) -> None:
        self.n += n
        now = time.perf_counter()
        if not self.disable and (now - self._last_draw >= self.min_interval or self.n >= self.total):
            self._last_draw, self._drawn = now, self.n
            self.stream.write("\r" + self.render(now - self._t0))
            self.stream.flush()

    def close(self) -> None:
        if not self.disable:
            final = "" if self._drawn == self.n else "\r" + self.render(time.perf_counter() - self._t0)
            self.stream.write(final + "\n")
            self.stream.flush()
