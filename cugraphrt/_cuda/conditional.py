"""Conditional graph nodes: the CUDA-level calls behind cugraphrt.while_loop and cond.

A conditional node (CUDA 12.4: IF and WHILE; 12.8: IF with an else body) holds body graphs
that the device runs, skips or repeats according to a *condition* that a kernel sets with
``cudaGraphSetConditional``. Inside a stream capture a node is added like this (NVIDIA's
graphConditionalNodes sample, PyTorch's ``CUDAGraph.begin_capture_to_if_node``):

1. ``cuStreamGetCaptureInfo`` gives the graph being captured and the stream's current
   dependencies; the node is added after them and becomes the stream's only dependency
   (``cuStreamUpdateCaptureDependencies``), so the work captured next runs after the node;
2. each body is captured with ``cuStreamBeginCaptureToGraph`` on a *body stream* of its own
   (a capture cannot be suspended, so the body cannot be recorded on the capturing stream);
   ending that capture leaves the body inside the node (the node owns it: never destroy it).

Everything goes through NVIDIA's ``cuda-bindings`` (the driver API, so the handles are the
ones CuPy's runtime uses) and through :func:`cugraphrt._cuda.runtime.error_from_status`.
"""

from __future__ import annotations

import threading

import cupy
import numpy as np

from cugraphrt._cuda import runtime as _cuda
from cugraphrt.errors import CaptureError

__all__ = ["versions", "require", "create_handles", "add_node", "begin_body", "end_body",
           "abandon_body", "set_condition", "stop_loops", "body_stream", "if_else_supported",
           "MIN_VERSION", "IF_ELSE_VERSION", "driver_api", "unpack"]

#: CUDA version (driver and runtime) with IF and WHILE conditional nodes.
MIN_VERSION = 12040
#: CUDA version whose IF node takes a second (else) body.
IF_ELSE_VERSION = 12080

# The condition kernel. One thread: a predicate is one element, and CUDA leaves racing
# cudaGraphSetConditional calls undefined. It reads the predicate's bytes (any width of bool
# or integer is nonzero exactly when one of its bytes is), keeps the loop's iteration count
# and applies max_iters, and sets an else handle to the negation when a node has no else body
# of its own. With ``stop`` (the process's stop flag in pinned host memory, see stop_loops),
# a set flag ends the loop: given to loops whose bodies hold collectives, so that a loop whose
# peers stopped can be ended. cudaGraphSetConditional is a builtin that ptxas resolves: no
# -rdc, no headers.
_SOURCE = r"""
extern "C" __device__ void cudaGraphSetConditional(unsigned long long handle,
                                                   unsigned int value);

extern "C" __global__ void cgrt_set_condition(
        unsigned long long handle, unsigned long long else_handle,
        const unsigned char* pred, int itemsize,
        long long* count, long long max_iters, int start, const volatile int* stop) {
    bool value = false;
    for (int i = 0; i < itemsize; ++i) value = value || pred[i] != 0;
    if (count != nullptr) {
        long long n = start ? 0 : count[0] + 1;
        count[0] = n;
        value = value && n < max_iters;
    }
    if (stop != nullptr && *stop != 0) value = false;
    cudaGraphSetConditional(handle, value ? 1u : 0u);
    if (else_handle != 0ull) cudaGraphSetConditional(else_handle, value ? 0u : 1u);
}
"""
_KERNEL_NAME = "cgrt_set_condition"
_kernels: dict[int, cupy.RawKernel] = {}
_lock = threading.Lock()
_NO_COUNT = 0


def driver_api():
    """``cuda.bindings.driver``, or a CaptureError that says how to install it."""
    try:
        from cuda.bindings import driver
    except ImportError as exc:
        raise CaptureError(
            f"device-side control flow needs NVIDIA's cuda-bindings package (got ImportError: "
            f"{exc}); install it with pip install cuda-bindings (or cugraphrt[cuda13])"
        ) from exc
    return driver


def _fmt(version: int) -> str:
    return f"{version // 1000}.{version % 1000 // 10}"


def versions() -> tuple[int, int]:
    """The CUDA versions of the driver and of CuPy's runtime, e.g. (13000, 13020)."""
    return _cuda.driver_version(), cupy.cuda.runtime.runtimeGetVersion()


def require(what: str) -> None:
    """Raise CaptureError unless cuda-bindings, the driver and CuPy's runtime have
    conditional nodes."""
    driver_api()
    driver_version, runtime_version = versions()
    for name, found in (("driver", driver_version), ("CUDA runtime of CuPy", runtime_version)):
        if found < MIN_VERSION:
            raise CaptureError(
                f"{what} inside a capture needs CUDA conditional graph nodes, which need CUDA "
                f"{_fmt(MIN_VERSION)} or newer (got {name} version {_fmt(found)}; driver "
                f"{_fmt(driver_version)}, runtime {_fmt(runtime_version)}); update the NVIDIA "
                f"driver (>= 550) and CuPy's CUDA (cupy-cuda12x >= 12.4 or cupy-cuda13x), or "
                f"call it outside a capture, where it runs eagerly"
            )


def if_else_supported() -> bool:
    """Whether an IF node may carry an else body (otherwise: a second IF on the negation)."""
    return min(versions()) >= IF_ELSE_VERSION


def _api():
    """The four capture calls, by their names in this cuda-bindings (13 renamed them)."""
    driver = driver_api()
    import cuda.bindings

    if int(cuda.bindings.__version__.split(".")[0]) >= 13:
        return (driver, driver.cuStreamGetCaptureInfo, driver.cuGraphAddNode,
                driver.cuStreamUpdateCaptureDependencies)
    return (driver, driver.cuStreamGetCaptureInfo_v3, driver.cuGraphAddNode_v2,
            driver.cuStreamUpdateCaptureDependencies_v2)


def unpack(result, call: str):
    """Unpack a cuda-bindings result tuple, routing its status through error_from_status."""
    status = int(result[0])
    if status != _cuda.SUCCESS:
        raise _cuda.error_from_status(status, call)
    rest = result[1:]
    return rest[0] if len(rest) == 1 else rest


def create_handles(stream_ptr: int, count: int) -> list:
    """``count`` conditional handles of the graph that ``stream_ptr`` captures into.

    The handles stay cuda-bindings objects (``add_node`` takes them as they are); ``int()``
    of one is what the condition kernel gets.
    """
    driver, get_info, _, _ = _api()
    _, _, graph, *_ = unpack(get_info(stream_ptr), "cuStreamGetCaptureInfo")
    ctx = unpack(driver.cuStreamGetCtx(stream_ptr), "cuStreamGetCtx")
    return [unpack(driver.cuGraphConditionalHandleCreate(graph, ctx, 0, 0),
                   "cuGraphConditionalHandleCreate") for _ in range(count)]


def add_node(stream_ptr: int, handle, kind: str, bodies: int) -> list:
    """Add a conditional node after the stream's captured work; returns its body graphs.

    ``kind`` is ``"while"`` or ``"if"``; ``bodies`` is 1, or 2 for an IF with an else body.
    """
    driver, get_info, add, update = _api()
    status, _, graph, deps, edges, count = unpack(get_info(stream_ptr), "cuStreamGetCaptureInfo")
    if int(status) != _cuda.STATUS_ACTIVE:
        raise CaptureError(f"the stream 0x{stream_ptr:x} is not capturing (got capture status "
                           f"{int(status)}); call this inside a cugraphrt capture")
    ctx = unpack(driver.cuStreamGetCtx(stream_ptr), "cuStreamGetCtx")
    params = driver.CUgraphNodeParams()
    params.type = driver.CUgraphNodeType.CU_GRAPH_NODE_TYPE_CONDITIONAL
    params.conditional.handle = handle
    types = driver.CUgraphConditionalNodeType
    params.conditional.type = (types.CU_GRAPH_COND_TYPE_WHILE if kind == "while"
                               else types.CU_GRAPH_COND_TYPE_IF)
    params.conditional.size = bodies
    params.conditional.ctx = ctx
    node = unpack(add(graph, deps, edges, count, params), "cuGraphAddNode")
    flags = driver.CUstreamUpdateCaptureDependencies_flags.CU_STREAM_SET_CAPTURE_DEPENDENCIES
    unpack(update(stream_ptr, [node], None, 1, flags), "cuStreamUpdateCaptureDependencies")
    # The node owns its bodies: they are destroyed with the graph, never by us.
    return [params.conditional.phGraph_out[i] for i in range(bodies)]


def begin_body(stream_ptr: int, body_graph, mode: str) -> int:
    """Begin capturing into a node's body graph on a body stream; returns the capture id."""
    driver = driver_api()
    modes = driver.CUstreamCaptureMode
    chosen = {"global": modes.CU_STREAM_CAPTURE_MODE_GLOBAL,
              "thread_local": modes.CU_STREAM_CAPTURE_MODE_THREAD_LOCAL,
              "relaxed": modes.CU_STREAM_CAPTURE_MODE_RELAXED}[mode]
    unpack(driver.cuStreamBeginCaptureToGraph(stream_ptr, body_graph, None, None, 0, chosen),
           "cuStreamBeginCaptureToGraph")
    return _cuda.capture_info(stream_ptr)[1]


def end_body(stream_ptr: int) -> None:
    """End a body's capture. The body graph belongs to its node: it is never destroyed here.

    Raises the CUDA status (a fork not joined back, an invalidated capture) as a cugraphrt
    error; the stream stops capturing either way.
    """
    driver = driver_api()
    unpack(driver.cuStreamEndCapture(stream_ptr), "cuStreamEndCapture")


def abandon_body(stream_ptr: int) -> bool:
    """End a failed body's capture, whatever state it is in; never raises.

    Returns whether the body's capture had been invalidated (a host sync, an illegal call in
    the body) rather than ended cleanly: the enclosing graph must then not be destroyed
    (see :func:`cugraphrt._capture.stream_capture.abort`).
    """
    try:
        status = _cuda.capture_info(stream_ptr)[0]
        if status == _cuda.STATUS_NONE:
            return False
        driver = driver_api()
        err = driver.cuStreamEndCapture(stream_ptr)[0]
        return status != _cuda.STATUS_ACTIVE or err != driver.CUresult.CUDA_SUCCESS
    except Exception:  # noqa: BLE001 - the enclosing capture is rolled back anyway
        return True


def set_condition(handles: tuple, pred: cupy.ndarray, count: cupy.ndarray | None,
                  max_iters: int, start: bool, stoppable: bool = False) -> None:
    """Launch the condition kernel on the current stream (captured: it runs on every replay).

    ``handles`` is (handle, else handle or None). With ``count`` (a 0-d int64 array), the
    condition is also false once ``count`` reaches ``max_iters``: ``start`` zeroes the count
    (before a loop), otherwise it is incremented (at the end of each iteration). With
    ``stoppable``, it is also false once :func:`stop_loops` was called (one read of pinned
    host memory per evaluation).
    """
    kernel = _kernel(pred.device.id)
    handle, else_handle = handles
    kernel((1,), (1,), (np.uint64(int(handle)),
                        np.uint64(0 if else_handle is None else int(else_handle)), pred,
                        np.int32(pred.itemsize),
                        count if count is not None else np.uint64(_NO_COUNT),
                        np.int64(max_iters), np.int32(1 if start else 0),
                        np.uint64(_stop_flag().ctypes.data if stoppable else 0)))


_stop: list = []  # [the pinned memory, an int32 view of it], made on first use


def _stop_flag() -> np.ndarray:
    """The process's stop flag: one int32 in pinned host memory, which every device reads
    through unified addressing (the host pointer is the device pointer)."""
    if not _stop:
        with _lock, _cuda.relaxed_capture_mode():  # made inside a capture, on first use
            if not _stop:
                memory = cupy.cuda.alloc_pinned_memory(4)
                flag = np.frombuffer(memory, dtype=np.int32, count=1)
                flag[0] = 0
                _stop.extend((memory, flag))
    return _stop[1]


def stop_loops(stop: bool = True) -> None:
    """End every stoppable loop at its next condition (``stop=False`` lets them run again).

    The collective watchdog calls it when it aborts a communicator: a loop whose body holds
    collectives would otherwise run on forever on a rank whose peers stopped.
    """
    if _stop:  # made with the first stoppable loop: before it, no loop reads it
        _stop[1][0] = 1 if stop else 0


def _kernel(device_id: int) -> cupy.RawKernel:
    kernel = _kernels.get(device_id)
    if kernel is None:
        with _lock:
            kernel = _kernels.get(device_id)
            if kernel is None:
                kernel = cupy.RawKernel(_SOURCE, _KERNEL_NAME)
                # Compiled and loaded now, even when the first use is inside a capture: in
                # relaxed mode, so that loading the module is no unsafe call to a
                # global-mode capture.
                with _cuda.relaxed_capture_mode():
                    kernel.compile()
                _kernels[device_id] = kernel
    return kernel


class _BodyStreams(threading.local):
    def __init__(self) -> None:
        self.by_key: dict[tuple[int, int], cupy.cuda.Stream] = {}


_body_streams = _BodyStreams()


def body_stream(device_id: int, depth: int) -> cupy.cuda.Stream:
    """This thread's stream for capturing bodies at nesting ``depth`` (created once).

    Bodies never run on these streams (they are only captured on), so one per depth is
    enough; a nested body needs its own because its parent's body is still capturing.
    """
    key = (device_id, depth)
    stream = _body_streams.by_key.get(key)
    if stream is None:
        # Created while a capture is underway: relaxed, so that no global-mode capture can
        # take the creation for an unsafe call.
        with _cuda.relaxed_capture_mode():
            stream = _body_streams.by_key[key] = cupy.cuda.Stream(non_blocking=True)
    return stream
