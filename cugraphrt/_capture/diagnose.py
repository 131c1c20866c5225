"""Why a capture failed: exceptions raised during a capture, turned into CaptureError.

The CUDA status alone rarely names the cause. ``cudaErrorStreamCaptureInvalidated`` in the
capturing thread may come from that thread's earlier illegal call, from another thread's
device-wide synchronization, from another thread's unsafe call under a global-mode capture,
or from legacy-stream use next to a blocking capture stream; CuPy's libraries report their
own statuses (``CUSOLVER_STATUS_INTERNAL_ERROR``) with no mention of the capture at all. This
module reads the exception, its traceback and what is known about the capture (its mode, its
stream, the kernels compiled during it, the other threads alive) and writes one
:class:`CaptureError` that names the likely cause and the fix. The per-status texts live in
:mod:`cugraphrt._cuda.runtime` (:func:`~cugraphrt._cuda.runtime.error_from_status`), the one place
that maps CUDA statuses; this module only chooses among them and adds the context.
"""

from __future__ import annotations

import os
import threading
import traceback

import cupy
import cupy_backends

from cugraphrt._cuda import runtime as _cuda
from cugraphrt._cuda.status_errors import CudaCaptureError, LibraryCaptureError, also_library_error
from cugraphrt._memory.backing import capture_activity
from cugraphrt.errors import CaptureError

__all__ = ["capture_error_from", "invalidated_error", "user_frame", "where_called_from",
           "where_in_user_code"]

# Errors that CuPy raises itself, before calling CUDA, when a capture is underway.
_CUPY_CAPTURE_MESSAGES = ("stream is capturing", "during stream capture", "capture sequence")
_CUDA_ERRORS = (_cuda.CUDARuntimeError, _cuda.CUDADriverError)
# CuPy's exception classes for the CUDA libraries, by class name (their modules load lazily).
_LIBRARY_ERRORS = {"CUBLASError": "cuBLAS", "CUSOLVERError": "cuSOLVER",
                   "CUSPARSEError": "cuSPARSE", "CURANDError": "cuRAND", "CuFFTError": "cuFFT"}
_LIBRARY_ADVICE = {
    "cuBLAS": "cugraphrt captures the GEMM family (matmul, dot, tensordot, einsum) itself; "
    "other cuBLAS routines must run outside the captured region.",
    "cuRAND": "Use cugraphrt.random (rand, randn, uniform, normal, randint, bernoulli), which "
    "draws fresh numbers on every replay.",
    "cuSOLVER": "Run the solver outside the captured region and capture only the work around it.",
    "cuSPARSE": "Run the sparse operation outside the captured region.",
    "cuFFT": "A plan created during a capture belongs to its graph; create multi-GPU plans "
    "and plans with callbacks before capturing (run the transform once eagerly).",
}
_WARM_UP = ("warm up this op first: run it once before capturing, so its kernel is compiled "
            "and loaded outside the capture")
_CUPY_DIR = os.path.dirname(os.path.abspath(cupy.__file__)) + os.sep
# Frames of these packages are the machinery; the caller's line is the innermost other one.
_PACKAGE_DIRS = tuple(
    os.path.dirname(os.path.abspath(path)) + os.sep
    # cugraphrt's own folder is this file's package's parent (every room of the core).
    for path in (cupy.__file__, cupy_backends.__file__, os.path.dirname(__file__))
)


def capture_error_from(exc: BaseException, capture=None) -> CaptureError | None:
    """The CaptureError for ``exc`` if it was caused by the capture; else None.

    Parameters
    ----------
    exc : BaseException
        What the captured block (or the end of the capture) raised.
    capture : cugraphrt._capture.stream_capture.Capture, optional
        The capture it was raised in, for its mode, stream and notes.

    Returns
    -------
    CaptureError or None
        ``exc`` itself when it already is a CaptureError that needs no more context; a new
        CaptureError for CUDA capture statuses (any exception with a ``status`` of 900-908),
        for every other status CuPy's CUDA runtime or driver wrappers raise, for CuPy's CUDA
        library errors and for CuPy's own refusals; None for anything else.
    """
    status = getattr(exc, "status", None)
    if isinstance(exc, CaptureError):
        if status == _cuda.CAPTURE_INVALIDATED and capture is not None:
            return invalidated_error(capture, "ending the capture", str(exc))
        return exc
    library = _library_of(exc)
    if library is not None:
        return also_library_error(exc, (
            f"{where_in_user_code(exc) or 'a ' + library + ' call'} failed during capture "
            f"with a {library} error (got {type(exc).__name__}: {exc}); {library} cannot be "
            f"recorded by CUDA graphs. {_LIBRARY_ADVICE[library]}"))
    if isinstance(status, int) and (status in _cuda.CAPTURE_STATUSES
                                    or isinstance(exc, _CUDA_ERRORS)):
        return status_error(status, exc, capture)
    if isinstance(exc, (RuntimeError, NotImplementedError)):
        return _cupy_refusal(exc)
    return None


def status_error(status: int, exc: BaseException, capture=None,
                 where: str | None = None) -> CaptureError:
    """A CaptureError for a CUDA ``status`` raised by ``exc`` during a capture."""
    where = where or where_in_user_code(exc) or _call_name(exc)
    got = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    if status == _cuda.CAPTURE_INVALIDATED:
        return invalidated_error(capture, where, got)
    if status == _cuda.CAPTURE_UNSUPPORTED and is_module_load(exc):
        return CudaCaptureError(f"{where} loads a kernel module during capture, which CUDA "
                                f"refused (got {got}); {_WARM_UP}", status)
    error = _cuda.error_from_status(status, where)
    if isinstance(error, CaptureError):
        return error
    return CudaCaptureError(
        f"{where} failed during capture (got {_cuda.status_name(status)}: {got}); a call that "
        f"works eagerly but fails while capturing cannot be recorded: run it before the "
        f"captured region (warm-up) or after it", status)


def invalidated_error(capture, where: str, got: str) -> CaptureError:
    """A CaptureError for an invalidated capture, naming every cause that fits.

    The capturing thread sees ``cudaErrorStreamCaptureInvalidated`` at its next call after
    the capture broke, so the cause is found from the circumstances, most likely first.
    """
    others = threading.active_count() - 1
    mode = getattr(capture, "mode", None)
    threads = []  # causes in other threads (which may have ended since)
    if mode == "global":
        threads.append(
            "this capture runs in 'global' mode, in which CUDA forbids unsafe calls "
            "(cudaMalloc, cudaFree, stream and event queries or synchronizations, graph "
            "instantiation) in every thread, and another thread made one: capture with "
            "capture_error_mode='thread_local' so that other threads may keep allocating and "
            "computing eagerly")
    threads.append(
        "another thread synchronized the whole device (cudaDeviceSynchronize, "
        "torch.cuda.synchronize(), cupy.cuda.Device().synchronize(), or a library's first "
        "handle creation such as a thread's first torch matmul), which invalidates every "
        "capture underway in any mode: keep those out of other threads while capturing, or "
        "warm them up before")
    if _is_blocking(capture):
        threads.append(
            "the capture stream is a blocking stream, so any use of the legacy default "
            "stream by another thread invalidates it: capture on "
            "cupy.cuda.Stream(non_blocking=True) (cugraphrt.graph()'s default)")
    own = []
    compiled = list(getattr(capture, "notes", None) or ())
    if compiled:
        own.append(f"kernels were compiled and loaded during this capture "
                   f"({', '.join(compiled[:3])}); {_WARM_UP}")
    own.append("an earlier operation of this capture failed and its error was caught and "
               "ignored: " + _cuda.SYNC_HINT)
    # With other threads running, they are the likelier culprits; alone, this thread is.
    causes = threads + own if others > 0 else own + threads
    concurrent = max(capture_activity.active - 1, 0)
    context = f"{others} other thread(s) running, {concurrent} other capture(s) underway"
    if mode is not None:
        context = f"mode '{mode}', " + context
    return CudaCaptureError(
        f"the capture was invalidated before {where} (got {got}; {context}). Likely causes: "
        + "; or ".join(causes), _cuda.CAPTURE_INVALIDATED)


def user_frame(exc: BaseException, skip_dirs: tuple[str, ...] = ()):
    """The innermost traceback frame of ``exc`` in the caller's code, or None."""
    frames = traceback.extract_tb(exc.__traceback__) if exc.__traceback__ else []
    return _innermost_user_frame(frames, _PACKAGE_DIRS + tuple(skip_dirs))


def where_in_user_code(exc: BaseException, skip_dirs: tuple[str, ...] = ()) -> str | None:
    """``"`line` (file.py:12)"`` for the caller's line that raised ``exc``, or None."""
    return _describe(user_frame(exc, skip_dirs))


def where_called_from() -> str | None:
    """``"`line` (file.py:12)"`` for the innermost line on the current stack that is the
    caller's (not cugraphrt's or CuPy's), or None."""
    return _describe(_innermost_user_frame(traceback.extract_stack()[:-1], _PACKAGE_DIRS))


def _innermost_user_frame(frames, skip: tuple[str, ...]):
    # Frames of compiled extensions (CuPy's Cython, with relative ``.pyx`` names and no
    # source) and frames of the skipped packages are the machinery, not the caller's line.
    for frame in reversed(frames):
        if frame.filename.endswith((".pyx", ".pxd", ".pxi")) or not (frame.line or "").strip():
            continue
        if not os.path.abspath(frame.filename).startswith(skip):
            return frame
    return None


def _describe(frame) -> str | None:
    if frame is None:
        return None
    return f"`{frame.line.strip()}` ({os.path.basename(frame.filename)}:{frame.lineno})"


def is_module_load(exc: BaseException) -> bool:
    """Whether ``exc`` was raised while CuPy compiled or loaded a kernel module."""
    frames = traceback.extract_tb(exc.__traceback__) if exc.__traceback__ else []
    return any((_CUPY_DIR in os.path.abspath(frame.filename)
                or frame.filename.startswith(("cupy/", "cupy_backends/")))
               and ("compile" in frame.name.lower() or "moduleload" in frame.name.lower()
                    or frame.name.endswith(("load", "load_data", "get_function")))
               for frame in frames)


def _is_blocking(capture) -> bool:
    stream = getattr(capture, "stream", None)
    try:
        return stream is not None and not stream.is_non_blocking
    except Exception:  # noqa: BLE001 - a foreign stream object, or no device: assume not
        return False


def _library_of(exc: BaseException) -> str | None:
    for cls in type(exc).__mro__:
        library = _LIBRARY_ERRORS.get(cls.__name__)
        if library is not None:
            return library
    return None


def _cupy_refusal(exc: BaseException) -> CaptureError | None:
    text = str(exc)
    if not any(m in text for m in _CUPY_CAPTURE_MESSAGES):
        return None
    # CuPy refuses libraries with NotImplementedError, host syncs with RuntimeError: the
    # CaptureError is an instance of the same built-in (see cugraphrt._cuda.status_errors).
    refusal = LibraryCaptureError if isinstance(exc, NotImplementedError) else CaptureError
    for library, advice in _LIBRARY_ADVICE.items():
        if library.lower() in text.lower():
            return refusal(f"CuPy cannot call {library} during capture (got: {text}). {advice}")
    where = where_in_user_code(exc) or "an operation"
    return refusal(f"{where} ran an operation that capture forbids (got: {text}): "
                   f"{_cuda.SYNC_HINT}")


def _call_name(exc: BaseException) -> str:
    text = str(exc).split(":")[0].strip()
    return text or type(exc).__name__
