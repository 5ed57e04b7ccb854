"""What the serving process's resident memory is made of, stage by stage (Linux /proc).

    python scripts/rss_breakdown.py MODEL_DIR [--device cuda]
Prints RSS (anonymous / file-backed / shared-memory parts) after each start-up stage of
`openinfer serve`: imports, the CUDA context, cuBLAS, the engine load, the HTTP app.
"""
from __future__ import annotations

import argparse
import sys
import time


def rss() -> dict[str, int]:
    out = {}
    with open("/proc/self/status") as f:
        for line in f:
            key = line.split(":")[0]
            if key in ("VmRSS", "RssAnon", "RssFile", "RssShmem"):
                out[key] = int(line.split()[1]) // 1024
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("--device", default="cuda")
    a = ap.parse_args()
    rows, t0 = [], time.perf_counter()

    def mark(stage: str) -> None:
        rows.append((stage, time.perf_counter() - t0, rss()))

    mark("python")
    import numpy  # noqa: F401
    import starlette.applications  # noqa: F401
    import uvicorn  # noqa: F401
    mark("numpy + starlette + uvicorn")
    import cupy
    mark("import cupy")
    cupy.cuda.Device(0).use()
    cupy.zeros(1)
    mark("CUDA context")
    from openinfer.kernels.cuda.blas import linear
    x = cupy.zeros((1, 64), dtype=cupy.float32)
    linear(x, x)
    mark("cuBLAS handle + first GEMM")
    from openinfer.engine import EngineArgs, build_engine
    eng = build_engine(a.model, EngineArgs(device=a.device))
    mark("engine loaded (weights, KV, graphs)")
    from openinfer.server.app import create_app
    from openinfer.server.host import ModelHost
    create_app(ModelHost([eng]))
    mark("HTTP app")
    print(f"{'stage':<36} {'s':>6} {'RSS MB':>7} {'anon':>6} {'file':>6} {'shmem':>6}")
    for stage, t, r in rows:
        print(f"{stage:<36} {t:6.2f} {r['VmRSS']:7d} {r['RssAnon']:6d} {r['RssFile']:6d} {r['RssShmem']:6d}")
    print("torch imported:", "torch" in sys.modules)


if __name__ == "__main__":
    main()
