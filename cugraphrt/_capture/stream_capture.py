"""Captures underway: the stream bookkeeping and the routing of CuPy allocations.

While a capture is underway in a thread, a router is that thread's CuPy allocator (CuPy's
thread-local ``using_allocator`` slot). It sends every allocation issued on the capturing
stream, or on a stream forked from it inside the capture, to the capture's pool; any other
allocation goes to the allocator the thread had before, untouched. Other threads never see
the router.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any

import cupy
from cupy.cuda import memory as cupy_memory

from cugraphrt._capture import diagnose as _diagnose
from cugraphrt._cuda import runtime as _cuda
from cugraphrt._memory.backing import capture_activity
from cugraphrt._memory.pool import MemPool
from cugraphrt.errors import CaptureError, CugraphrtError, PoolOutOfMemoryError

__all__ = ["Capture", "begin", "end", "abort", "current_capture", "is_current_stream_capturing",
           "attach_body", "detach_body"]

_get_current_stream = cupy.cuda.get_current_stream


class Capture:
    """One capture underway: its stream, CUDA capture id, pool and clean-up hooks."""

    __slots__ = ("stream", "stream_ptr", "capture_id", "pool", "mode", "token", "streams",
                 "finish_hooks", "abort_hooks", "keepalive", "aborted_by", "device_id",
                 "notes", "body_ids", "keep_graph_on_abort", "collectives", "bodies",
                 "__weakref__")

    def __init__(self, stream, capture_id: int, pool: MemPool, mode: str, device_id: int,
                 token: object) -> None:
        self.stream = stream
        self.stream_ptr = stream.ptr
        self.capture_id = capture_id
        self.pool = pool
        self.mode = mode
        self.token = token
        self.streams = {stream.ptr}
        # Called once when the capture finishes, successfully or not (library hooks: e.g.
        # hand a cuBLAS workspace back to the pool).
        self.finish_hooks: list[Callable[[Capture], None]] = []
        # Called first when a capture is aborted (adapters that began the capture).
        self.abort_hooks: list[Callable[[Capture], None]] = []
        # Objects the replayed graph needs alive (host callbacks): moved to the graph.
        self.keepalive: list[object] = []
        self.aborted_by: BaseException | None = None
        self.device_id = device_id
        # Set when a conditional-node body's capture was invalidated: cudaGraphDestroy of the
        # enclosing graph then crashes the process (measured: a segmentation fault on an
        # H100, driver 580, CUDA 13), so an aborted capture leaks that one graph instead.
        self.keep_graph_on_abort = False
        # What happened during the capture that may explain a failure later (kernels
        # compiled and loaded during it), for the error message.
        self.notes: list[str] = []
        # Capture ids of the conditional-node bodies being captured for this capture (see
        # cugraphrt._control.loops): streams forked inside a body carry those ids.
        self.body_ids: set[int] = set()
        # The collectives recorded into this capture (cugraphrt.distributed.log), if any.
        self.collectives: Any = None
        # What each conditional body holds, in capture order (cugraphrt._control.bodies).
        self.bodies: list = []


class _ThreadCaptures(threading.local):
    def __init__(self) -> None:
        self.by_stream: dict[int, Capture] = {}
        self.captures: list[Capture] = []
        self.router_context: AbstractContextManager[Any] | None = None
        self.fallback: Callable | None = None


_tls = _ThreadCaptures()


def _route(nbytes: int):
    """The thread's CuPy allocator while captures are underway in it."""
    state = _tls
    ptr = _get_current_stream().ptr
    capture = state.by_stream.get(ptr)
    if capture is None and nbytes:
        capture = _find_fork(state, ptr)
    if capture is None or not nbytes:
        fallback = state.fallback
        assert fallback is not None  # set while captures are underway
        return fallback(nbytes)
    try:
        return capture.pool._allocate(nbytes, ptr, capture.token)
    except PoolOutOfMemoryError as exc:
        # The allocation cannot be satisfied: end and roll the capture back here, so the
        # stream and the pool are usable again whatever the caller does with the error.
        abort(capture, exc)
        raise


def _find_fork(state: _ThreadCaptures, ptr: int) -> Capture | None:
    """The capture a stream joined by waiting on an event of a capturing stream, if any."""
    if ptr in (0, 1) or not state.captures:
        return None  # querying the legacy stream would invalidate a global-mode capture
    status, capture_id = _cuda.capture_info(ptr)
    if status != _cuda.STATUS_ACTIVE:
        return None
    for capture in state.captures:
        if capture.capture_id == capture_id or capture_id in capture.body_ids:
            state.by_stream[ptr] = capture
            capture.streams.add(ptr)
            return capture
    return None


def attach_body(capture: Capture, stream_ptr: int, body_id: int) -> None:
    """Treat a body stream as the capture's own while a conditional node's body is captured
    on it (with CUDA capture id ``body_id``): its allocations go to the capture's pool."""
    _tls.by_stream[stream_ptr] = capture
    capture.streams.add(stream_ptr)
    capture.body_ids.add(body_id)


def detach_body(capture: Capture, stream_ptr: int, body_id: int) -> None:
    """The body captured on ``stream_ptr`` is complete (or rolled back)."""
    capture.streams.discard(stream_ptr)
    capture.body_ids.discard(body_id)
    if _tls.by_stream.get(stream_ptr) is capture:
        del _tls.by_stream[stream_ptr]


def current_capture() -> Capture | None:
    """The cugraphrt capture the current stream belongs to in this thread, or None."""
    state = _tls
    if not state.captures:
        return None
    ptr = _get_current_stream().ptr
    capture = state.by_stream.get(ptr)
    if capture is None:
        capture = _find_fork(state, ptr)
    return capture


def is_current_stream_capturing() -> bool:
    """Whether CuPy's current stream is capturing (by cugraphrt or anyone else).

    Returns
    -------
    bool
        True while a capture on the current stream is active. The legacy default stream
        never captures, and is not queried (that would invalidate a global-mode capture
        underway elsewhere).
    """
    ptr = _get_current_stream().ptr
    if ptr in (0, 1):
        return False
    if ptr in _tls.by_stream:
        return True
    status, _ = _cuda.capture_info(ptr)
    return status == _cuda.STATUS_ACTIVE


def begin(pool: MemPool, mode: str, prepare: Callable[[], None] | None = None,
          start: Callable[[object, str, object], None] | None = None) -> Capture:
    """Begin a capture on CuPy's current stream, allocating from ``pool``.

    ``start(stream, mode, token)`` performs the CUDA-level begin; by default CuPy's
    ``Stream.begin_capture``. Adapters pass their framework's own begin (PyTorch's
    ``CUDAGraph.capture_begin``) so the framework knows about the capture too. ``token``
    is the capture's token in ``pool`` (see :func:`cugraphrt.adapter.allocate`): what
    ``start`` runs before the CUDA-level begin (warm-ups) may allocate from the pool with it.

    Raises
    ------
    CaptureError
        On the legacy default stream, when the stream already captures, or when the pool
        belongs to another device or is in use by a concurrent capture.
    """
    stream = _get_current_stream()
    ptr = stream.ptr
    if ptr in (0, 1):
        # "CUDA graphs must be captured on a non-default stream." is PyTorch's wording, which
        # code written for torch.cuda.CUDAGraph matches on.
        raise CaptureError(
            f"cannot capture on the legacy default stream: CUDA graphs must be captured on a "
            f"non-default stream. (got stream 0x{ptr:x}) Make a non-default stream current "
            f"first (with cupy.cuda.Stream(non_blocking=True): ..., or with "
            f"torch.cuda.stream(torch.cuda.Stream()): ...), or use cugraphrt.graph() / "
            f"cugraphrt_torch.graph(), which do it for you"
        )
    status, _ = _cuda.capture_info(ptr)
    if status != _cuda.STATUS_NONE:
        raise CaptureError(
            f"nested capture: stream 0x{ptr:x} is already capturing (got capture status "
            f"{status}); end the outer capture first, or let the outer graph record this work"
        )
    device_id = _cuda.get_device()
    if pool.device_id != device_id:
        raise CaptureError(
            f"the memory pool belongs to device {pool.device_id} (got current device "
            f"{device_id}); capture on the pool's device or use a pool of this device"
        )
    if prepare is not None:
        prepare()  # library handles and patches: anything that may cudaMalloc runs now
    token = object()
    pool._begin_capture(token)
    capture_activity.enter()
    try:
        if start is None:
            stream.begin_capture(mode=_cuda.CAPTURE_MODES[mode])
        else:
            start(stream, mode, token)
        status, capture_id = _cuda.capture_info(ptr)
        if status == _cuda.STATUS_INVALIDATED:
            # Broken between its begin and now: by another thread (see _diagnose).
            raise _diagnose.invalidated_error(
                _Begun(stream, mode), "its first operation",
                f"capture status {status} right after cudaStreamBeginCapture")
        if status != _cuda.STATUS_ACTIVE:
            raise CaptureError(f"the capture did not begin on stream 0x{ptr:x} (got capture "
                               f"status {status}); begin it on CuPy's current stream")
    except BaseException as exc:
        _cuda.abandon_capture(ptr)  # whatever began (a capture, an invalidated one) ends here
        capture_activity.exit()
        pool._end_capture(token, succeeded=False)
        if isinstance(exc, _cuda.CUDARuntimeError) and not isinstance(exc, CugraphrtError):
            raise _cuda.error_from_status(exc.status, "cudaStreamBeginCapture") from exc
        raise
    capture = Capture(stream, capture_id, pool, mode, device_id, token)
    _register(capture)
    return capture


class _Begun:
    """What the diagnosis reads of a capture that broke before it was registered."""

    __slots__ = ("stream", "mode", "notes")

    def __init__(self, stream, mode: str) -> None:
        self.stream = stream
        self.mode = mode
        self.notes: list[str] = []


def _register(capture: Capture) -> None:
    state = _tls
    if not state.captures:
        state.fallback = cupy_memory.get_allocator()
        router_context = cupy.cuda.using_allocator(_route)
        state.router_context = router_context
        router_context.__enter__()
    state.captures.append(capture)
    state.by_stream[capture.stream_ptr] = capture


def _unregister(capture: Capture) -> None:
    state = _tls
    if capture not in state.captures:
        return
    state.captures.remove(capture)
    for ptr in capture.streams:
        if state.by_stream.get(ptr) is capture:
            del state.by_stream[ptr]
    if not state.captures and state.router_context is not None:
        context, state.router_context = state.router_context, None
        context.__exit__(None, None, None)
        state.fallback = None


def end(capture: Capture, finish: Callable[[Capture], int] | None = None) -> tuple[int, int]:
    """End a capture; returns the raw graph handle and the graph's place in its pool.

    ``finish(capture)`` performs the CUDA-level end and returns the ``cudaGraph_t``; by
    default ``cudaStreamEndCapture``. It must raise a CugraphrtError if CUDA rejects the
    capture.

    Raises
    ------
    CaptureError
        If the capture was already rolled back, if the current stream is not the capture
        stream (the capture stays underway so the caller can fix that), or if CUDA rejects
        the capture (unjoined fork, invalidated capture); in the last case the capture is
        rolled back.
    """
    if capture.aborted_by is not None:
        raise CaptureError(
            f"the capture was already ended and rolled back (got "
            f"{type(capture.aborted_by).__name__}: {capture.aborted_by}); begin a new capture"
        )
    current = _get_current_stream().ptr
    if current != capture.stream_ptr:
        raise CaptureError(
            f"capture must end on the stream it began on (began on stream "
            f"0x{capture.stream_ptr:x}, got current stream 0x{current:x}); make the capture "
            f"stream current again (with stream: ...) before ending the capture"
        )
    try:
        if finish is None:
            handle = _cuda.end_capture(capture.stream_ptr)
        else:
            handle = finish(capture)
    except CugraphrtError as exc:
        _clear_host_funcargs(capture)
        _finish(capture, succeeded=False, error=exc)
        refined = _diagnose.capture_error_from(exc, capture)
        if refined is not None and refined is not exc:
            raise refined from exc
        raise
    capture.keepalive.append(_clear_host_funcargs(capture))
    # Count the graph in its pool before the pool leaves capture mode, so that no array
    # dying in between can make an idle private pool release the graph's memory.
    seq = capture.pool._add_graph()
    _finish(capture, succeeded=True)
    return handle, seq


def abort(capture: Capture, error: BaseException | None = None) -> None:
    """End a failed capture, drop its graph and roll its allocations back; never raises.

    An adapter that began the capture itself registers its own clean-up in
    ``capture.abort_hooks`` (run first, e.g. to let PyTorch end its capture).
    """
    if capture.aborted_by is not None or capture not in _tls.captures:
        return
    for hook in capture.abort_hooks:
        try:
            hook(capture)
        except Exception:  # noqa: BLE001 - roll back whatever the adapter's clean-up did
            pass
    _cuda.abandon_capture(capture.stream_ptr, destroy=not capture.keep_graph_on_abort)
    _clear_host_funcargs(capture)
    _finish(capture, succeeded=False, error=error or CaptureError("capture aborted"))


def _finish(capture: Capture, succeeded: bool, error: BaseException | None = None) -> None:
    if not succeeded:
        capture.aborted_by = error
    _unregister(capture)
    hooks, capture.finish_hooks = capture.finish_hooks, []
    try:
        for hook in hooks:
            hook(capture)
    finally:
        capture.pool._end_capture(capture.token, succeeded)
        capture_activity.exit()


def _clear_host_funcargs(capture: Capture):
    # CuPy's Stream.begin_capture collects host callbacks launched during capture in this
    # attribute; they must outlive every replay, so the graph keeps them.
    funcargs = getattr(capture.stream, "_graph_host_funcargs", None)
    try:
        capture.stream._graph_host_funcargs = None
    except AttributeError:
        pass
    return funcargs
