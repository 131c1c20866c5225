"""``with cugraphrt.graph(g):``: capture the work of a block on a side stream.

The block form of :meth:`Graph.capture_begin` / :meth:`Graph.capture_end`: it makes a
per-thread side stream current (captures cannot run on the legacy default stream), and on an
exception rolls the capture back and explains it.
"""

from __future__ import annotations

import threading
from typing import Literal

import cupy

from cugraphrt._capture import diagnose as _diagnose
from cugraphrt._capture.graphs import Graph
from cugraphrt._cuda import runtime as _cuda
from cugraphrt._cuda.devices import check_capture_stream
from cugraphrt._memory.pool import MemPool
from cugraphrt.errors import OptionsError
from cugraphrt.options import CaptureOptions, validate_options

__all__ = ["graph", "default_capture_stream"]


_capture_streams = threading.local()


def default_capture_stream() -> cupy.cuda.Stream:
    """This thread's side stream for captures on the current device (created once)."""
    device = _cuda.get_device()
    streams = getattr(_capture_streams, "by_device", None)
    if streams is None:
        streams = _capture_streams.by_device = {}
    stream = streams.get(device)
    if stream is None:
        stream = streams[device] = cupy.cuda.Stream(non_blocking=True)
    return stream


class graph:
    """Context manager that captures the work of its block into a :class:`Graph`.

    On entry it makes a side stream CuPy's current stream (a per-thread default capture
    stream unless ``stream`` is given) and begins capture; it does not synchronize (see
    docs/reliability.md: a device-wide synchronization would break other threads' captures,
    and nothing runs during a capture anyway). On a
    normal exit it ends the capture. If the block raises, it ends the capture, discards the
    graph, releases what the capture allocated, restores the stream and re-raises: an error
    caused by an operation capture forbids comes out as :class:`CaptureError` chained from
    the original, anything else unchanged.

    Parameters
    ----------
    cuda_graph : Graph
        The graph to capture into.
    pool : MemPool, optional
        Pool to allocate from (see :meth:`Graph.capture_begin`).
    stream : cupy.cuda.Stream, optional
        Capture stream; a non-default stream.
    capture_error_mode : {"global", "thread_local", "relaxed"}
        See :class:`cugraphrt.options.CaptureOptions`.
    """

    def __init__(self, cuda_graph: Graph, pool: MemPool | None = None, stream=None,
                 capture_error_mode: str = "global") -> None:
        if not isinstance(cuda_graph, Graph):
            raise OptionsError("cuda_graph", cuda_graph, "a cugraphrt.Graph")
        validate_options(CaptureOptions, capture_error_mode=capture_error_mode)
        if stream is not None and not hasattr(stream, "ptr"):
            raise OptionsError("stream", stream, "a cupy.cuda.Stream or None")
        self.cuda_graph = cuda_graph
        self.pool = pool
        self.capture_error_mode = capture_error_mode
        self.capture_stream = stream if stream is not None else default_capture_stream()

    def __enter__(self) -> graph:
        check_capture_stream(self.capture_stream, _cuda.get_device())
        # No device synchronization here: nothing runs during a capture, and replays are
        # ordered by the stream they are launched on. A device-wide sync would invalidate the
        # captures of every other thread (whatever their mode).
        self.capture_stream.__enter__()
        try:
            self.cuda_graph.capture_begin(pool=self.pool,
                                          capture_error_mode=self.capture_error_mode)
        except BaseException:
            self.capture_stream.__exit__(None, None, None)
            raise
        return self

    def __exit__(self, exc_type, exc, tb) -> Literal[False]:
        capture = self.cuda_graph._capture  # for the error's context, before it is dropped
        try:
            if exc is None:
                try:
                    self.cuda_graph.capture_end()
                except BaseException:
                    self.cuda_graph._abort_capture()  # never leave a capture underway
                    raise
                return False
            self.cuda_graph._abort_capture(exc)
        finally:
            self.capture_stream.__exit__(None, None, None)
        translated = _diagnose.capture_error_from(exc, capture)
        if translated is not None and translated is not exc:
            raise translated from exc
        return False
