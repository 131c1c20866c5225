"""cuBLAS GEMMs inside captures, which CuPy refuses on its own.

CuPy's cuBLAS wrappers call ``cublasSetStream`` through a check that raises
``NotImplementedError`` whenever the stream is capturing (CuPy issue 6290). CuPy's matmul
code reaches those wrappers through the ``cupy_backends.cuda.libs.cublas`` module's
attributes, so cugraphrt replaces the GEMM-family attributes with functions that, inside a
cugraphrt capture, call the same cuBLAS library directly (ctypes) on a cuBLAS handle of
cugraphrt's own (the calls themselves: :mod:`cugraphrt._cuda.cublas`):

* the handle's stream is the capturing stream, its math and pointer modes mirror CuPy's
  handle, so results equal eager CuPy's;
* its workspace is a shared block of the capture's pool (``MemPool._shared_block``), set
  explicitly with ``cublasSetWorkspace``, so cuBLAS never calls ``cudaMalloc`` during
  capture. Graphs of one pool replay one after another, so they share one workspace per
  stream: the first stream of a capture that runs a GEMM uses workspace 0 of the pool, the
  second stream workspace 1, and so on (streams of one capture may run concurrently, so
  they never share one). The pool keeps the workspaces while any of its graphs lives, so
  resetting one graph cannot break another;
* CuPy's own handle is never touched. Outside captures the original functions run.
"""

from __future__ import annotations

import functools
import sys
import threading
import weakref

from cugraphrt._capture import stream_capture as _capture
from cugraphrt._cuda import cublas as _blas
from cugraphrt._cuda.status_errors import LibraryCaptureError
from cugraphrt._memory.backing import capture_activity
from cugraphrt.errors import CaptureError

__all__ = ["install", "ensure_capture_handle"]

#: Whether CuPy has a cuBLAS handle (so captures may run GEMMs): set when CuPy's cuBLAS
#: module was loaded before cugraphrt's hooks, or when CuPy creates a handle afterwards.
handle_wanted = False

_handles = threading.local()
# Handles of threads that have ended, per device, for the next thread that captures: a
# thread pool that keeps starting threads must not create (and leak) a handle per thread.
_idle: dict[int, list[int]] = {}
_idle_lock = threading.RLock()  # its own: _give_back may run from a garbage collection
#: How many capture handles the process created (each holds a cuBLAS workspace).
created_handles = 0


class _ThreadHandles:
    """This thread's capture handles; they go back to ``_idle`` when the thread ends."""

    def __init__(self) -> None:
        self.by_device: dict[int, int] = {}
        weakref.finalize(self, _give_back, self.by_device)


def _give_back(by_device: dict[int, int]) -> None:
    with _idle_lock:
        for device_id, handle in by_device.items():
            _idle.setdefault(device_id, []).append(handle)


def _thread_handles() -> dict[int, int]:
    holder = getattr(_handles, "holder", None)
    if holder is None:
        holder = _handles.holder = _ThreadHandles()
    return holder.by_device


def ensure_capture_handle(device_id: int) -> int:
    """This thread's capture handle for ``device_id``, made ready outside any capture."""
    global created_handles
    by_device = _thread_handles()
    handle = by_device.get(device_id)
    if handle is not None:
        return handle
    with _idle_lock:
        idle = _idle.get(device_id)
        if idle:
            handle = by_device[device_id] = idle.pop()
            return handle
    # cublasCreate synchronizes the device: it invalidates every capture underway in any
    # thread, whatever the capture mode. Wait until none is, and hold new ones back.
    with capture_activity.exclusive("creating cugraphrt's cuBLAS handle for this thread"):
        handle = _blas.create_handle()
    created_handles += 1
    by_device[device_id] = handle
    return handle


def _prepare(capture, cupy_handle: int) -> int:
    """Point the capture handle at the capture stream and pool workspace; mirror modes."""
    handle = _thread_handles().get(capture.device_id)
    if handle is None:
        raise LibraryCaptureError(
            "cuBLAS was first used inside a capture (got no cuBLAS handle from before the "
            "capture began); run the matrix product once before capturing (warm-up)"
        )
    _blas.mirror_modes(handle, cupy_handle)
    stream_ptr = _capture._get_current_stream().ptr
    _blas.set_stream(handle, stream_ptr)
    ptr, nbytes = _workspace_for(capture, stream_ptr)
    _blas.set_workspace(handle, ptr, nbytes)
    return handle


def _workspace_for(capture, stream_ptr: int) -> tuple[int, int]:
    """The workspace (address, bytes) of GEMMs on ``stream_ptr`` in ``capture``."""
    streams = None
    for item in capture.keepalive:
        if isinstance(item, _Workspaces):
            streams = item
            break
    if streams is None:
        streams = _Workspaces()
        capture.keepalive.append(streams)
        # The pool holds the workspaces; the capture only needs its lookup while it lasts.
        capture.finish_hooks.append(streams.drop)
    found = streams.by_stream.get(stream_ptr)
    if found is None:
        nbytes = _blas.workspace_bytes(capture.device_id)
        # Keyed by the stream's rank in this capture, not by its address: another capture
        # (another thread's capture stream, torch's side stream) shares workspace 0 too.
        key = ("cublas", len(streams.by_stream))
        ptr = capture.pool._shared_block(key, nbytes, stream_ptr, capture.token)
        found = streams.by_stream[stream_ptr] = (ptr, nbytes)
    return found


class _Workspaces:
    """Per capture: stream address -> (workspace address, bytes)."""

    __slots__ = ("by_stream",)

    def __init__(self) -> None:
        self.by_stream: dict[int, tuple[int, int]] = {}

    def drop(self, capture) -> None:
        self.by_stream = {}
        if self in capture.keepalive:
            capture.keepalive.remove(self)


def _capturable(name: str, original, c_function_name: str):
    @functools.wraps(original)
    def gemm(handle, *args):
        capture = _capture.current_capture()
        if capture is None:
            return original(handle, *args)
        ours = _prepare(capture, handle)
        status = _blas.gemm(name, ours, *args)
        if status != 0:
            raise CaptureError(
                f"cuBLAS {c_function_name} failed during capture (got cuBLAS status "
                f"{status}); check the operands, or run this product outside the capture"
            )

    gemm.__cugraphrt_original__ = original  # type: ignore[attr-defined]
    return gemm


def _watching_create(original):
    @functools.wraps(original)
    def create():
        if _capture.current_capture() is not None:
            # A NotImplementedError too, as CuPy's own refusal of cuBLAS in a capture is.
            raise LibraryCaptureError(
                "CuPy would create its cuBLAS handle during capture (got the first cuBLAS "
                "call of this thread inside a capture); run the matrix product once before "
                "capturing (warm-up)"
            )
        global handle_wanted
        handle_wanted = True
        # Creating a handle invalidates the captures of other threads (see
        # ensure_capture_handle): an eager thread's first cuBLAS call waits for them to end.
        with capture_activity.exclusive("CuPy's first cuBLAS call in this thread"):
            return original()

    create.__cugraphrt_original__ = original
    return create


def _guarded_destroy(original):
    """CuPy's ``cublas.destroy``, kept out of every capture underway.

    ``cublasDestroy`` synchronizes the device (cuBLAS documents it), which invalidates every
    capture underway in any thread, whatever its mode. CuPy destroys a thread's handle when
    the thread ends (its thread-local storage is cleared), so a worker that finishes while
    another still captures broke that capture (a stress run of eight threads capturing at
    once on an H200, 2026-11-28: "capture status 2 right after cudaStreamBeginCapture").
    The destroy waits until no capture is underway and holds new ones back meanwhile; from
    a thread that captures itself (a garbage collection in its capture) it runs when the
    last capture ends. CuPy's handles bind the function when they are made, so handles made
    before cugraphrt installed this keep CuPy's own.

    CuPy's handles of ended threads can die in the interpreter's teardown, after this
    module's globals were set to None; what the destroy needs there is bound here, and a
    finalizing interpreter destroys at once (no capture can be underway). Reading a cleared
    global printed an empty "Error in sys.excepthook" after every multi-threaded run."""
    activity, alone, finalizing = capture_activity, _destroy_alone, sys.is_finalizing

    @functools.wraps(original)
    def destroy(handle):
        if finalizing():
            return original(handle)
        if activity.active_in_this_thread():
            activity.defer_or_run(lambda: alone(original, handle))
            return None
        return alone(original, handle)

    destroy.__cugraphrt_original__ = original
    return destroy


def _destroy_alone(original, handle) -> None:
    with capture_activity.exclusive("destroying a cuBLAS handle (cublasDestroy synchronizes "
                                    "the device)"):
        original(handle)


def install(module, already_loaded: bool) -> None:
    """Replace the GEMM-family functions of CuPy's cuBLAS module (idempotent).

    Parameters
    ----------
    module
        ``cupy_backends.cuda.libs.cublas``.
    already_loaded : bool
        Whether CuPy loaded the module before cugraphrt (it may hold a handle already).
    """
    global handle_wanted
    handle_wanted = handle_wanted or already_loaded
    if not hasattr(module.create, "__cugraphrt_original__"):
        module.create = _watching_create(module.create)
    if not hasattr(module.destroy, "__cugraphrt_original__"):
        module.destroy = _guarded_destroy(module.destroy)
    for name, (symbol, _) in _blas.GEMM_FUNCTIONS.items():
        original = getattr(module, name, None)
        if original is None or hasattr(original, "__cugraphrt_original__"):
            continue
        setattr(module, name, _capturable(name, original, symbol))
