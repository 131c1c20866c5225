"""The real-model workloads on a GPU: the CG solver against a float64 NumPy reference, and a
quick bench run of the fast real workloads (CG, ResNet-50 when torchvision is installed)."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from cugraphrt.bench.records import BenchReport

pytestmark = pytest.mark.gpu

ROOT = Path(__file__).resolve().parents[2]


def _laplacian64(p: np.ndarray) -> np.ndarray:
    padded = np.pad(p, 1)
    return (4 * p - padded[:-2, 1:-1] - padded[2:, 1:-1] - padded[1:-1, :-2]
            - padded[1:-1, 2:])


def _cg64(b: np.ndarray, iterations: int) -> np.ndarray:
    x = np.zeros_like(b)
    r = b.copy()
    p = r.copy()
    rr = float(np.sum(r * r))
    for _ in range(iterations):
        ap = _laplacian64(p)
        alpha = rr / float(np.sum(p * ap))
        x += alpha * p
        r -= alpha * ap
        rr_next = float(np.sum(r * r))
        p = r + (rr_next / rr) * p
        rr = rr_next
    return x


def test_laplacian_and_cg_match_float64_numpy(rng):
    import cupy

    from cugraphrt.bench.workloads_real_cg import laplacian, poisson_cg

    b = rng.standard_normal((48, 48))
    got = cupy.asnumpy(laplacian(cupy.asarray(b, dtype=cupy.float32)))
    np.testing.assert_allclose(got, _laplacian64(b), rtol=1e-5, atol=1e-5)
    x = cupy.asnumpy(poisson_cg(cupy.asarray(b, dtype=cupy.float32), iterations=12))
    expected = _cg64(b, 12)
    assert np.linalg.norm(x - expected) / np.linalg.norm(expected) < 1e-4


def _env() -> dict[str, str]:
    env = dict(os.environ)
    paths = [str(ROOT), str(ROOT / "adapters"), env.get("PYTHONPATH", "")]
    env["PYTHONPATH"] = os.pathsep.join(p for p in paths if p)
    return env


@pytest.mark.long  # a bench process building ResNet-50 and timing both models: about 25 s
def test_quick_real_cg_and_resnet50_write_a_valid_report(tmp_path):
    path = tmp_path / "bench.json"
    proc = subprocess.run(
        [sys.executable, "-m", "cugraphrt", "bench", "--quick", "--only", "real_cg", "--only",
         "real_resnet50", "--json", str(path), "--no-progress"],
        cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=300)
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output
    report = BenchReport.model_validate_json(path.read_text())
    assert not report.errors and {r.workload for r in report.rows} == {"real_cg",
                                                                      "real_resnet50"}
    cg = {r.system: r for r in report.records if r.workload == "real_cg"}
    assert {"cupy_eager", "cugraphrt", "gpu_floor"} <= set(cg), output
    per_call = report.record("real_cg", "per call 50 it. 512x512", "cugraphrt")
    eager = report.record("real_cg", "per call 50 it. 512x512", "cupy_eager")
    assert per_call is not None and eager is not None, output
    assert per_call.median < eager.median  # one launch instead of ~650
    resnet = [t for t in report.targets if t.workload == "real_resnet50"]
    assert len(resnet) == 2
    if importlib.util.find_spec("torchvision") is None:
        assert {t.status for t in resnet} == {"N/A"}
    else:
        assert all(t.status in ("PASS", "MISS") and t.ratio > 0 for t in resnet), output
