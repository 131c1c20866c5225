"""Start a script of this folder under torchrun, under a deadline, and collect what its
ranks report.

Each script prints ``OK <check> rank=<r>`` for every check that passed on a rank; a rank that
fails raises, so torchrun exits nonzero. Every launch runs under
:func:`cugraphrt.bench.torchrun.torchrun`: a rank that reaches the deadline writes its Python
stacks and exits, and the test fails with every rank's stacks in its message. The parts of
one script run in one launch (one process group), shared by the tests that ask for them.
"""

from __future__ import annotations

import importlib
import os
from pathlib import Path

import pytest

from cugraphrt.bench import torchrun as launcher

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
#: Seconds a launch may take before its ranks dump their stacks and the test fails.
DEADLINE_S = float(os.environ.get("CUGRAPHRT_TEST_DEADLINE", "240"))


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


def _world() -> int:
    """Ranks of the multi-GPU runs: one per GPU present (2, 4 or 8, or CUGRAPHRT_WORLD), the
    same rule as ``cugraphrt bench --distributed``; 2 where fewer GPUs are (they skip)."""
    from cugraphrt.bench.workloads_distributed import world_size

    return world_size(device_count()) or 2


#: Ranks of the multi-GPU tests.
WORLD = _world()


def skip_unless_gpus(count: int = WORLD, library: str = "torch"):
    """A mark that skips a test with fewer than ``count`` GPUs (or without ``library``)."""
    have, why = _devices(library)
    reason = f"needs {count} CUDA GPU(s) seen by {library} (got {have}"
    return pytest.mark.skipif(have < count, reason=reason + (f": {why})" if why else ")"))


def launch(script: str, *args: str, nproc: int = WORLD, deadline_s: float = DEADLINE_S,
           env: dict[str, str] | None = None, module: bool = False) -> launcher.Launch:
    """Run ``script`` (of this folder, or an absolute path; a module's name with
    ``module=True``) on ``nproc`` ranks."""
    base = launcher.environment(paths=[str(ROOT), str(ROOT / "adapters")])
    base.update(env or {})
    target = script if module else str(HERE / script)
    return launcher.torchrun(target, args, nproc=nproc, deadline_s=deadline_s, env=base,
                             cwd=str(ROOT), module=module)


def torchrun(script: str, *args: str, nproc: int = WORLD, **kwargs) -> str:
    """Run ``script`` and return its stdout; fail the test (with the stacks of a hang)
    unless every rank exited with status 0 in time."""
    done = launch(script, *args, nproc=nproc, **kwargs)
    if not done.ok:
        pytest.fail(f"{script} {' '.join(args)} on {nproc} rank(s) failed:\n{done.report()}",
                    pytrace=False)
    return done.stdout


_runs: dict[tuple, tuple[bool, str]] = {}


def run_parts(script: str, parts: tuple[str, ...], nproc: int) -> str:
    """Every part of ``script`` in one launch, once per session; its stdout."""
    key = (script, parts, nproc)
    if key not in _runs:
        done = launch(script, *parts, nproc=nproc)
        _runs[key] = (done.ok, done.stdout if done.ok else
                      f"{script} {' '.join(parts)} on {nproc} rank(s) failed:\n"
                      f"{done.report()}")
    ok, text = _runs[key]
    if not ok:
        pytest.fail(text, pytrace=False)
    return text


def passed(stdout: str, check: str, nproc: int = WORLD) -> bool:
    """Whether every rank reported ``check`` as passed."""
    return all(f"OK {check} rank={r}" in stdout for r in range(nproc))
