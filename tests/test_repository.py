"""The repository around the code: every environment variable the core or a plugin reads is a deployment setting
documented in the README's table (kernel choices are `--kernel`, not the environment)."""
from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_every_environment_variable_is_documented():
    names = set()
    for f in [*(ROOT / "core" / "openinfer").rglob("*.py"), *(ROOT / "plugins").glob("*/openinfer_*/**/*.py")]:
        names |= set(re.findall(r"\bOPENINFER_[A-Z0-9_]+", f.read_text()))
    readme = (ROOT / "README.md").read_text()
    table = readme[readme.index("## Environment variables"):]
    table = table[:table.index("\n## ")]
    documented = set(re.findall(r"^\| `(OPENINFER_[A-Z0-9_]+)`", table, re.M))
    assert names == documented, f"read but not documented: {sorted(names - documented)}; " \
                                f"documented but never read: {sorted(documented - names)}"
