"""scripts/serve_host_profile.py's stand-in engine (forward stubbed, decode graphs emulated) steps as the server does:
every decode row, and at a mixed step the decode rows replayed beside the prompt (a stub whose forward gave no logits
failed every such step)."""
from __future__ import annotations

import importlib.util
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "serve_host_profile.py"


def test_stubbed_engine_runs_every_row() -> None:
    spec = importlib.util.spec_from_file_location("serve_host_profile", SCRIPT)
    profile = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(profile)
    steps = profile.engine_steps(64, 1024, 3, False)
    assert steps["decode tokens"] == [64] * 3
    assert steps["mixed tokens"] == [63 + 1024] * 3   # 63 decode rows beside one 1024-token prompt
