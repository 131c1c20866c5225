"""Start a script of this folder under torchrun and collect what its ranks report.

Each script prints ``OK <check> rank=<r>`` for every check that passed on a rank; a rank that
fails raises, so torchrun exits nonzero and prints the traceback.
"""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
WORLD = 2


def device_count(library: str = "torch") -> int:
    """CUDA devices ``library`` (torch or cupy) sees here; 0 without it or without CUDA."""
    return _devices(library)[0]


def _devices(library: str) -> tuple[int, str]:
    """CUDA devices ``library`` sees here, and why none when 0."""
    try:
        module = importlib.import_module(library)
    except ImportError as exc:
        return 0, f"{library} is not installed ({exc})"
    try:
        if library == "torch":
            if not module.cuda.is_available():
                return 0, "torch.cuda.is_available() is False"
            return module.cuda.device_count(), ""
        if not module.cuda.is_available():
            return 0, "cupy.cuda.is_available() is False"
        return module.cuda.runtime.getDeviceCount(), ""
    except Exception as exc:  # noqa: BLE001 - no driver, a broken install
        return 0, f"{type(exc).__name__}: {exc}"


def skip_unless_gpus(count: int = WORLD, library: str = "torch"):
    """A mark that skips a test with fewer than ``count`` GPUs (or without ``library``)."""
    have, why = _devices(library)
    reason = f"needs {count} CUDA GPU(s) seen by {library} (got {have}"
    return pytest.mark.skipif(have < count, reason=reason + (f": {why})" if why else ")"))


def torchrun(script: str, *args: str, nproc: int = WORLD, timeout: int = 600) -> str:
    """Run ``script`` on ``nproc`` ranks; returns its stdout (asserting a zero exit)."""
    env = dict(os.environ)
    paths = [str(ROOT), str(ROOT / "adapters"), env.get("PYTHONPATH", "")]
    env["PYTHONPATH"] = os.pathsep.join(p for p in paths if p)
    for name in ("TORCH_NCCL_BLOCKING_WAIT", "NCCL_BLOCKING_WAIT"):
        env.pop(name, None)  # a blocking wait cannot be captured (see docs/distributed.md)
    # A script of this folder by name, or any script by absolute path (HERE / abs is abs).
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone",
               f"--nproc-per-node={nproc}", str(HERE / script), *args]
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=timeout)
    assert done.returncode == 0, (f"{script} failed (exit {done.returncode}):\n"
                                  f"{done.stdout[-4000:]}\n{done.stderr[-8000:]}")
    return done.stdout


def passed(stdout: str, check: str, nproc: int = WORLD) -> bool:
    """Whether every rank reported ``check`` as passed."""
    return all(f"OK {check} rank={r}" in stdout for r in range(nproc))
