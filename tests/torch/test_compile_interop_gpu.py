"""cugraphrt_torch graphs and torch.compile's CUDA graph trees in one process.

Each check runs in its own process: the failure it guards against is a device fault, which
poisons the CUDA context (docs/torch.md, "Coexisting with torch.compile").
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")

pytestmark = pytest.mark.gpu

HERE = Path(__file__).parent


def _run(script: str) -> None:
    result = subprocess.run([sys.executable, str(HERE / script)], capture_output=True,
                            text=True, timeout=300)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    assert result.stdout.strip().endswith("ok")


def test_graph_replays_after_torch_clears_its_blas_workspaces():
    _run("repro_blas_workspace.py")


@pytest.mark.long  # two Inductor compiles in reduce-overhead mode: about 30 s
def test_graph_module_and_reduce_overhead_of_two_models_coexist():
    _run("repro_compile_interop.py")
