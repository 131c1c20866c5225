"""``cugraphrt bench`` on a GPU: a quick run of one workload writes a valid report."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from cugraphrt.bench.records import BenchReport

pytestmark = pytest.mark.gpu

ROOT = Path(__file__).resolve().parents[2]


def _env() -> dict[str, str]:
    env = dict(os.environ)
    # The project and the adapter from this checkout, ahead of whatever is installed; the
    # rest of PYTHONPATH (where pydantic may live) is kept.
    paths = [str(ROOT), str(ROOT / "adapters"), env.get("PYTHONPATH", "")]
    env["PYTHONPATH"] = os.pathsep.join(p for p in paths if p)
    return env


def test_quick_replay_writes_a_valid_json_report(tmp_path):
    path = tmp_path / "bench.json"
    proc = subprocess.run(
        [sys.executable, "-m", "cugraphrt", "bench", "--quick", "--only", "replay",
         "--json", str(path), "--no-progress"],
        cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=300)
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output
    report = BenchReport.model_validate_json(path.read_text())
    assert report.quick and not report.errors
    assert {r.workload for r in report.rows} == {"replay"}
    assert list(report.workload_s) == ["replay"] and report.workload_s["replay"] > 0
    systems = {r.system for r in report.records}
    assert {"cugraphrt", "cupy_graph", "cugraphrt_launcher", "cugraphrt_several"} <= systems, \
        output
    for record in report.records:
        assert record.unit == "us"
        assert 0 < record.min <= record.median <= record.max < 1e4
        assert record.repeats == 60 == len(record.samples)  # replay's --quick rounds
        assert record.device == report.device and record.versions["cupy"]
        assert record.versions["gpus"] and record.versions["cpu"]
    # The three rows divide by the same CuPy samples (one interleaved rotation).
    cupy_cells = [r for r in report.records if r.system == "cupy_graph"]
    assert len(cupy_cells) == 3
    assert cupy_cells[0].samples == cupy_cells[1].samples == cupy_cells[2].samples
    verdicts = {t.metric: t for t in report.targets if t.workload == "replay"}
    assert set(verdicts) == {"graph launch", "launcher", "graph launch, several devices"}
    for verdict in verdicts.values():
        assert verdict.status in ("PASS", "MISS") and verdict.ratio > 0
        assert verdict.low <= verdict.ratio <= verdict.high
    assert "replay: " in proc.stdout and "cugraphrt / cupy_graph" in proc.stdout
    assert "cugraphrt_launcher / cupy_graph" in proc.stdout
    assert "cugraphrt_several / cupy_graph" in proc.stdout
