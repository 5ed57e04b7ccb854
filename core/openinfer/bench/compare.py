"""Two servers' `bench serve --sweep` results side by side: a Markdown table with ratios and a PNG.

Each side is a directory of the sweep's per-rate JSONs. Ratios are written so that above 1 means the
first server is better: first/second for throughput, second/first for latencies.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, Sequence

from openinfer.bench.plot import pyplot, save_figure
from openinfer.bench.stats import percentile_key

# (result key template, column title, higher is better); "{tail}" becomes e.g. p99
METRICS = (
    ("request_throughput", "req/s", True),
    ("output_throughput", "out tok/s", True),
    ("mean_ttft_ms", "mean TTFT ms", False),
    ("{tail}_ttft_ms", "{tail} TTFT ms", False),
    ("mean_tpot_ms", "mean TPOT ms", False),
    ("{tail}_tpot_ms", "{tail} TPOT ms", False),
)


def _rate(r: dict[str, Any]) -> float:
    return math.inf if r["request_rate"] == "inf" else float(r["request_rate"])


def load_sweep(directory: Path) -> list[dict[str, Any]]:
    """The directory's result JSONs, one per request rate (the newest wins), in rate order."""
    by_rate: dict[float, dict[str, Any]] = {}
    for path in sorted(directory.glob("*.json")):
        res = json.loads(path.read_text())
        if "request_rate" in res and "output_throughput" in res:
            prev = by_rate.get(_rate(res))
            if prev is None or res.get("date", "") >= prev.get("date", ""):
                by_rate[_rate(res)] = res
    return [by_rate[k] for k in sorted(by_rate)]


def _cell(value: float | None) -> str:
    return "–" if value is None or math.isnan(value) else f"{value:.3g}" if abs(value) < 100 else f"{value:.0f}"


def _ratio(a: float | None, b: float | None, higher_better: bool) -> float | None:
    if a is None or b is None or a <= 0 or b <= 0:
        return None
    return a / b if higher_better else b / a


SHORT = ("output_throughput", "mean_ttft_ms", "mean_tpot_ms")


def compare_table(names: tuple[str, str], a: Sequence[dict[str, Any]], b: Sequence[dict[str, Any]],
                  tail: str = "p99", short: bool = False) -> str:
    """Markdown: per rate, each metric for both servers and the ratio (>1: the first is better);
    `short` keeps output tok/s, mean TTFT and mean TPOT."""
    metrics = [m for m in METRICS if not short or m[0] in SHORT]
    rows_b = {_rate(r): r for r in b}
    head = ["rate", f"ok {names[0]}/{names[1]}"]
    for _, title, _ in metrics:
        t = title.format(tail=tail)
        head += [f"{t} {names[0]}", f"{t} {names[1]}", "×"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for ra in a:
        rb = rows_b.get(_rate(ra))
        if rb is None:
            continue
        cells = [str(ra["request_rate"]), f"{ra['completed']}/{rb['completed']}"]
        for key, _, higher in metrics:
            k = key.format(tail=tail)
            va, vb = ra.get(k), rb.get(k)
            ratio = _ratio(va, vb, higher)
            cells += [_cell(va), _cell(vb), "–" if ratio is None else f"{ratio:.2f}"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def plot_compare(names: tuple[str, str], a: Sequence[dict[str, Any]], b: Sequence[dict[str, Any]], path: Path,
                 tail: str = "p99") -> Path:
    plt = pyplot("the comparison plot")
    rates = sorted({_rate(r) for r in a} | {_rate(r) for r in b})
    x = {rate: i for i, rate in enumerate(rates)}  # categorical: uneven rates and inf
    fig, axes = plt.subplots(1, 3, figsize=(16, 4.5))
    panels = ((axes[0], "ttft", "TTFT (ms)"), (axes[1], "tpot", "TPOT (ms)"), (axes[2], None, "output tok/s"))
    for (ax, metric, title) in panels:
        for name, res, color in ((names[0], a, "tab:blue"), (names[1], b, "tab:orange")):
            xs = [x[_rate(r)] for r in res]
            if metric is None:
                ax.plot(xs, [r["output_throughput"] for r in res], "o-", color=color, label=name)
                continue
            ax.plot(xs, [r.get(f"mean_{metric}_ms", math.nan) for r in res], "o-", color=color, label=f"{name} mean")
            ax.plot(xs, [r.get(f"{tail}_{metric}_ms", math.nan) for r in res], "s--", color=color,
                    label=f"{name} {tail}")
        if metric is not None:
            ax.set_yscale("log")
        ax.set_title(title)
        ax.set_xticks(range(len(rates)), ["inf" if math.isinf(r) else f"{r:g}" for r in rates])
        ax.set_xlabel("request rate (req/s)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    model = next((r.get("model_id", "") for r in [*a, *b]), "")
    fig.suptitle(f"{names[0]} vs {names[1]}: bench serve sweep, {model}")
    return save_figure(fig, path)


def run_compare(sides: Sequence[str], md: Path | None, png: Path | None, percentile: float,
                short: bool = False) -> int:
    """sides: two NAME=DIR specs. Prints the table (`short`: three metrics); writes the full one and the
    plot where asked."""
    names, sweeps = [], []
    for spec in sides:
        name, sep, directory = spec.partition("=")
        if not sep or not Path(directory).is_dir():
            raise ValueError(f"expected NAME=DIR with an existing directory, got {spec!r}")
        sweep = load_sweep(Path(directory))
        if not sweep:
            raise ValueError(f"no bench serve result JSONs in {directory}")
        names.append(name)
        sweeps.append(sweep)
    pair = (names[0], names[1])
    tail = percentile_key(percentile)
    table = compare_table(pair, sweeps[0], sweeps[1], tail)
    print(compare_table(pair, sweeps[0], sweeps[1], tail, short) if short else table)
    if md is not None:
        md.parent.mkdir(parents=True, exist_ok=True)
        md.write_text(f"{names[0]} vs {names[1]} (×: above 1 means {names[0]} is better)\n\n{table}\n")
    if png is not None:
        print(f"plot saved to {plot_compare(pair, sweeps[0], sweeps[1], png, tail)}")
    return 0
