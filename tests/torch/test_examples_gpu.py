"""The PyTorch examples run and check themselves."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")

pytestmark = pytest.mark.gpu

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


@pytest.mark.parametrize("name", ["torch_inference.py", "train_partial_capture.py",
                                  "train_whole_step.py", "serving_buckets.py",
                                  "compile_backend.py", "compile_buckets.py"])
def test_example_runs(name):
    result = subprocess.run([sys.executable, str(EXAMPLES / name)], capture_output=True,
                            text=True, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
