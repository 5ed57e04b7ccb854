"""How long a first start spends compiling the core kernels (no GPU needed): every source one after another
(compile_all, as launches did on first use until stop 19), through precompile's background threads, and
precompile again on the warm cache.

    python scripts/compile_bench.py [--arch sm_90a]
"""
from __future__ import annotations

import argparse
import os
import tempfile
import time

from openinfer.kernels.cuda import compile as kc


def timed(fn) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def join_all(threads) -> None:
    for t in threads:
        t.join()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--arch", default="sm_90a")
    arch = ap.parse_args().arch
    os.environ["OPENINFER_CACHE_DIR"] = tempfile.mkdtemp()
    serial = timed(lambda: kc.compile_all(arch))
    os.environ["OPENINFER_CACHE_DIR"] = tempfile.mkdtemp()
    background = timed(lambda: join_all(kc.precompile(arch)))
    warm = timed(lambda: join_all(kc.precompile(arch)))
    print(f"{len(kc.sources())} core sources for {arch}, {os.cpu_count()} CPUs: one by one {serial:.1f} s, "
          f"precompile {background:.1f} s, precompile warm {warm * 1e3:.0f} ms")


if __name__ == "__main__":
    main()
