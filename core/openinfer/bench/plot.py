"""PNG of a request-rate sweep: TTFT, TPOT and output throughput against the offered rate."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence


def plot_sweep(results: Sequence[dict[str, Any]], path: Path, tail: str = "p99", by: str = "request_rate") -> Path:
    """`tail` names the high percentile drawn next to the mean (the key must be in the results); `by`: the key
    the sweep varies, request_rate or max_concurrency."""
    plt = pyplot("the sweep plot")
    # Categorical x positions: the rates are spread unevenly and include inf, which no numeric axis holds.
    labels = [str(r[by]) for r in results]
    x = list(range(len(results)))
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
    for ax, metric, title in ((axes[0], "ttft", "TTFT (ms)"), (axes[1], "tpot", "TPOT (ms)")):
        ax.plot(x, [r.get(f"mean_{metric}_ms", float("nan")) for r in results], "o-", label="mean")
        ax.plot(x, [r.get(f"{tail}_{metric}_ms", float("nan")) for r in results], "s--", label=tail)
        ax.set_title(title)
        ax.legend()
    axes[2].plot(x, [r["output_throughput"] for r in results], "o-", label="output tok/s")
    axes[2].plot(x, [r["total_token_throughput"] for r in results], "s--", label="total tok/s")
    axes[2].set_title("Throughput (tok/s)")
    axes[2].legend()
    for ax in axes:
        ax.set_xticks(x, labels)
        ax.set_xlabel("request rate (req/s)" if by == "request_rate" else "max concurrency")
        ax.grid(alpha=0.3)
    model = results[0].get("model_id", "") if results else ""
    fig.suptitle(f"bench serve sweep: {model}")
    return save_figure(fig, path)


def pyplot(what: str) -> Any:
    """matplotlib.pyplot on the file-only backend (no display on servers / CI), or an error naming
    `what` needs it."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as e:
        raise RuntimeError(f"{what} needs matplotlib: pip install matplotlib (the plot extra)") from e
    return plt


def save_figure(fig: Any, path: Path) -> Path:
    """Write a matplotlib figure as a PNG (creating its folder) and release it."""
    plt = pyplot("saving a figure")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
