"""Errors that are also the peer's: what cugraphrt raises is also what CuPy raises there.

Code written for CuPy's graphs catches ``cupy.cuda.runtime.CUDARuntimeError`` around a
capture (a synchronization or another call CUDA forbids while capturing, an invalidated
capture, a fork never joined back) and reads its ``status``; it catches
``NotImplementedError`` around the library calls CuPy refuses during one (cuSOLVER, cuSPARSE,
the legacy cuRAND API). So that such code keeps working after moving to cugraphrt, the
error a CUDA status becomes is a :class:`~cugraphrt.CaptureError` (or
:class:`~cugraphrt.CugraphrtError`) *and* a ``CUDARuntimeError`` carrying that status, and a
refused library call is a ``CaptureError`` *and* a ``NotImplementedError``: either
``except`` clause catches it, and the message still names the cause and the fix.

Only the error path makes these: :func:`cugraphrt._cuda.runtime.error_from_status`, the diagnoses of
:mod:`cugraphrt._capture.diagnose` and the library guards of
:mod:`cugraphrt._libraries.capture_setup`. The PyTorch
adapter adds its own peer (``torch.OutOfMemoryError``) in ``cugraphrt_torch.capture._errors``: the
core never imports torch.
"""

from __future__ import annotations

from cupy_backends.cuda.api import runtime

from cugraphrt.errors import CaptureError, CugraphrtError

__all__ = ["CudaCaptureError", "CudaStatusError", "LibraryCaptureError", "also_library_error"]


class CudaCaptureError(CaptureError, runtime.CUDARuntimeError):
    """A CUDA status caused by a capture: a :class:`CaptureError` and CuPy's
    ``CUDARuntimeError``, with ``status`` set as CuPy sets it.

    Parameters
    ----------
    message : str
        The explanation (it names the status, as ``cudaErrorStreamCaptureInvalidated (901)``,
        so that code matching CuPy's message on the status name still matches).
    status : int
        The ``cudaError_t`` value.
    """

    def __init__(self, message: str, status: int) -> None:
        # Not CUDARuntimeError.__init__: it would replace the explanation by CUDA's one line.
        RuntimeError.__init__(self, message)
        self.status = status

    def __reduce__(self):
        return (type(self), (str(self), self.status))


class CudaStatusError(CugraphrtError, runtime.CUDARuntimeError):
    """A CUDA status that is not about a capture: a :class:`CugraphrtError` and CuPy's
    ``CUDARuntimeError`` with ``status`` set. Parameters as :class:`CudaCaptureError`."""

    def __init__(self, message: str, status: int) -> None:
        RuntimeError.__init__(self, message)
        self.status = status

    def __reduce__(self):
        return (type(self), (str(self), self.status))


class LibraryCaptureError(CaptureError, NotImplementedError):
    """A CUDA library call that a capture cannot record (cuSOLVER, cuSPARSE, the legacy
    cuRAND API, a cuBLAS routine beyond the GEMM family): a :class:`CaptureError` and, like
    CuPy's refusal, a ``NotImplementedError``."""


# One CaptureError subclass per CuPy library error class, made on first use.
_ALSO_LIBRARY: dict[type, type | None] = {}


def also_library_error(exc: BaseException, message: str) -> CaptureError:
    """A :class:`CaptureError` that is also ``exc``'s own class, with its attributes.

    CuPy's CUDA library errors (``CuFFTError``, ``CUBLASError``, ``CUSOLVERError`` ...) are
    plain ``RuntimeError`` subclasses carrying the library's status (``result`` or
    ``status``); code written for CuPy catches them by class. The error returned is an
    instance of both, with ``message`` as its text and the status attributes copied.
    """
    return _rebuild_also(type(exc), message, dict(getattr(exc, "__dict__", {})))


def _class_also(peer: type) -> type | None:
    if peer not in _ALSO_LIBRARY:
        try:
            _ALSO_LIBRARY[peer] = type(f"{peer.__name__}CaptureError", (CaptureError, peer),
                                       {"__module__": __name__, "__reduce__": _reduce_also,
                                        "peer": peer})
        except TypeError:  # a layout that cannot be combined: the CaptureError alone
            _ALSO_LIBRARY[peer] = None
    return _ALSO_LIBRARY[peer]


def _rebuild_also(peer: type, message: str, state: dict) -> CaptureError:
    cls = _class_also(peer)
    if cls is None:
        return CaptureError(message)
    error: CaptureError = BaseException.__new__(cls)
    # Not the peer's __init__: it would replace the explanation by the status name.
    Exception.__init__(error, message)
    error.__dict__.update(state)
    return error


def _reduce_also(self):
    return (_rebuild_also, (self.peer, str(self), dict(self.__dict__)))
