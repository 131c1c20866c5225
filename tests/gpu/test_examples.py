"""The CuPy examples run and check themselves."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.gpu

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


@pytest.mark.parametrize("name", ["capture_cupy_kernels.py", "shared_pool.py", "cupy_mlp.py",
                                  "cupy_buckets.py", "capture_in_threads.py",
                                  "control_flow_cg.py", "hot_loop_launcher.py",
                                  "new_framework.py", "rebind_inputs.py",
                                  "row_sampling.py"])
def test_example_runs(name):
    result = subprocess.run([sys.executable, str(EXAMPLES / name)], capture_output=True,
                            text=True, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
