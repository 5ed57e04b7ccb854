"""What the host offload tier reports: counters for /metrics, and one log line per restore."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass
class OffloadStats:
    capacity_blocks: int
    used_blocks: int = 0
    saved_blocks: int = 0        # device -> host copies enqueued
    saved_ahead_blocks: int = 0  # of which by top_up(), before the device pool evicted them
    restored_blocks: int = 0     # host -> device copies enqueued
    dropped_blocks: int = 0      # evicted blocks not saved: every host slot was pinned by a restore
    queries: int = 0             # prompt tokens looked up in host memory (past the device hits)
    hits: int = 0                # of which served from it (a whole prompt: all but its last token)

    @property
    def usage(self) -> float:
        return self.used_blocks / self.capacity_blocks

    @property
    def hit_rate(self) -> float:
        return self.hits / self.queries if self.queries else 0.0


def restore_report(request_id: str, nbytes: int, blocks: int, copy_ms: float | None, saved_first: int,
                   times: tuple[float, float, float, float]) -> str:
    """Where a restored request's time to first token went: queueing its copies (host lookups,
    allocation, enqueueing), the copies on the copy stream (GPU time, where the copier times them),
    queued to landing seen by the scheduler, landing to first token (the step that computes it).
    times: (admitted, copies queued, landing seen, first token), time.monotonic() seconds."""
    admitted, issued, landed, first = times
    gb = nbytes / 1e9
    copies = "untimed"
    if copy_ms is not None:
        copies = f"{copy_ms:.1f} ms on the copy stream ({gb / max(copy_ms, 1e-3) * 1e3:.1f} GB/s)"
    return (f"KV restore {request_id}: {blocks} blocks ({gb:.2f} GB), copies {copies}, {saved_first} of its "
            f"evicted blocks saved first; queueing {(issued - admitted) * 1e3:.1f} ms, queued to landing "
            f"{(landed - issued) * 1e3:.1f} ms, landing to first token {(first - landed) * 1e3:.1f} ms")
