"""The only module that talks to CUDA directly.

CuPy's runtime module covers most calls (capture begin/end, launch, upload, destroy). What it
lacks (capture info with the capture id, the per-thread capture-mode exchange, instantiation
with flags, the node count of a graph) comes from the driver API through ctypes, so cugraphrt
needs no package beyond CuPy. Every CUDA status, from either path, goes through
:func:`error_from_status`, which turns it into a cugraphrt exception with the likely cause.
"""

from __future__ import annotations

import ctypes
import threading
from typing import TYPE_CHECKING

from cupy_backends.cuda.api import driver as _cupy_driver
from cupy_backends.cuda.api import runtime

from cugraphrt._cuda.status_errors import CudaCaptureError, CudaStatusError
from cugraphrt.errors import CugraphrtError

if TYPE_CHECKING:
    from _ctypes import CFuncPtr

# CUDA status numbers; the runtime (cudaError_t) and the driver (CUresult) agree on these.
SUCCESS = 0
OUT_OF_MEMORY = 2
CAPTURE_UNSUPPORTED = 900
CAPTURE_INVALIDATED = 901
CAPTURE_MERGE = 902
CAPTURE_UNMATCHED = 903
CAPTURE_UNJOINED = 904
CAPTURE_ISOLATION = 905
CAPTURE_IMPLICIT = 906
CAPTURED_EVENT = 907
CAPTURE_WRONG_THREAD = 908

# cudaStreamCaptureStatus / CUstreamCaptureStatus
STATUS_NONE = 0
STATUS_ACTIVE = 1
STATUS_INVALIDATED = 2

# cudaStreamCaptureMode / CUstreamCaptureMode
CAPTURE_MODES = {"global": 0, "thread_local": 1, "relaxed": 2}
_MODE_RELAXED = 2

_INSTANTIATE_AUTO_FREE_ON_LAUNCH = 1
_INVALID_CONTEXT = 201  # CUDA_ERROR_INVALID_CONTEXT
_DEBUG_DOT_VERBOSE = 1

SYNC_HINT = (
    "a synchronizing call (.get(), cupy.asnumpy, int()/float() of an array, "
    "Stream.synchronize, a host-to-device copy from pageable memory, cudaMalloc/cudaFree) ran "
    "during capture; warm up first and keep host syncs outside the captured region"
)

_CAUSES = {
    CAPTURE_UNSUPPORTED: SYNC_HINT,
    CAPTURE_INVALIDATED: "an earlier operation invalidated the capture: " + SYNC_HINT,
    CAPTURE_MERGE: "two independent captures were merged through an event; record events "
    "only on streams of the same capture",
    CAPTURE_UNMATCHED: "the capture was not begun on this stream; end the capture on the "
    "stream it began on",
    CAPTURE_UNJOINED: "work forked from the capture stream onto another stream was not joined "
    "back; record an event on the forked stream and make the capture stream wait on it "
    "(capture_stream.wait_event(forked.record())) before the capture ends",
    CAPTURE_ISOLATION: "a capturing stream waited on an event recorded outside the capture; "
    "record the event inside the captured region, or wait before capture begins",
    CAPTURE_IMPLICIT: "the legacy default stream was used while a capture is underway; use "
    "non-default streams (cupy.cuda.Stream(non_blocking=True)) for all work during capture",
    CAPTURED_EVENT: "an event recorded inside a capture was queried or synchronized; do that "
    "after the capture ends",
    CAPTURE_WRONG_THREAD: "the capture was ended from a different thread than the one that "
    "began it (thread_local or relaxed mode); end it on the thread that began it",
}


#: The stream-capture statuses (900-908).
CAPTURE_STATUSES = frozenset(_CAUSES)


def error_from_status(status: int, call: str) -> CugraphrtError:
    """Turn a CUDA status into a cugraphrt exception that names the likely cause.

    Parameters
    ----------
    status : int
        A ``cudaError_t`` or ``CUresult`` value (they share the numbers used here).
    call : str
        The API call that returned it, for the message.

    Returns
    -------
    CugraphrtError
        A :class:`CaptureError` for the stream-capture statuses, a plain
        :class:`CugraphrtError` otherwise; either is also CuPy's ``CUDARuntimeError`` with
        ``status`` set (see :mod:`cugraphrt._cuda.status_errors`), and its message names the status
        as CuPy's does (``cudaErrorStreamCaptureInvalidated``).
    """
    name = status_name(status)
    cause = _CAUSES.get(status)
    if cause is not None:
        return CudaCaptureError(f"{call} failed during stream capture (got {name}): {cause}",
                                status)
    if status == OUT_OF_MEMORY:
        return CudaStatusError(
            f"{call} failed: the device is out of memory (got {name}); free memory held "
            f"elsewhere (cupy.get_default_memory_pool().free_all_blocks(), "
            f"cugraphrt.empty_cache(), torch.cuda.empty_cache()) and retry", status)
    return CudaStatusError(f"{call} failed (got {name})", status)


def check(status: int, call: str) -> None:
    """Raise :func:`error_from_status` for any status but success."""
    if status != SUCCESS:
        raise error_from_status(status, call)


def status_name(status: int) -> str:
    """Name of a CUDA status, as ``cudaErrorX (N)`` where the runtime knows it."""
    try:
        name = str(runtime.CUDARuntimeError(status)).split(":")[0]
    except Exception:  # noqa: BLE001 - an unknown code, or no CUDA runtime at all
        return f"CUDA error {status}"
    return f"{name} ({status})"


# ----------------------------------------------------------------------------------------------
# Driver API through ctypes
# ----------------------------------------------------------------------------------------------


class _Driver:
    """The few driver entry points CuPy does not expose, bound once."""

    def __init__(self) -> None:
        try:
            lib = ctypes.CDLL("libcuda.so.1")
        except OSError as exc:
            raise CugraphrtError(
                "the CUDA driver library libcuda.so.1 could not be loaded (got: "
                f"{exc}); cugraphrt needs an NVIDIA GPU with its driver installed"
            ) from exc
        vp, u64, c_int = ctypes.c_void_p, ctypes.c_uint64, ctypes.c_int
        self.init = _bind(lib, ("cuInit",), [ctypes.c_uint])
        self.capture_info = _bind(
            lib,
            ("cuStreamGetCaptureInfo_v3", "cuStreamGetCaptureInfo_v2", "cuStreamGetCaptureInfo"),
            # Trailing outputs are optional; passing NULL for all of them is valid for each
            # variant, and surplus arguments are harmless in the C calling convention.
            [vp, ctypes.POINTER(c_int), ctypes.POINTER(u64), vp, vp, vp, vp],
        )
        self.exchange_mode = _bind(
            lib, ("cuThreadExchangeStreamCaptureMode",), [ctypes.POINTER(c_int)]
        )
        self.instantiate = _bind(
            lib,
            ("cuGraphInstantiateWithFlags",),
            [ctypes.POINTER(vp), vp, ctypes.c_ulonglong],
        )
        self.graph_nodes = _bind(
            lib, ("cuGraphGetNodes",), [vp, vp, ctypes.POINTER(ctypes.c_size_t)]
        )
        self.driver_version = _bind(lib, ("cuDriverGetVersion",), [ctypes.POINTER(c_int)])
        check(self.init(0), "cuInit")


def _bind(lib: ctypes.CDLL, names: tuple[str, ...], argtypes: list) -> CFuncPtr:
    for name in names:
        try:
            fn = getattr(lib, name)
        except AttributeError:
            continue
        fn.argtypes = argtypes
        fn.restype = ctypes.c_int
        return fn
    raise CugraphrtError(f"the CUDA driver lacks {names[0]} (got a driver older than needed)")


_driver_instance: _Driver | None = None
_driver_lock = threading.Lock()


def driver() -> _Driver:
    """The bound driver entry points (loaded on first use)."""
    global _driver_instance
    if _driver_instance is None:
        with _driver_lock:
            if _driver_instance is None:
                _driver_instance = _Driver()
    return _driver_instance


def capture_info(stream_ptr: int) -> tuple[int, int]:
    """Capture status and capture id of a stream (``cuStreamGetCaptureInfo``).

    Never call this on the legacy default stream while a capture may be underway: CUDA
    treats that as an implicit synchronization and invalidates the capture.
    """
    status = ctypes.c_int(0)
    capture_id = ctypes.c_uint64(0)
    check(
        driver().capture_info(stream_ptr, ctypes.byref(status), ctypes.byref(capture_id),
                              None, None, None, None),
        "cuStreamGetCaptureInfo",
    )
    return status.value, capture_id.value


class relaxed_capture_mode:  # lower case: used as a function, with relaxed_capture_mode()
    """Let this thread make unsafe calls (cudaMalloc, cudaFree) while captures are underway.

    This is PyTorch's approach to growing a graph pool during a global-mode capture: the
    thread's capture mode is exchanged for relaxed around the call and restored afterwards.
    A class rather than a generator context: every segment a pool takes passes here.
    """

    __slots__ = ("_mode",)

    def __enter__(self) -> None:
        mode = self._mode = ctypes.c_int(_MODE_RELAXED)
        check(driver().exchange_mode(ctypes.byref(mode)), "cuThreadExchangeStreamCaptureMode")

    def __exit__(self, *exc: object) -> None:
        driver().exchange_mode(ctypes.byref(self._mode))


def instantiate(graph_handle: int) -> int:
    """Instantiate a graph, with auto-free-on-launch where the driver supports it.

    Runs in relaxed capture mode: instantiation is an unsafe call, which CUDA refuses (and
    which invalidates the capture) while another thread's global-mode capture is underway;
    it does not touch that capture's stream, so relaxing the check is safe.
    """
    exec_handle = ctypes.c_void_p(0)
    flags = _INSTANTIATE_AUTO_FREE_ON_LAUNCH if driver_version() >= 11040 else 0
    call = driver().instantiate
    with relaxed_capture_mode():
        status = call(ctypes.byref(exec_handle), graph_handle, flags)
        if status == _INVALID_CONTEXT:
            # A thread that never made a runtime call has no current context for the driver
            # API: binding the runtime's device makes its primary context current.
            runtime.setDevice(runtime.getDevice())
            status = call(ctypes.byref(exec_handle), graph_handle, flags)
    check(status, "cuGraphInstantiateWithFlags")
    return int(exec_handle.value or 0)


def graph_node_count(graph_handle: int) -> int:
    """Number of nodes in a captured graph (0 means nothing was captured)."""
    count = ctypes.c_size_t(0)
    check(driver().graph_nodes(graph_handle, None, ctypes.byref(count)), "cuGraphGetNodes")
    return int(count.value)


_driver_version: int | None = None


def driver_version() -> int:
    """The driver's CUDA version as an integer, e.g. 13000."""
    global _driver_version
    if _driver_version is None:
        version = ctypes.c_int(0)
        check(driver().driver_version(ctypes.byref(version)), "cuDriverGetVersion")
        _driver_version = version.value
    return _driver_version


def debug_dot_print(graph_handle: int, path: str, flags: int = _DEBUG_DOT_VERBOSE) -> None:
    """Write the graph as Graphviz DOT; by default with the most detail CUDA offers."""
    _runtime_call(runtime.graphDebugDotPrint, "cudaGraphDebugDotPrint",
                  graph_handle, path, flags)


def _runtime_call(fn, call: str, *args):
    """Call a CuPy runtime function, routing its CUDA status through error_from_status."""
    try:
        return fn(*args)
    except runtime.CUDARuntimeError as exc:
        raise error_from_status(exc.status, call) from exc


def begin_capture(stream_ptr: int, mode: str) -> None:
    """``cudaStreamBeginCapture`` in the given mode."""
    _runtime_call(runtime.streamBeginCapture, "cudaStreamBeginCapture",
                  stream_ptr, CAPTURE_MODES[mode])


def end_capture(stream_ptr: int) -> int:
    """``cudaStreamEndCapture``; returns the graph handle."""
    return _runtime_call(runtime.streamEndCapture, "cudaStreamEndCapture", stream_ptr)


def abandon_capture(stream_ptr: int, *, destroy: bool = True) -> None:
    """End a capture that failed and destroy whatever graph it produced (unless ``destroy``
    is False: see ``Capture.keep_graph_on_abort``); never raises."""
    try:
        status, _ = capture_info(stream_ptr)
    except CugraphrtError:
        status = STATUS_ACTIVE
    if status == STATUS_NONE:
        return
    try:
        handle = runtime.streamEndCapture(stream_ptr)
    except runtime.CUDARuntimeError:
        return  # an invalidated capture ends with an error and no graph
    if handle and destroy:
        destroy_graph(handle)


def destroy_graph(graph_handle: int) -> None:
    """``cudaGraphDestroy``; never raises (used by finalizers).

    Like every clean-up call here, in relaxed capture mode: a garbage collection may run it
    while another thread's global-mode capture is underway.
    """
    try:
        with relaxed_capture_mode():
            runtime.graphDestroy(graph_handle)
    except Exception:  # noqa: BLE001 - finalizers must not raise; the process stays usable
        pass


def destroy_exec(exec_handle: int) -> None:
    """``cudaGraphExecDestroy``, in relaxed capture mode; never raises (used by finalizers)."""
    try:
        with relaxed_capture_mode():
            runtime.graphExecDestroy(exec_handle)
    except Exception:  # noqa: BLE001
        pass


def upload(exec_handle: int, stream_ptr: int) -> None:
    """``cudaGraphUpload``."""
    _runtime_call(runtime.graphUpload, "cudaGraphUpload", exec_handle, stream_ptr)


_EVENT_DISABLE_TIMING = 2  # cudaEventDisableTiming
_NOT_READY = 600  # cudaErrorNotReady


def event_create() -> int:
    """A new ``cudaEvent_t`` without timing (in relaxed capture mode: another thread's
    global-mode capture must not refuse it)."""
    with relaxed_capture_mode():
        return int(_runtime_call(runtime.eventCreateWithFlags, "cudaEventCreateWithFlags",
                                 _EVENT_DISABLE_TIMING))


def event_record(event: int, stream_ptr: int) -> None:
    """``cudaEventRecord`` of ``event`` on ``stream_ptr``."""
    _runtime_call(runtime.eventRecord, "cudaEventRecord", event, stream_ptr)


def event_done(event: int) -> bool:
    """Whether the work before ``event``'s record has finished (``cudaEventQuery``)."""
    try:
        status = runtime.eventQuery(event)
    except runtime.CUDARuntimeError as exc:
        if exc.status == _NOT_READY:
            return False
        raise error_from_status(exc.status, "cudaEventQuery") from exc
    return status != _NOT_READY


def event_destroy(event: int) -> None:
    """``cudaEventDestroy``; never raises."""
    try:
        with relaxed_capture_mode():
            runtime.eventDestroy(event)
    except Exception:  # noqa: BLE001
        pass


_device_count: int | None = None


def device_count() -> int:
    """Number of devices this process sees (read once: CUDA fixes it at initialization)."""
    global _device_count
    if _device_count is None:
        _device_count = int(_runtime_call(runtime.getDeviceCount, "cudaGetDeviceCount"))
    return _device_count


def current_device() -> int:
    """The calling thread's current device (``cudaGetDevice``)."""
    return int(runtime.getDevice())


def mem_info() -> tuple[int, int]:
    """Free and total bytes of the current device."""
    free, total = _runtime_call(runtime.memGetInfo, "cudaMemGetInfo")
    return int(free), int(total)


def runtime_version() -> int:
    """The CUDA runtime's version as an integer, e.g. 13000 (raises CuPy's error without
    a usable CUDA)."""
    return int(runtime.runtimeGetVersion())


def raw_driver_version() -> int:
    """``cudaDriverGetVersion``: 0 where no driver is installed (``cugraphrt info``)."""
    return int(runtime.driverGetVersion())


def raw_device_count() -> int:
    """``cudaGetDeviceCount`` as CUDA answers it now, raising CuPy's error with CUDA's
    reason (``cugraphrt info`` reports it)."""
    return int(runtime.getDeviceCount())


def device_name(index: int) -> str:
    """The name of device ``index`` (``cudaGetDeviceProperties``)."""
    name = runtime.getDeviceProperties(index)["name"]
    return name.decode() if isinstance(name, bytes) else str(name)


def is_pinned_host(ptr: int) -> bool:
    """Whether host address ``ptr`` is page-locked (``cudaPointerGetAttributes``)."""
    try:
        return int(runtime.pointerGetAttributes(ptr).type) == runtime.memoryTypeHost
    except runtime.CUDARuntimeError:  # pageable memory, as older drivers report it
        return False


def malloc(nbytes: int) -> int:
    """``cudaMalloc`` on the current device; raises :data:`CUDARuntimeError` (the caller
    tells out-of-memory apart)."""
    return int(runtime.malloc(nbytes))


def free(ptr: int) -> None:
    """``cudaFree``."""
    runtime.free(ptr)


def copy_host_to_device(dst: int, src: int, nbytes: int, stream_ptr: int) -> None:
    """``cudaMemcpyAsync`` host to device on ``stream_ptr``. CuPy's ``ndarray.set`` refuses
    any host-to-device copy while the stream captures; from pinned memory the copy is a node
    the graph can hold, so capture code that staged its bytes in pinned memory calls this."""
    _runtime_call(runtime.memcpyAsync, "cudaMemcpyAsync", dst, src, nbytes,
                  runtime.memcpyHostToDevice, stream_ptr)


def stream_wait_event(stream_ptr: int, event: int) -> None:
    """``cudaStreamWaitEvent``: work queued on ``stream_ptr`` waits for ``event``."""
    _runtime_call(runtime.streamWaitEvent, "cudaStreamWaitEvent", stream_ptr, event)


# Re-exported for the replay path: one attribute lookup fewer per call.
graph_launch = runtime.graphLaunch
get_device = runtime.getDevice  # cudaGetDevice as one C call (current_device() adds a frame)
CUDARuntimeError = runtime.CUDARuntimeError
CUDADriverError = _cupy_driver.CUDADriverError
set_device = runtime.setDevice
