"""`cugraphrt info` on a machine with a GPU."""

from __future__ import annotations

import subprocess
import sys

import cupy
import pytest

from cugraphrt.cli import InfoResult

pytestmark = pytest.mark.gpu


def test_info_reports_the_gpu():
    result = subprocess.run([sys.executable, "-m", "cugraphrt", "info", "--json"],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    info = InfoResult.model_validate_json(result.stdout)
    assert info.gpus and info.cuda_runtime_version and info.cuda_driver_version
    name = cupy.cuda.runtime.getDeviceProperties(0)["name"]
    name = name.decode() if isinstance(name, bytes) else name
    assert info.gpus[0].name == name
    assert 0 < info.gpus[0].free_bytes <= info.gpus[0].total_bytes
    text = subprocess.run([sys.executable, "-m", "cugraphrt", "info"], capture_output=True,
                          text=True, timeout=120)
    assert text.returncode == 0 and name in text.stdout
