"""NVRTC compile layer: every .cu source here (or a plugin's, by path) -> a cubin for one arch, cached on disk.

Cubins, not PTX: the driver then never JIT-compiles at start, and NVRTC needs no GPU, so CI
compile-checks every source for sm_90a (`compile_all`). The cache key covers the source, the
headers it may include, the options and the NVRTC version, so a toolkit upgrade recompiles.
A first start compiles every source: `precompile` does that on background threads (NVRTC releases the GIL) while
the weights load, and a launch that needs a source being compiled waits for that compile instead of starting its own.
"""
from __future__ import annotations

import hashlib
import logging
import os
import threading
import time
from concurrent.futures import Future
from pathlib import Path
from typing import Sequence

from ...loading.disk_cache import cache_root, write_atomic

log = logging.getLogger(__name__)

SOURCE_DIR = Path(__file__).parent
OPTIONS = ("-std=c++17", "-default-device")
INSTALL_HINT = ("NVRTC is needed to compile openinfer's CUDA kernels: install the cuda13 extra (nvidia-cuda-nvrtc 13; "
                "pip install -e '.[cuda13]' in an openinfer checkout) or the cuda12 one (nvidia-cuda-nvrtc-cu12), or a "
                "CUDA toolkit")


class KernelCompileError(RuntimeError):
    pass


def sources() -> list[str]:
    """Names (without .cu) of every kernel source."""
    return sorted(p.stem for p in SOURCE_DIR.glob("*.cu"))


def cache_dir() -> Path:
    return cache_root() / "kernels"


def arch_for(major: int, minor: int) -> str:
    """sm_90a on Hopper (wgmma/setmaxnreg need the arch-specific target), sm_XY elsewhere."""
    return "sm_90a" if (major, minor) == (9, 0) else f"sm_{major}{minor}"


def _nvrtc():
    try:
        from cupy.cuda import nvrtc
        nvrtc.getVersion()
    except ImportError as e:
        raise KernelCompileError(f"cupy is not installed ({e}); {INSTALL_HINT}") from e
    except Exception as e:  # cuda-pathfinder raises its own DynamicLibNotFoundError
        raise KernelCompileError(f"no NVRTC library found ({e}); {INSTALL_HINT}") from e
    return nvrtc


def source_path(source: str | Path) -> Path:
    """A core source by name ("norm"), or a plugin's .cu file by its path."""
    return source if isinstance(source, Path) else SOURCE_DIR / f"{source}.cu"


def _headers(source_dir: Path) -> dict[str, str]:
    """The core headers (common.cuh), then those beside a plugin's source."""
    dirs = dict.fromkeys((SOURCE_DIR, source_dir))
    return {p.name: p.read_text() for d in dirs for p in sorted(d.glob("*.cuh"))}


def compile_source(source: str | Path, arch: str) -> Path:
    """The cubin path of `source` (see source_path) for `arch`, compiling it on a cache miss."""
    nvrtc = _nvrtc()
    src_path = source_path(source)
    name, src = src_path.stem, src_path.read_text()
    headers = _headers(src_path.parent)
    options = (*OPTIONS, f"-arch={arch}")
    key = hashlib.sha256(repr((src, sorted(headers.items()), options, nvrtc.getVersion())).encode()).hexdigest()[:24]
    path = cache_dir() / f"{name}-{arch}-{key}.cubin"   # the key tells apart same-named plugin sources
    if path.exists():
        return path
    with _inflight_lock:
        pending = _inflight.get(path)
        if pending is None:
            mine: Future[Path] = Future()
            _inflight[path] = mine
    if pending is not None:   # another thread (precompile's) is compiling it
        return pending.result()
    try:
        _compile(nvrtc, name, src, headers, options, arch, path)
    except BaseException as e:
        mine.set_exception(e)
        raise
    else:
        mine.set_result(path)
    finally:
        with _inflight_lock:
            del _inflight[path]
    return path


_inflight: dict[Path, Future[Path]] = {}   # cubin path -> the compile under way
_inflight_lock = threading.Lock()


def _compile(nvrtc, name: str, src: str, headers: dict[str, str], options: tuple[str, ...], arch: str,
             path: Path) -> None:
    t0 = time.perf_counter()
    prog = nvrtc.createProgram(src, f"{name}.cu", [h.encode() for h in headers.values()],
                               [n.encode() for n in headers])
    try:
        try:
            nvrtc.compileProgram(prog, list(options))
        except nvrtc.NVRTCError as e:
            raise KernelCompileError(f"NVRTC failed on {name}.cu for {arch}:\n{nvrtc.getProgramLog(prog)}") from e
        cubin = nvrtc.getCUBIN(prog)
    finally:
        nvrtc.destroyProgram(prog)
    write_atomic(path, cubin)
    log.info("compiled %s.cu for %s in %.2f s (%d bytes)", name, arch, time.perf_counter() - t0, len(cubin))


def precompile(arch: str, names: Sequence[str] | None = None, workers: int | None = None) -> list[threading.Thread]:
    """Compile `names` (default: every core source) for `arch` on `workers` daemon threads (default: one a CPU, at
    most 8), largest source first; returns the threads. Sources already cached cost a hash each. A failure is left
    for the launch that needs the source, which compiles it again and raises."""
    todo = sorted(names if names is not None else sources(), key=lambda n: source_path(n).stat().st_size)
    lock = threading.Lock()

    def work() -> None:
        while True:
            with lock:
                if not todo:
                    return
                name = todo.pop()   # the largest left
            try:
                compile_source(name, arch)
            except Exception:  # noqa: BLE001 — raised again where the kernel is launched
                log.debug("background compile of %s failed", name, exc_info=True)

    threads = [threading.Thread(target=work, name=f"nvrtc-{i}", daemon=True)
               for i in range(min(workers or os.cpu_count() or 1, 8, len(todo)))]
    for t in threads:
        t.start()
    return threads


def compile_all(arch: str = "sm_90a") -> dict[str, Path]:
    """Compile every source for `arch`; needs NVRTC, not a GPU (the CI compile check)."""
    return {name: compile_source(name, arch) for name in sources()}
