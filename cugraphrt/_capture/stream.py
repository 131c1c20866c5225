"""CuPy's capture API, by name: ``Stream.begin_capture`` / ``end_capture`` through cugraphrt.

CuPy captures with ``s.begin_capture()`` ... ``g = s.end_capture()``, then ``g.launch()``.
:class:`Stream` is a ``cupy.cuda.Stream`` whose ``begin_capture`` and ``end_capture`` go
through cugraphrt's capture, so porting such code means replacing ``cupy.cuda.Stream(...)``
by ``cugraphrt.Stream(...)``: allocations during the capture come from a graph memory pool,
cuBLAS products and FFT plans created in the capture work, errors are explained (and are
still CuPy's ``CUDARuntimeError`` / ``NotImplementedError``, see
:mod:`cugraphrt._cuda.status_errors`), and ``end_capture`` returns a :class:`StreamGraph`, a
:class:`cugraphrt.Graph` that also has CuPy's ``launch`` and ``debug_dot_str``.

Only the capture methods and ``synchronize`` are overridden: entering the stream, launching
work on it and reading the current stream are CuPy's own code, unchanged, so the subclass
costs nothing on any path that runs kernels. It relies on CuPy's public ``Stream`` interface
only (``begin_capture``/``end_capture``/``synchronize`` of the base class, ``ptr``).
"""

from __future__ import annotations

import os
import tempfile

import cupy

from cugraphrt._capture import diagnose as _diagnose
from cugraphrt._capture.graphs import Graph
from cugraphrt._cuda import runtime as _cuda
from cugraphrt._memory.pool import MemPool
from cugraphrt.errors import CugraphrtError, OptionsError

__all__ = ["Stream", "StreamGraph"]

# CuPy's capture modes are cudaStreamCaptureMode values; CuPy captures in relaxed mode by
# default, so that its memory pool may cudaMalloc during the capture.
_MODE_NAMES = {value: name for name, value in _cuda.CAPTURE_MODES.items()}


class StreamGraph(Graph):
    """The graph :meth:`Stream.end_capture` returns: a :class:`cugraphrt.Graph` (replay,
    upload, pool, stats) that also has ``cupy.cuda.Graph``'s ``launch`` and
    ``debug_dot_str``. It keeps its graph definition (``keep_graph=True``) and is instantiated
    when the capture ends, as CuPy's graphs are."""

    #: ``launch(stream=None)``: CuPy's name for :meth:`Graph.replay` (the same function).
    launch = Graph.replay

    def debug_dot_str(self, flags: int = 0) -> str:
        """The graph as Graphviz DOT text (``cudaGraphDebugDotPrint``).

        Parameters
        ----------
        flags : int, default 0
            ``cudaGraphDebugDotFlags``, e.g. ``cupy.cuda.runtime.cudaGraphDebugDotFlagsVerbose``.
        """
        with tempfile.TemporaryDirectory() as folder:
            path = os.path.join(folder, "graph.dot")
            _cuda.debug_dot_print(self.raw_graph, path, int(flags))
            with open(path) as dot:
                return dot.read()


class Stream(cupy.cuda.Stream):
    """A CuPy stream that captures through cugraphrt: ``cupy.cuda.Stream`` with CuPy's own
    constructor (``null``, ``non_blocking``, ``ptds``, ``priority``).

    Examples
    --------
    >>> s = cugraphrt.Stream(non_blocking=True)       # was: cupy.cuda.Stream(non_blocking=True)
    >>> with s:
    ...     s.begin_capture()
    ...     y = x * 2 + 1                              # y lives in the graph's pool
    ...     g = s.end_capture()                        # a cugraphrt.StreamGraph
    >>> g.launch()                                     # or g.replay()
    """

    def begin_capture(self, mode=None, *, pool: MemPool | None = None) -> None:
        """Begin capturing the work issued on this stream (``cudaStreamBeginCapture``).

        Parameters
        ----------
        mode : int or str, optional
            A ``cudaStreamCaptureMode`` (``cupy.cuda.runtime.streamCaptureModeGlobal`` /
            ``ThreadLocal`` / ``Relaxed``) or its name (``"global"``, ...). Relaxed by default,
            as in CuPy.
        pool : cugraphrt.MemPool, optional
            Pool the capture allocates from (shared with other graphs); a private one by
            default.

        Raises
        ------
        CaptureError
            On the legacy default stream, or when this stream already captures.
        """
        graph = StreamGraph(keep_graph=True)
        with self:  # the core captures CuPy's current stream
            graph._begin(pool, _mode_name(mode), start=_begin_cupy_capture)
        self._cugraphrt_graph = graph

    def end_capture(self) -> StreamGraph:
        """End the capture begun by :meth:`begin_capture`; returns its instantiated graph.

        Raises
        ------
        CaptureError
            When CUDA rejects the capture (invalidated by an illegal call, a fork not joined
            back); it is rolled back, the stream no longer captures, and the error is also
            CuPy's ``CUDARuntimeError`` with the status.
        CugraphrtError
            When this stream does not capture (``cudaErrorIllegalState``), also a
            ``CUDARuntimeError``.
        """
        graph = self.__dict__.pop("_cugraphrt_graph", None)
        if graph is None or graph._capture is None:
            return self._end_foreign_capture()
        try:
            with self:  # the core ends the capture of CuPy's current stream
                graph._end(finish=None, instantiate=False)
        except BaseException as exc:
            graph._abort_capture(exc)  # never leave the stream capturing
            raise
        graph.instantiate()
        return graph

    def _end_foreign_capture(self):
        """No capture of ours on this stream: CuPy's end (CUDA's answer), errors translated."""
        try:
            return super().end_capture()
        except _cuda.CUDARuntimeError as exc:
            if isinstance(exc, CugraphrtError):
                raise
            raise _cuda.error_from_status(exc.status, "cudaStreamEndCapture") from exc

    def synchronize(self) -> None:
        """Wait for the work queued on this stream; during a capture, an explained error.

        Raises
        ------
        CaptureError
            During a capture (``cudaErrorStreamCaptureUnsupported``, which also invalidates
            the capture); also CuPy's ``CUDARuntimeError`` with the status.
        """
        try:
            super().synchronize()
        except _cuda.CUDARuntimeError as exc:
            if isinstance(exc, CugraphrtError):
                raise
            graph = self.__dict__.get("_cugraphrt_graph")
            capture = graph._capture if graph is not None else None
            if exc.status in _cuda.CAPTURE_STATUSES:
                raise _diagnose.status_error(exc.status, exc, capture,
                                             where="Stream.synchronize()") from exc
            raise _cuda.error_from_status(exc.status, "cudaStreamSynchronize") from exc


def _begin_cupy_capture(stream, mode: str, token: object) -> None:
    # CuPy's own begin, so that CuPy knows of the capture (launch_host_func keeps its
    # callbacks, which the core hands to the graph when the capture ends).
    cupy.cuda.Stream.begin_capture(stream, _cuda.CAPTURE_MODES[mode])


def _mode_name(mode) -> str:
    if mode is None:
        return "relaxed"
    if isinstance(mode, str) and mode in _cuda.CAPTURE_MODES:
        return mode
    name = _MODE_NAMES.get(mode) if isinstance(mode, int) else None
    if name is None:
        raise OptionsError("mode", mode, "a cudaStreamCaptureMode (cupy.cuda.runtime."
                                         "streamCaptureModeGlobal, ThreadLocal or Relaxed), "
                                         "its name ('global', 'thread_local', 'relaxed') or "
                                         "None for relaxed")
    return name
