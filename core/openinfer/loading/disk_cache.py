"""The on-disk cache of things rebuilt from a hash of their inputs (compiled kernels, unpacked
tokenizers): $OPENINFER_CACHE_DIR, else ~/.cache/openinfer; entries are written atomically."""
from __future__ import annotations

import os
import tempfile
from pathlib import Path


def cache_root() -> Path:
    root = os.environ.get("OPENINFER_CACHE_DIR")
    return Path(root) if root else Path.home() / ".cache" / "openinfer"


def write_atomic(path: Path, data: bytes) -> None:
    """Write then rename, so a concurrent process never reads half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile(dir=path.parent, delete=False, suffix=".tmp") as f:
        f.write(data)
    os.replace(f.name, path)
