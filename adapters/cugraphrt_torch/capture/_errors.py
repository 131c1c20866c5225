"""Turning torch's capture failures into cugraphrt.CaptureError that name the operation.

Torch reports an operation capture forbids in one of two ways: its own check before any CUDA
call ("Cannot copy between CPU and CUDA tensors during CUDA graph capture ..."), or a CUDA
status surfaced as ``RuntimeError``/``torch.AcceleratorError`` whose text names the status
("operation not permitted when stream is capturing ... cudaErrorStreamCaptureUnsupported").
Neither names the Python operation, so the traceback is read for the innermost line of the
caller's code (outside torch and cugraphrt), which is the line that did it.

An out-of-memory error of the cugraphrt pool during a torch capture is also torch's
``torch.OutOfMemoryError`` (:class:`TorchPoolOutOfMemoryError`): code written for
``torch.cuda.graph`` catches that, or ``RuntimeError``, and the core never imports torch.
"""

from __future__ import annotations

import os
import re
import traceback

import torch

import cugraphrt
from cugraphrt.adapter import cuda as _cuda
from cugraphrt.adapter import diagnose as _diagnose
from cugraphrt.errors import CaptureError, PoolOutOfMemoryError

__all__ = ["capture_error", "is_host_copy", "torch_capture_status", "TorchPoolOutOfMemoryError",
           "torch_out_of_memory"]

# CUDA status names and texts as torch prints them, mapped to their numbers.
_STATUS_NAMES = {
    "cudaErrorStreamCaptureUnsupported": _cuda.CAPTURE_UNSUPPORTED,
    "cudaErrorStreamCaptureInvalidated": _cuda.CAPTURE_INVALIDATED,
    "cudaErrorStreamCaptureMerge": _cuda.CAPTURE_MERGE,
    "cudaErrorStreamCaptureUnmatched": _cuda.CAPTURE_UNMATCHED,
    "cudaErrorStreamCaptureUnjoined": _cuda.CAPTURE_UNJOINED,
    "cudaErrorStreamCaptureIsolation": _cuda.CAPTURE_ISOLATION,
    "cudaErrorStreamCaptureImplicit": _cuda.CAPTURE_IMPLICIT,
    "cudaErrorCapturedEvent": _cuda.CAPTURED_EVENT,
    "cudaErrorStreamCaptureWrongThread": _cuda.CAPTURE_WRONG_THREAD,
}
_STATUS_TEXTS = {
    "operation not permitted when stream is capturing": _cuda.CAPTURE_UNSUPPORTED,
    "operation failed due to a previous error during capture": _cuda.CAPTURE_INVALIDATED,
    "capture sequence contains a fork that was not joined": _cuda.CAPTURE_UNJOINED,
    "would make the legacy stream depend on a capturing": _cuda.CAPTURE_IMPLICIT,
    "dependency created on uncaptured work in another stream": _cuda.CAPTURE_ISOLATION,
}
_HOST_COPY_TEXT = "Cannot copy between CPU and CUDA tensors during CUDA graph capture"
_HOST_COPY_WHAT = ("copies between host and device memory, which capture allows only from "
                   "pinned memory")
_ADVICE = (
    "The capture was rolled back. Keep host reads (.item(), .cpu(), .tolist(), printing), "
    "data-dependent shapes (nonzero, boolean masks, unique) and host-to-device copies from "
    "pageable memory outside the captured region: read results after replay, and warm up "
    "(run the code once eagerly) before capturing."
)
# What an operation on the caller's line does, by the method or function it calls.
_OPERATIONS = (
    (re.compile(r"\.(item|tolist|cpu|numpy)\s*\(|\b(asnumpy|float|int|bool|complex)\s*\("),
     "copies a CUDA tensor to the host and waits for it"),
    (re.compile(r"\bprint\s*\(|\brepr\s*\(|\bstr\s*\(|\.format\s*\(|\bf['\"]"),
     "prints a CUDA tensor, which copies it to the host"),
    (re.compile(r"\.?(nonzero|masked_select|unique|unique_consecutive|argwhere|"
                r"repeat_interleave)\s*\("),
     "has an output shape that depends on the data, so torch reads a count back to the host"),
    (re.compile(r"\.(to|cuda)\s*\(|torch\.(tensor|as_tensor)\s*\("), _HOST_COPY_WHAT),
    (re.compile(r"\.synchronize\s*\(|\.query\s*\("),
     "waits for the device, which capture forbids"),
    (re.compile(r"\b(all_reduce|all_gather\w*|reduce_scatter\w*|broadcast|barrier|"
                r"all_to_all\w*)\s*\(|\.wait\s*\("),
     "runs or waits for a collective; under capture a collective's wait must not block the "
     "host (unset TORCH_NCCL_BLOCKING_WAIT, pass no timeout to wait(), no barrier()), and "
     "each collective must run once eagerly first (cugraphrt_torch.distributed."
     "check_capture() checks the settings; see docs/distributed.md)"),
)
# Frames in these packages are the machinery, not the caller's operation (cugraphrt's
# diagnosis skips CuPy's and its own already).
_PACKAGE_DIRS = tuple(
    os.path.dirname(os.path.abspath(path)) + os.sep
    for path in (torch.__file__, cugraphrt.__file__, __file__)
)


class TorchPoolOutOfMemoryError(PoolOutOfMemoryError, torch.OutOfMemoryError):
    """The cugraphrt pool ran out of memory during a torch capture: a
    :class:`~cugraphrt.PoolOutOfMemoryError` (a ``MemoryError``, with the sizes) that is
    also ``torch.OutOfMemoryError`` (a ``RuntimeError``), as torch raises there."""


def torch_out_of_memory(error: BaseException) -> BaseException:
    """A pool's out-of-memory ``error`` as a :class:`TorchPoolOutOfMemoryError` (same sizes
    and message); any other error unchanged."""
    if not isinstance(error, PoolOutOfMemoryError) or isinstance(error, torch.OutOfMemoryError):
        return error
    return TorchPoolOutOfMemoryError(error.requested_bytes, error.reserved_bytes,
                                     error.device_free_bytes, error.device_total_bytes)


def torch_capture_status(exc: BaseException) -> int | None:
    """The CUDA capture status a torch (or CuPy) exception reports, or None."""
    for attribute in ("error_code", "status"):  # torch.AcceleratorError, CuPy's errors
        code = getattr(exc, attribute, None)
        if isinstance(code, int) and code in _STATUS_NAMES.values():
            return code
    text = str(exc)
    for name, status in _STATUS_NAMES.items():
        if name in text:
            return status
    for fragment, status in _STATUS_TEXTS.items():
        if fragment in text:
            return status
    return None


def capture_error(exc: BaseException, where: str | None = None,
                  capture=None) -> CaptureError | None:
    """A CaptureError for ``exc`` if capture caused it, naming the operation; else None.

    Parameters
    ----------
    exc : BaseException
        What the captured block (or torch's capture_end) raised.
    where : str, optional
        The call that failed when no line of the caller's code is involved, such as
        ``"torch.cuda.CUDAGraph.capture_end()"``.
    capture : cugraphrt.adapter.Capture, optional
        The capture underway, for its mode and stream when the cause must be inferred.
    """
    if isinstance(exc, CaptureError):
        return exc
    if not isinstance(exc, RuntimeError):
        return _diagnose.capture_error_from(exc, capture)
    text = str(exc)
    first_line = text.strip().splitlines()[0] if text.strip() else type(exc).__name__
    status = torch_capture_status(exc)
    if status is None and _HOST_COPY_TEXT not in text:
        if "expandable_segments" in text and "MemPool" in text:
            return CaptureError(
                f"torch's expandable segments cannot serve a cugraphrt pool (got: "
                f"{first_line}); set PYTORCH_CUDA_ALLOC_CONF=expandable_segments:False "
                f"for programs that capture torch work"
            )
        if "generator not in capture mode" in text:
            return CaptureError(
                f"torch's CUDA RNG ran in a capture torch does not know about (got: "
                f"{first_line}); capture torch work with cugraphrt_torch.graph(), not "
                f"cugraphrt.graph()"
            )
        return _diagnose.capture_error_from(exc, capture)
    operation = _operation(exc, where)
    if status == _cuda.CAPTURE_INVALIDATED:
        return _diagnose.invalidated_error(capture, operation, first_line)
    if status is not None and status != _cuda.CAPTURE_UNSUPPORTED:
        cause = str(_cuda.error_from_status(status, "torch"))
        cause = cause.split(": ", 1)[1] if ": " in cause else cause
        return CaptureError(f"{operation} failed during CUDA graph capture (got: {first_line}): "
                            f"{cause}. {_ADVICE}")
    advice = _ADVICE
    if _HOST_COPY_TEXT in text:
        advice += (" A constant the captured code makes on the host (torch.tensor(v, "
                   "device=...), an index list, a host tensor it builds and moves) can be "
                   "staged by the capture instead: cugraphrt_torch.graph(..., "
                   "stage_host_constants=True); graph_module does it by itself.")
    return CaptureError(f"{operation} cannot be captured (got: {first_line}). {advice}")


def is_host_copy(exc: BaseException) -> bool:
    """Whether ``exc`` (or what it was raised from) is torch refusing a host-to-device copy
    from pageable memory during a capture: what staging host constants may fix."""
    seen: BaseException | None = exc
    while seen is not None:
        # torch's own refusal, or a CUDA status on a line that copies host memory.
        if _HOST_COPY_TEXT in str(seen) or _HOST_COPY_WHAT in str(seen):
            return True
        seen = seen.__cause__
    return False


def _operation(exc: BaseException, where: str | None) -> str:
    """``"`y.item()` (file.py:12), which copies a CUDA tensor to the host ..."``."""
    frames = traceback.extract_tb(exc.__traceback__) if exc.__traceback__ else []
    printing = any(frame.filename.endswith(("_tensor_str.py", "_tensor.py"))
                   and frame.name in ("__repr__", "__str__", "__format__", "_str", "_str_intern")
                   for frame in frames)
    place = _diagnose.where_in_user_code(exc, _PACKAGE_DIRS)
    if place is None:
        if printing:
            return "printing a CUDA tensor, which copies it to the host,"
        return where or "a torch operation"
    if printing:
        return f"{place}, which prints a CUDA tensor and so copies it to the host,"
    line = place.split("` (")[0].lstrip("`")
    for pattern, what in _OPERATIONS:
        if pattern.search(line):
            return f"{place}, which {what},"
    return place
