"""CUDA libraries inside captures: what cugraphrt enables and what it refuses clearly.

Run by every capture before it begins (``prepare_capture``):

* cuBLAS: the GEMM family is made capturable (see :mod:`cugraphrt._cuda.cublas`); every other
  cuBLAS routine raises :class:`CaptureError` naming it.
* cuRAND (``cupy.random``'s legacy API): raises :class:`CaptureError` naming the
  :mod:`cugraphrt.random` replacement. Its numbers would repeat on every replay anyway.
* cuSOLVER, cuSPARSE: raise :class:`CaptureError` naming the call. ``cupy.linalg``'s
  solvers (``svd``, ``eig``, ``qr``, ``lstsq``, ``inv``, ...) are refused by their public
  name: several reach cuSOLVER from compiled code that no module attribute can intercept,
  and would otherwise fail inside cuSOLVER with a bare ``CUSOLVER_STATUS_INTERNAL_ERROR``.
* cuFFT: cached plans capture fine; a plan created inside a capture belongs to the graph
  (see :mod:`cugraphrt._libraries.fft_plans`): its work area comes from the graph's pool, it is kept
  out of CuPy's plan cache so eager FFTs never use it, and it is destroyed with the graph.

Every refusal is a :class:`~cugraphrt._cuda.status_errors.LibraryCaptureError`: a ``CaptureError``
and, like CuPy's own refusal of these libraries, a ``NotImplementedError``.

The replacements are installed once, on CuPy's modules, and do nothing outside captures but
call the original.
"""

from __future__ import annotations

import functools
import importlib
import re
import sys
import threading
from typing import Any, cast

from cugraphrt._capture import host_constants as _host_constants
from cugraphrt._capture import stream_capture as _capture
from cugraphrt._cuda import runtime as _cuda
from cugraphrt._cuda.status_errors import LibraryCaptureError
from cugraphrt._libraries import cublas as _cublas
from cugraphrt._libraries import fft_plans as _fft_plans

__all__ = ["prepare_capture"]

_CUBLAS = "cupy_backends.cuda.libs.cublas"
_GUARDED_MODULES = {
    _CUBLAS: ("cuBLAS", "cugraphrt captures the GEMM family (matmul, dot, tensordot, einsum, "
                        "batched matmul); run this routine outside the captured region"),
    "cupy_backends.cuda.libs.curand": (
        "cuRAND", "use cugraphrt.random (rand, randn, uniform, normal, randint, bernoulli), "
                  "which draws fresh numbers on every replay"),
    "cupy_backends.cuda.libs.cusolver": (
        "cuSOLVER", "CUDA graphs cannot record cuSOLVER through CuPy; run the solver outside "
                    "the captured region and capture the work around it"),
    "cupy_backends.cuda.libs.cusparse": (
        "cuSPARSE", "CUDA graphs cannot record cuSPARSE through CuPy; run the sparse "
                    "operation outside the captured region"),
}
# cupy.linalg functions that run a cuSOLVER (or cuBLAS LU) factorization, with the library.
_LINALG = {name: "cuSOLVER" for name in (
    "cholesky", "cond", "eig", "eigh", "eigvals", "eigvalsh", "inv", "lstsq", "matrix_rank",
    "pinv", "qr", "solve", "svd", "tensorinv", "tensorsolve")}
_LINALG.update(det="cuBLAS", slogdet="cuBLAS")  # LU factorization by cuBLAS's getrfBatched
_LINALG_ADVICE = ("CUDA graphs cannot record it through CuPy (its workspace queries and info "
                  "checks run on the host); run it outside the captured region and capture "
                  "the work around it")
# Steps of _install_pending besides the library modules.
_STEPS = ("random", "cufft", "linalg", "compile", "host_arrays")
# Functions that only read or set host-side handle state: harmless during capture.
_UNGUARDED = {"create", "destroy", "getVersion", "getProperty", "setPointerMode",
              "getPointerMode", "setMathMode", "getMathMode", "getStream", "check_status",
              "createGenerator", "destroyGenerator"}

_lock = threading.Lock()
_done: set[str] = set()


def prepare_capture() -> None:
    """Install the library hooks that apply now; called before every capture begins."""
    if len(_done) < len(_GUARDED_MODULES) + len(_STEPS):
        with _lock:
            _install_pending()
    if _cublas.handle_wanted:
        _cublas.ensure_capture_handle(_cuda.get_device())
    random_module = sys.modules.get("cugraphrt.random")
    if random_module is not None:
        # The default generator's state must be written eagerly, before the capture.
        random_module._ensure_default_generator()


def _install_pending() -> None:
    if "random" not in _done:
        _guard_cupy_random()
        _done.add("random")
    if "cufft" not in _done:
        try:
            cufft = importlib.import_module("cupy.cuda.cufft")
        except ImportError:  # no cuFFT library installed: nothing can create plans
            cufft = None
        if cufft is not None:
            for name in ("Plan1d", "PlanNd"):
                original = getattr(cufft, name)
                if not isinstance(original, _PlanGuardMeta):
                    setattr(cufft, name, _PlanGuardMeta.wrapping(original))
        _done.add("cufft")
    if "linalg" not in _done:
        _guard_linalg()
        _done.add("linalg")
    if "compile" not in _done:
        _note_compilations()
        _done.add("compile")
    if "host_arrays" not in _done:  # cupy.asarray of host data: a constant of the graph
        _host_constants.stage_host_arrays()
        _done.add("host_arrays")
    for module_name, (library, advice) in _GUARDED_MODULES.items():
        if module_name in _done:
            continue
        module = sys.modules.get(module_name)
        if module_name == _CUBLAS:
            # Loaded now if need be (once per process): a first matmul inside a capture then
            # meets the hooks instead of CuPy's refusal.
            already_loaded = module is not None
            try:
                module = importlib.import_module(module_name)
            except ImportError:  # CuPy without cuBLAS: nothing to capture
                _done.add(module_name)
                continue
            _cublas.install(module, already_loaded)
        elif module is None:
            continue  # cuRAND/cuSOLVER/cuSPARSE not loaded: CuPy's refusal is translated
        _guard_module(module, library, advice)
        _done.add(module_name)


def _guard_module(module, library: str, advice: str) -> None:
    short = module.__name__.rsplit(".", 1)[-1]
    for name, fn in list(vars(module).items()):
        if (name.startswith("_") or name in _UNGUARDED or not callable(fn)
                or isinstance(fn, type) or hasattr(fn, "__cugraphrt_original__")):
            continue
        setattr(module, name, _refusing(fn, f"{short}.{name}", library, advice))


def _refusing(fn, qualname: str, library: str, advice: str):
    @functools.wraps(fn)
    def guarded(*args, **kwargs):
        if _capture.current_capture() is not None:
            raise LibraryCaptureError(
                f"{library} call {qualname} cannot be captured (got a call during a "
                f"cugraphrt capture): {advice}"
            )
        return fn(*args, **kwargs)

    cast(Any, guarded).__cugraphrt_original__ = fn
    return guarded


def _guard_linalg() -> None:
    linalg = importlib.import_module("cupy.linalg")
    for name, library in _LINALG.items():
        fn = getattr(linalg, name, None)
        if fn is None or hasattr(fn, "__cugraphrt_original__"):
            continue
        setattr(linalg, name, _refusing(fn, f"cupy.linalg.{name}", library, _LINALG_ADVICE))


def _note_compilations() -> None:
    """Record on the capture underway every kernel module CuPy compiles and loads in it.

    Loading a module during a capture is legal on current drivers, but it is the usual
    suspect when a capture is invalidated, so the error message names these kernels.
    """
    try:
        compiler = importlib.import_module("cupy.cuda.compiler")
    except ImportError:  # pragma: no cover - part of every CuPy
        return
    original = getattr(compiler, "_compile_module_with_cache", None)
    if original is None or hasattr(original, "__cugraphrt_original__"):
        return

    @functools.wraps(original)
    def compile_module(source, *args, **kwargs):
        capture = _capture.current_capture()
        if capture is not None:
            names = _KERNEL_NAME.findall(source) or ["<unnamed kernel>"]
            capture.notes.extend(names[:2])
        return original(source, *args, **kwargs)

    compile_module.__cugraphrt_original__ = original  # type: ignore[attr-defined]
    compiler._compile_module_with_cache = compile_module  # type: ignore[attr-defined]


_KERNEL_NAME = re.compile(r"__global__\s+void\s+(\w+)")


def _guard_cupy_random() -> None:
    try:
        generator: Any = importlib.import_module("cupy.random._generator")
    except ImportError:  # pragma: no cover - CuPy always ships it
        return
    advice = _GUARDED_MODULES["cupy_backends.cuda.libs.curand"][1]
    original = generator.get_random_state
    if not hasattr(original, "__cugraphrt_original__"):
        generator.get_random_state = _refusing(
            original, "cupy.random (legacy RandomState API)", "cuRAND", advice)
    init = generator.RandomState.__init__
    if not hasattr(init, "__cugraphrt_original__"):
        generator.RandomState.__init__ = _refusing(
            init, "cupy.random.RandomState()", "cuRAND", advice)


class _PlanGuardMeta(type):
    """Stands in for a cuFFT plan class: a plan constructed during a capture is the graph's.

    ``isinstance`` and ``issubclass`` still answer for the original class, so plans made
    before the guard was installed keep working everywhere CuPy checks their type.
    """

    _original: type

    @classmethod
    def wrapping(mcs, original: type) -> _PlanGuardMeta:
        return mcs(original.__name__, (), {
            "_original": original, "__doc__": original.__doc__,
            "__module__": original.__module__, "__qualname__": original.__qualname__,
        })

    def __call__(cls, *args, **kwargs):
        capture = _capture.current_capture()
        if capture is not None:
            return _fft_plans.create_in_capture(cls._original, args, kwargs, capture)
        return cls._original(*args, **kwargs)

    def __instancecheck__(cls, obj) -> bool:
        return isinstance(obj, cls._original)

    def __subclasscheck__(cls, sub) -> bool:
        return issubclass(sub, cls._original)
