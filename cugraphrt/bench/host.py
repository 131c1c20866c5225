"""What a run ran on: the GPU, the software versions and the host (CPU model, GPU count and
names), for the footer of the table and every record of the report.

The host belongs in the versions line because a launch-bound ratio moves with it: the same
build read 1.09x on one H100 host and 1.50x on a two-GPU H200 host (issue 24).
"""

from __future__ import annotations

import platform
import sys
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

__all__ = ["device_name", "collect_versions", "cpu_model", "describe_gpus"]


def device_name() -> str:
    """The current GPU's name and compute capability."""
    import cupy

    runtime = cupy.cuda.runtime
    props = runtime.getDeviceProperties(runtime.getDevice())
    return f"{_name(props)} (sm_{props['major']}{props['minor']})"


def collect_versions() -> dict[str, str]:
    """Versions of what the run used (torch and the adapter only if a workload loaded them),
    then the host: ``cpu`` (model) and ``gpus`` (count and names of the visible devices)."""
    import cupy
    import numpy

    import cugraphrt

    versions = {"cugraphrt": cugraphrt.__version__, "cupy": cupy.__version__,
                "numpy": numpy.__version__, "python": platform.python_version()}
    runtime = cupy.cuda.runtime
    try:
        versions["cuda_runtime"] = _cuda_version(runtime.runtimeGetVersion())
        versions["cuda_driver"] = _cuda_version(runtime.driverGetVersion())
    except Exception:  # noqa: BLE001 - versions are informative only
        pass
    for name in ("torch", "triton", "transformers", "torchvision", "cugraphrt_torch"):
        module = sys.modules.get(name)
        if module is not None:
            versions[name] = str(getattr(module, "__version__", "unknown"))
    versions["cpu"] = cpu_model()
    try:
        names = [_name(runtime.getDeviceProperties(d)) for d in range(runtime.getDeviceCount())]
        versions["gpus"] = describe_gpus(names)
    except Exception:  # noqa: BLE001 - informative only; no device here
        pass
    return versions


def cpu_model(cpuinfo: str | Path = "/proc/cpuinfo") -> str:
    """The CPU's model name (Linux: ``/proc/cpuinfo``), else what ``platform`` knows."""
    try:
        text = Path(cpuinfo).read_text(errors="replace")
    except OSError:
        text = ""
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip().lower() == "model name" and value.strip():
            return " ".join(value.split())
    return platform.processor() or platform.machine() or "unknown"


def describe_gpus(names: Sequence[str]) -> str:
    """``2x NVIDIA H200`` for the visible devices' names, kinds in order of first appearance
    (``1x NVIDIA H100 80GB HBM3, 1x NVIDIA A100-SXM4-40GB``); ``none`` for none."""
    if not names:
        return "none"
    return ", ".join(f"{count}x {name}" for name, count in Counter(names).items())


def _name(props: dict) -> str:
    name = props["name"]
    return name.decode() if isinstance(name, bytes) else str(name)


def _cuda_version(v: int) -> str:
    return f"{v // 1000}.{(v % 1000) // 10}"
