"""The PyTorch examples run and check themselves."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")

pytestmark = pytest.mark.gpu

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


# The compile examples spend about 30 s each in Inductor; the backend's GPU tests cover the
# same paths in-process by default.
_COMPILE = pytest.mark.long


@pytest.mark.parametrize("name", ["torch_inference.py", "migrate_by_name.py",
                                  "train_partial_capture.py",
                                  "train_whole_step.py", "serving_buckets.py",
                                  "stale_outputs.py",
                                  pytest.param("compile_backend.py", marks=_COMPILE),
                                  pytest.param("compile_buckets.py", marks=_COMPILE)])
def test_example_runs(name):
    result = subprocess.run([sys.executable, str(EXAMPLES / name)], capture_output=True,
                            text=True, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
