"""`bench compare`: two sweep directories → a table with ratios (>1: the first server is better) and a plot."""

from __future__ import annotations

import json
from pathlib import Path

from conftest import run_cli
from openinfer.bench.compare import load_sweep


def _write(directory: Path, rate, req_s: float, ttft: float, date: str = "20260101-000000", **extra) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    res = {"request_rate": rate, "date": date, "model_id": "m", "completed": 10, "failed": 0,
           "request_throughput": req_s, "output_throughput": req_s * 100, "total_token_throughput": req_s * 300,
           "mean_ttft_ms": ttft, "p99_ttft_ms": ttft * 2, "mean_tpot_ms": 10.0, "p99_tpot_ms": 20.0, **extra}
    (directory / f"{rate}-{date}.json").write_text(json.dumps(res))


def test_table_ratios_and_plot(tmp_path: Path, capsys) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    for rate, req_s, ttft in ((1.0, 1.0, 50.0), ("inf", 8.0, 400.0), (2.0, 2.0, 60.0)):
        _write(a, rate, req_s, ttft)
        _write(b, rate, req_s / 4, ttft * 3)
    _write(a, 2.0, 0.5, 999.0, date="20250101-000000")  # an older run at the same rate is ignored
    (a / "notes.json").write_text("{}")                  # not a result
    assert [r["request_rate"] for r in load_sweep(a)] == [1.0, 2.0, "inf"]

    md, png = tmp_path / "out" / "t.md", tmp_path / "out" / "c.png"
    assert run_cli("bench", "compare", f"fast={a}", f"slow={b}", "--md", str(md), "--png", str(png)) == 0
    rows = [ln.split(" | ") for ln in md.read_text().splitlines() if ln.startswith("| ") and "rate" not in ln]
    assert [r[0] for r in rows] == ["| 1.0", "| 2.0", "| inf"]
    inf = rows[2]
    # req/s a, b, ×; out tok/s a, b, ×; mean TTFT a, b, × ...
    assert inf[1] == "10/10" and inf[2:5] == ["8", "2", "4.00"] and inf[5:8] == ["800", "200", "4.00"]
    assert inf[8:11] == ["400", "1200", "3.00"] and inf[14:17] == ["10", "10", "1.00"]
    assert "p99 TTFT ms fast" in md.read_text() and png.stat().st_size > 10_000
    assert "| inf |" in capsys.readouterr().out
    assert run_cli("bench", "compare", f"fast={a}", f"slow={b}", "--short") == 0
    short = capsys.readouterr().out.splitlines()
    assert short[0].count("×") == 3 and "| inf | 10/10 | 800 | 200 | 4.00 | 400 | 1200 | 3.00 | 10 | 10 | 1.00 |" in short

    assert run_cli("bench", "compare", f"a={a}", f"b={tmp_path / 'missing'}") == 1
    assert run_cli("bench", "compare", f"a={a}", f"b={tmp_path / 'out'}") == 1  # no results there
