"""The PyTorch examples run and check themselves."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")

pytestmark = pytest.mark.gpu

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


# The compile examples spend about 30 s each in Inductor, and the training and serving ones
# 13-15 s each (an H100 host, 2026-11-25); the adapter's GPU tests cover the same paths
# in-process by default (test_autograd_gpu, test_buckets_gpu, test_compile_backend_gpu).
_LONG = pytest.mark.long


@pytest.mark.parametrize("name", ["torch_inference.py", "migrate_by_name.py",
                                  "stale_outputs.py", "generate_hf.py",
                                  "generate_sampling.py", "generate_speculative.py",
                                  pytest.param("train_partial_capture.py", marks=_LONG),
                                  pytest.param("train_whole_step.py", marks=_LONG),
                                  pytest.param("serving_buckets.py", marks=_LONG),
                                  pytest.param("compile_backend.py", marks=_LONG),
                                  pytest.param("compile_buckets.py", marks=_LONG)])
def test_example_runs(name):
    result = subprocess.run([sys.executable, str(EXAMPLES / name)], capture_output=True,
                            text=True, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
