"""cuBLAS through ctypes: the very library CuPy loaded, for GEMMs inside captures.

The floor's part of cugraphrt's cuBLAS support (the capture logic is
:mod:`cugraphrt._libraries.cublas`): binding the file CuPy loaded, and the calls made on a
handle of cugraphrt's own. Every status is checked here.
"""

from __future__ import annotations

import ctypes
import os
import threading

from cugraphrt.errors import CugraphrtError

__all__ = ["GEMM_FUNCTIONS", "create_handle", "gemm", "gemm_batched_ex", "mapped_libraries",
           "mirror_modes", "set_stream", "set_workspace", "workspace_bytes"]

_vp, _i, _ll = ctypes.c_void_p, ctypes.c_int, ctypes.c_longlong

# CuPy wrapper name -> (cuBLAS symbol, argument types after the handle). Every argument is
# passed through exactly as CuPy passes it (pointers as ints, host scalars by address).
_GEMM = [_i, _i, _i, _i, _i, _vp, _vp, _i, _vp, _i, _vp, _vp, _i]
_GEMM_EX = [_i, _i, _i, _i, _i, _vp, _vp, _i, _i, _vp, _i, _i, _vp, _vp, _i, _i]
_GEMM_BATCHED = [_i, _i, _i, _i, _i, _vp, _vp, _i, _vp, _i, _vp, _vp, _i, _i]
_GEMM_STRIDED = [_i, _i, _i, _i, _i, _vp, _vp, _i, _ll, _vp, _i, _ll, _vp, _vp, _i, _ll, _i]
_GEMM_BATCHED_EX = [_i, _i, _i, _i, _i, _vp, _vp, _i, _i, _vp, _i, _i, _vp, _vp, _i, _i, _i,
                    _i, _i]
GEMM_FUNCTIONS: dict[str, tuple[str, list]] = {
    "sgemm": ("cublasSgemm_v2", _GEMM),
    "dgemm": ("cublasDgemm_v2", _GEMM),
    "cgemm": ("cublasCgemm_v2", _GEMM),
    "zgemm": ("cublasZgemm_v2", _GEMM),
    "sgemmEx": ("cublasSgemmEx", _GEMM_EX),
    "gemmEx": ("cublasGemmEx", _GEMM_EX + [_i, _i]),
    "sgemmBatched": ("cublasSgemmBatched", _GEMM_BATCHED),
    "dgemmBatched": ("cublasDgemmBatched", _GEMM_BATCHED),
    "cgemmBatched": ("cublasCgemmBatched", _GEMM_BATCHED),
    "zgemmBatched": ("cublasZgemmBatched", _GEMM_BATCHED),
    "sgemmStridedBatched": ("cublasSgemmStridedBatched", _GEMM_STRIDED),
    "dgemmStridedBatched": ("cublasDgemmStridedBatched", _GEMM_STRIDED),
    "cgemmStridedBatched": ("cublasCgemmStridedBatched", _GEMM_STRIDED),
    "zgemmStridedBatched": ("cublasZgemmStridedBatched", _GEMM_STRIDED),
    "gemmStridedBatchedEx": (
        "cublasGemmStridedBatchedEx",
        [_i, _i, _i, _i, _i, _vp, _vp, _i, _i, _ll, _vp, _i, _i, _ll, _vp, _vp, _i, _i, _ll,
         _i, _i, _i],
    ),
}


def workspace_bytes(device_id: int) -> int:
    """The cuBLAS workspace a capture handle gets on ``device_id``."""
    configured = os.environ.get("CUGRAPHRT_CUBLAS_WORKSPACE_BYTES")
    if configured:
        return int(configured)
    from cupy.cuda import Device

    # cuBLAS's own recommendation: 32 MiB on Hopper and newer, 4 MiB before.
    return (32 if int(Device(device_id).compute_capability) >= 90 else 4) << 20


class _Library:
    """The cuBLAS library CuPy loaded, bound through ctypes."""

    def __init__(self) -> None:
        path = _loaded_library_path("libcublas.so")
        lib = ctypes.CDLL(path)
        self.path = path
        self.create = _fn(lib, "cublasCreate_v2", [ctypes.POINTER(_vp)])
        self.set_stream = _fn(lib, "cublasSetStream_v2", [_vp, _vp])
        self.set_workspace = _fn(lib, "cublasSetWorkspace_v2", [_vp, _vp, ctypes.c_size_t])
        self.get_math_mode = _fn(lib, "cublasGetMathMode", [_vp, ctypes.POINTER(_i)])
        self.set_math_mode = _fn(lib, "cublasSetMathMode", [_vp, _i])
        self.get_pointer_mode = _fn(lib, "cublasGetPointerMode_v2", [_vp, ctypes.POINTER(_i)])
        self.set_pointer_mode = _fn(lib, "cublasSetPointerMode_v2", [_vp, _i])
        self.gemms = {
            name: _fn(lib, symbol, [_vp] + argtypes)
            for name, (symbol, argtypes) in GEMM_FUNCTIONS.items()
        }
        # Not one of CuPy's wrappers (CuPy has no gemmBatchedEx): pointer arrays of any type.
        self.gemm_batched_ex = _fn(lib, "cublasGemmBatchedEx", [_vp] + _GEMM_BATCHED_EX)


def _fn(lib: ctypes.CDLL, name: str, argtypes: list):
    fn = getattr(lib, name)
    fn.argtypes = argtypes
    fn.restype = ctypes.c_int
    return fn


def _mapped(stem: str) -> list[str]:
    """Paths mapped into this process whose file names start with ``stem`` (cuBLAS's own,
    not cuBLASLt's), in map order, each once."""
    found: list[str] = []
    try:
        with open("/proc/self/maps") as maps:
            for line in maps:
                path = line.rsplit(None, 1)[-1]
                name = os.path.basename(path)
                if name.startswith(stem) and "Lt" not in name and path not in found:
                    found.append(path)
    except OSError:
        pass
    return found


def mapped_libraries(stem: str = "libcublas.so") -> list[str]:
    """The distinct files mapped into this process whose names start with ``stem`` (cuBLAS
    itself by default), by real path: one where every framework shares one cuBLAS, so that a
    handle of one can be passed to a call bound by another."""
    return sorted({os.path.realpath(path) for path in _mapped(stem)})


def _loaded_library_path(stem: str) -> str:
    """Path of an already loaded shared library whose file name starts with ``stem``.

    Binding the very file CuPy loaded guarantees one copy of cuBLAS in the process, so
    handles and modes are shared state, not two libraries' worth.
    """
    found = _mapped(stem)
    return found[0] if found else stem + ".13"  # else the dynamic linker finds the soname


_library: _Library | None = None
_library_lock = threading.Lock()


def _lib() -> _Library:
    global _library
    if _library is None:
        with _library_lock:
            if _library is None:
                _library = _Library()
    return _library


def check(status: int, call: str) -> None:
    """Raise for a cuBLAS status other than success."""
    if status != 0:
        raise CugraphrtError(f"{call} failed (got cuBLAS status {status})")


def create_handle() -> int:
    """``cublasCreate``: a new handle (it synchronizes the device)."""
    out = _vp(0)
    check(_lib().create(ctypes.byref(out)), "cublasCreate")
    return int(out.value or 0)


def mirror_modes(handle: int, cupy_handle: int) -> None:
    """Give ``handle`` the math and pointer modes of CuPy's handle."""
    lib = _lib()
    mode = _i(0)
    check(lib.get_math_mode(cupy_handle, ctypes.byref(mode)), "cublasGetMathMode")
    check(lib.set_math_mode(handle, mode.value), "cublasSetMathMode")
    check(lib.get_pointer_mode(cupy_handle, ctypes.byref(mode)), "cublasGetPointerMode")
    check(lib.set_pointer_mode(handle, mode.value), "cublasSetPointerMode")


def set_stream(handle: int, stream_ptr: int) -> None:
    """``cublasSetStream``."""
    check(_lib().set_stream(handle, stream_ptr), "cublasSetStream")


def set_workspace(handle: int, ptr: int, nbytes: int) -> None:
    """``cublasSetWorkspace``."""
    check(_lib().set_workspace(handle, ptr, nbytes), "cublasSetWorkspace")


def gemm(name: str, handle: int, *args: object) -> int:
    """The GEMM-family function ``name`` (CuPy's wrapper name) on ``handle``; its status."""
    return int(_lib().gemms[name](handle, *args))


def gemm_batched_ex(handle: int, transa: int, transb: int, m: int, n: int, k: int,
                    a_array: int, a_type: int, lda: int, b_array: int, b_type: int, ldb: int,
                    c_array: int, c_type: int, ldc: int, batch: int, compute_type: int,
                    algo: int) -> None:
    """``cublasGemmBatchedEx`` with alpha 1 and beta 0 (float scalars on the host: a 32-bit
    float compute type), ``C[i] = op(A[i]) op(B[i])`` for the device arrays of ``batch``
    pointers ``a_array``, ``b_array`` and ``c_array``, on ``handle`` as it is (its stream,
    workspace and modes: a framework's own handle computes as that framework's GEMMs do).

    The pointers are read on the device when the GEMM runs, so a graph that captures the
    call replays it over whatever the arrays hold then.
    """
    one, zero = ctypes.c_float(1.0), ctypes.c_float(0.0)
    check(_lib().gemm_batched_ex(handle, transa, transb, m, n, k, ctypes.byref(one), a_array,
                                 a_type, lda, b_array, b_type, ldb, ctypes.byref(zero),
                                 c_array, c_type, ldc, batch, compute_type, algo),
          "cublasGemmBatchedEx")
