"""The ``cugraphrt`` command: ``cugraphrt info`` and ``cugraphrt bench``."""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

from pydantic import BaseModel

from cugraphrt._exit_codes import NO_GPU_EXIT_CODE

__all__ = ["main", "InfoResult", "collect_info", "gpu_advice", "NO_GPU_EXIT_CODE"]


class GpuInfo(BaseModel):
    """One visible GPU."""

    index: int
    name: str
    compute_capability: str
    total_bytes: int
    free_bytes: int
    graph_pools: int = 0
    graph_pool_reserved_bytes: int = 0


class InfoResult(BaseModel):
    """What ``cugraphrt info`` reports."""

    cugraphrt_version: str
    cupy_version: str | None
    cuda_runtime_version: int | None = None
    cuda_driver_version: int | None = None
    gpus: list[GpuInfo] = []
    gpu_error: str | None = None
    gpu_advice: str | None = None
    nccl_version: str | None = None
    torch_version: str | None = None
    torch_error: str | None = None
    torch_adapter: str | None = None


def collect_info() -> InfoResult:
    """Versions of cugraphrt, CuPy, CUDA, the GPUs, and whether torch and the adapter import."""
    from cugraphrt import __version__

    try:
        import cupy
    except ImportError as exc:
        return InfoResult(cugraphrt_version=__version__, cupy_version=None,
                          gpu_error=f"CuPy is not installed ({exc})")
    result = InfoResult(cugraphrt_version=__version__, cupy_version=cupy.__version__)
    from cugraphrt._cuda import runtime as _cuda

    try:
        # The versions first: without a GPU they say why (a driver of 0 is no driver).
        result.cuda_runtime_version = _cuda.runtime_version()
        result.cuda_driver_version = _cuda.raw_driver_version()
        if _cuda.raw_device_count() == 0:  # raises with the reason where CUDA has one
            raise RuntimeError("CUDA reports no device")
        from cugraphrt._memory.pool_summary import device_stats

        pools = {s.device_id: s for s in device_stats()}  # this process's pools, per device
        for index in range(_cuda.raw_device_count()):
            with cupy.cuda.Device(index) as device:
                free, total = _cuda.mem_info()
                mine = pools.get(index)
                result.gpus.append(GpuInfo(
                    index=index,
                    name=_cuda.device_name(index),
                    compute_capability=device.compute_capability,
                    total_bytes=total, free_bytes=free,
                    graph_pools=mine.pools if mine else 0,
                    graph_pool_reserved_bytes=mine.reserved_bytes if mine else 0))
    except Exception as exc:  # noqa: BLE001 - any failure here means "no usable GPU"
        result.gpu_error = f"{type(exc).__name__}: {exc}"
        result.gpu_advice = gpu_advice(getattr(exc, "status", None),
                                       result.cuda_driver_version, result.cuda_runtime_version)
    result.nccl_version = _nccl_version()
    try:
        torch = importlib.import_module("torch")
        result.torch_version = torch.__version__
    except Exception as exc:  # noqa: BLE001
        result.torch_error = f"{type(exc).__name__}: {exc}"
    else:
        try:
            importlib.import_module("cugraphrt_torch")
            result.torch_adapter = "imports"
        except Exception as exc:  # noqa: BLE001
            result.torch_adapter = f"does not import ({type(exc).__name__}: {exc})"
    return result


_INSUFFICIENT_DRIVER = 35  # cudaErrorInsufficientDriver
_NO_DEVICE = 100  # cudaErrorNoDevice


def gpu_advice(status: int | None, driver: int | None, runtime: int | None) -> str:
    """What to do when no GPU is usable, from the CUDA status and versions seen.

    Parameters
    ----------
    status : int or None
        The ``cudaError_t`` of the failed device query, None when there was none.
    driver, runtime : int or None
        ``cudaDriverGetVersion`` (0 without a driver) and CuPy's CUDA runtime version.

    Returns
    -------
    str
        One sentence for ``cugraphrt info``.
    """
    if status == _INSUFFICIENT_DRIVER and not driver:
        return ("no NVIDIA driver is loaded: cugraphrt captures and replays on an NVIDIA GPU; "
                "on this machine only the GPU-free tests run (pytest skips the others)")
    if status == _INSUFFICIENT_DRIVER:
        return (f"the driver supports CUDA up to {_cuda_version(driver)}, older than the CUDA "
                f"{_cuda_version(runtime)} runtime of this CuPy: update the NVIDIA driver, or "
                f"install the CuPy for the driver's CUDA version (the cuda12 extra for CUDA 12)")
    if status == _NO_DEVICE:
        return ("the driver sees no GPU: check CUDA_VISIBLE_DEVICES and nvidia-smi "
                "(a GPU hidden from this process, or none in the machine)")
    return "check nvidia-smi, the NVIDIA driver and CUDA_VISIBLE_DEVICES"


def _nccl_version() -> str | None:
    """NCCL's version as CuPy loads it (``cugraphrt.distributed`` uses it), or None."""
    import warnings

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # CuPy warns when libnccl is missing: None says it
            from cupy.cuda import nccl
        if not nccl.available:
            return None
        v = int(nccl.get_version())
    except Exception:  # noqa: BLE001 - NCCL is optional
        return None
    return f"{v // 10000}.{v // 100 % 100}.{v % 100}" if v >= 10000 else str(v)


def _render_info(info: InfoResult) -> str:
    lines = [f"cugraphrt     {info.cugraphrt_version}",
             f"CuPy          {info.cupy_version or 'not installed'}"]
    if info.cuda_runtime_version is not None:
        lines.append(f"CUDA runtime  {_cuda_version(info.cuda_runtime_version)}")
        driver = info.cuda_driver_version
        lines.append(f"CUDA driver   {_cuda_version(driver) if driver else 'none loaded'}")
    for gpu in info.gpus:
        pools = (f", {gpu.graph_pools} graph pool(s) reserving "
                 f"{gpu.graph_pool_reserved_bytes / 2**20:.1f} MiB" if gpu.graph_pools else "")
        lines.append(
            f"GPU {gpu.index}         {gpu.name} (compute capability {gpu.compute_capability}, "
            f"{gpu.total_bytes / 2**30:.1f} GiB, {gpu.free_bytes / 2**30:.1f} GiB free{pools})")
    if info.nccl_version is not None:
        lines.append(f"NCCL          {info.nccl_version}")
    if info.torch_version is not None:
        lines.append(f"torch         {info.torch_version}")
        lines.append(f"torch adapter {info.torch_adapter}")
    elif "No module named 'torch'" in (info.torch_error or ""):
        lines.append("torch         not installed (optional: the PyTorch adapter, "
                     "cugraphrt_torch, needs it)")
    else:
        lines.append(f"torch         not importable ({info.torch_error})")
    if not info.gpus:
        lines.append(f"no CUDA GPU is available: {info.gpu_error or 'no device found'}")
        if info.gpu_advice:
            lines.append(f"  what to do: {info.gpu_advice}")
    return "\n".join(lines)


def _cuda_version(v: int | None) -> str:
    return "unknown" if v is None else f"{v // 1000}.{(v % 1000) // 10}"


def _info(args: argparse.Namespace) -> int:
    info = collect_info()
    print(info.model_dump_json(indent=2) if args.json else _render_info(info))
    return 0 if info.gpus else NO_GPU_EXIT_CODE


def _bench(args: argparse.Namespace, rest: list[str]) -> int:
    # Imported here: `cugraphrt info` never loads the workloads. The bench does not import
    # this module (see _exit_codes), so the dependency runs one way.
    from .bench import main as bench_main

    return bench_main(rest)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``cugraphrt`` console script."""
    parser = argparse.ArgumentParser(prog="cugraphrt",
                                     description="CUDA-graph runtime for CuPy and PyTorch")
    sub = parser.add_subparsers(dest="command", required=True)
    info = sub.add_parser("info", help="versions, GPUs and adapters")
    info.add_argument("--json", action="store_true", help="print the report as JSON")
    sub.add_parser("bench", help="benchmarks against CuPy, PyTorch and torch.compile",
                   add_help=False)
    args, rest = parser.parse_known_args(argv)
    if args.command == "bench":
        return _bench(args, rest)
    if rest:
        parser.error(f"unrecognized arguments: {' '.join(rest)}")
    return _info(args)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
