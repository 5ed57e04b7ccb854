"""Sum an `ncu --csv --metrics gpu__time_duration.sum` log by kernel: calls, total µs, share, largest first.
Where the log holds gpu_kernel_times.py's marker kernels, only the kernels between the last pair count.
    python scripts/ncu_table.py LOG [--top 25]
"""
from __future__ import annotations

import argparse
import csv
import io
import re
from collections import defaultdict

UNIT_US = {"nsecond": 1e-3, "ns": 1e-3, "usecond": 1.0, "us": 1.0, "msecond": 1e3, "ms": 1e3, "second": 1e6}


def short(name: str) -> str:
    """`void ns::kernel<...>(args)` -> `kernel<...>`, cut to 70 characters."""
    name = re.sub(r"\(.*\)$", "", name.removeprefix("void ").strip())
    return name.split("::")[-1][:70]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("log")
    ap.add_argument("--top", type=int, default=25)
    a = ap.parse_args()
    text = open(a.log, errors="replace").read()
    start = text.find('"ID"')
    if start < 0:
        raise SystemExit(f"{a.log}: no ncu CSV table in it (did the profiled range launch any kernel?)")
    calls: dict[str, int] = defaultdict(int)
    total: dict[str, float] = defaultdict(float)
    rows = [r for r in csv.DictReader(io.StringIO(text[start:])) if r.get("Metric Name") == "gpu__time_duration.sum"]
    names = [r["Kernel Name"] for r in rows]
    if any("openinfer_step_begin" in n for n in names):   # keep only the step between the markers
        first = max(i for i, n in enumerate(names) if "openinfer_step_begin" in n)
        last = min(i for i, n in enumerate(names) if "openinfer_step_end" in n and i > first)
        rows = rows[first + 1: last]
    for row in rows:
        k = short(row["Kernel Name"])
        calls[k] += 1
        total[k] += float(row["Metric Value"].replace(",", "")) * UNIT_US[row["Metric Unit"]]
    whole = sum(total.values())
    print(f"{sum(calls.values())} kernels, {whole:.1f} µs of kernel time")
    print(f"{'µs':>9} {'share':>6} {'calls':>6}  kernel")
    for k in sorted(total, key=total.get, reverse=True)[: a.top]:
        print(f"{total[k]:9.1f} {100 * total[k] / whole:5.1f}% {calls[k]:6d}  {k}")


if __name__ == "__main__":
    main()
