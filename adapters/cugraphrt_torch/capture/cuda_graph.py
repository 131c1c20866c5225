"""cugraphrt_torch.CUDAGraph: ``torch.cuda.CUDAGraph``'s interface over cugraphrt's pools.

Code written for ``torch.cuda.CUDAGraph`` begins a capture on torch's current stream
(``g.capture_begin()`` inside ``with torch.cuda.stream(s):``), ends it there, replays on
torch's current stream and passes ``g.pool()`` or ``graph_pool_handle()`` between captures.
:class:`CUDAGraph` is a :class:`cugraphrt.Graph` with that interface, so replacing
``torch.cuda.CUDAGraph`` (and ``graph``, ``make_graphed_callables``, ``graph_pool_handle``,
``is_current_stream_capturing``) by the ``cugraphrt_torch`` names is the whole migration.

It is built on the capture of :class:`cugraphrt_torch.graph` (one ``_TorchCapture``: torch's own
``CUDAGraph(keep_graph=True)`` owns the CUDA capture, so its RNG and allocator know of it;
torch's memory comes from the cugraphrt pool). ``capture_begin`` makes torch's current
stream CuPy's current stream too, so CuPy work between begin and end is captured and
allocates from the same pool; ``capture_end`` restores it. Replay is torch's replay on torch's
current stream (which also advances the RNG offsets), with no other work per call.

``pool`` arguments and ``pool()`` are :class:`cugraphrt.MemPool` objects, not torch's pool
ids: a pool from ``cugraphrt_torch.graph_pool_handle()`` or ``Graph.pool()`` serves CuPy and
torch graphs alike, and reports its statistics (``pool.stats()``).
"""

from __future__ import annotations

import contextlib
import warnings
import weakref
from collections.abc import Callable
from typing import cast

from cugraphrt import Graph, MemPool
from cugraphrt import adapter as core
from cugraphrt import graph_pool_handle as _core_graph_pool_handle
from cugraphrt.adapter import cuda as _cuda
from cugraphrt.errors import CaptureError, OptionsError, ReplayError
from cugraphrt.options import CaptureOptions, validate_options

from . import _torch
from ._adopted import Replay
from .capture import _TorchCapture

__all__ = ["CUDAGraph", "graph_pool_handle", "is_current_stream_capturing"]


def graph_pool_handle() -> MemPool:
    """A new graph memory pool to share between captures (``torch.cuda.graph_pool_handle``).

    Returns
    -------
    cugraphrt.MemPool
        Pass it as ``pool=`` to :meth:`CUDAGraph.capture_begin`, :class:`cugraphrt_torch.graph`
        or :func:`cugraphrt_torch.make_graphed_callables`, and to CuPy captures
        (:func:`cugraphrt.graph`) too.
    """
    return _core_graph_pool_handle()


def is_current_stream_capturing() -> bool:
    """Whether torch's current CUDA stream is capturing (as ``torch.cuda``'s function).

    True during a capture by :class:`CUDAGraph`, :class:`cugraphrt_torch.graph` or any other
    capture on that stream; False without a CUDA context, which it does not create, and
    without CUDA at all.
    """
    import torch

    if not torch.cuda.is_available():
        return False
    return bool(torch.cuda.is_current_stream_capturing())


class _FirstReplay:
    """The first replay of a kept graph: instantiate, then replay through torch from then on.

    Weak on the graph, so that ``del g`` frees it at once (a bound method would make a cycle).
    """

    __slots__ = ("graph",)

    def __init__(self, graph: CUDAGraph) -> None:
        self.graph = weakref.ref(graph)

    def __call__(self) -> None:
        graph = self.graph()
        if graph is not None:
            graph._first_replay()


def _replay_before_capture() -> None:
    raise ReplayError("replay() before a successful capture or after reset() (got an empty "
                      "CUDAGraph): Called CUDAGraph::replay without a preceding successful "
                      "capture; capture work into it first")


class CUDAGraph(Graph):
    """``torch.cuda.CUDAGraph`` over cugraphrt's pools (a :class:`cugraphrt.Graph`).

    Parameters
    ----------
    keep_graph : bool, default False
        As in torch: False instantiates the graph at :meth:`capture_end`; True keeps the
        ``cudaGraph_t`` (:meth:`raw_cuda_graph`) and instantiates at :meth:`instantiate` or the
        first :meth:`replay`.

    Examples
    --------
    >>> g = cugraphrt_torch.CUDAGraph()              # was: torch.cuda.CUDAGraph()
    >>> s = torch.cuda.Stream()
    >>> with torch.cuda.stream(s):
    ...     g.capture_begin()
    ...     y = model(static_x)
    ...     g.capture_end()
    >>> static_x.copy_(batch); g.replay()            # on torch's current stream

    .. seealso:: ``torch.cuda.CUDAGraph``, :class:`cugraphrt_torch.graph`
    """

    def __init__(self, keep_graph: bool = False) -> None:
        super().__init__(keep_graph=keep_graph)
        self._session: _TorchCapture | None = None
        self._streams: contextlib.ExitStack | None = None
        self._torch_replay: Replay | None = None
        self._replay_fn: Callable[[], None] = _replay_before_capture
        self._debug_mode = False
        self._generator_states: list = []  # read by _TorchCapture for each capture

    # -- capture ---------------------------------------------------------------------------

    def capture_begin(self, pool: MemPool | None = None,
                      capture_error_mode: str = "global") -> None:
        """Begin capturing the work issued on torch's current stream.

        Parameters
        ----------
        pool : cugraphrt.MemPool, optional
            A pool shared with other graphs (:func:`graph_pool_handle`, another graph's
            :meth:`pool`); a new private pool by default.
        capture_error_mode : {"global", "thread_local", "relaxed"}
            The ``cudaStreamCaptureMode``, as in torch.

        Raises
        ------
        CaptureError
            On the default stream ("CUDA graphs must be captured on a non-default stream."),
            during another capture of this graph, or when it holds a graph (call :meth:`reset`).
        OptionsError
            For a torch pool id instead of a :class:`cugraphrt.MemPool`, or a bad mode.
        """
        validate_options(CaptureOptions, capture_error_mode=capture_error_mode)
        if pool is not None and not isinstance(pool, MemPool):
            raise OptionsError("pool", pool, "a cugraphrt.MemPool (cugraphrt_torch."
                                             "graph_pool_handle() or CUDAGraph.pool()) or None; "
                                             "torch.cuda.graph_pool_handle() ids are torch's")
        _torch.require_cuda("cugraphrt_torch.CUDAGraph.capture_begin()")
        import torch

        device = torch.cuda.current_device()
        torch_stream = torch.cuda.current_stream(device)
        streams = contextlib.ExitStack()
        # CuPy's current stream becomes the capture stream too (the core captures it, and
        # CuPy work in the capture lands there); capture_end restores it.
        streams.enter_context(_torch.cupy_stream_for(int(torch_stream.cuda_stream), device))
        try:
            self._session = _TorchCapture.begin(self, pool, capture_error_mode, torch_stream,
                                                device)
        except BaseException:
            streams.close()
            raise
        self._streams = streams

    def capture_end(self) -> None:
        """End the capture on torch's current stream (the one it began on).

        Warns "The CUDA Graph is empty" when nothing was captured.

        Raises
        ------
        CaptureError
            Without a capture begun by :meth:`capture_begin`; on another stream than the
            capture's (the capture stays underway); when CUDA rejects the capture, which is
            then rolled back.
        """
        session = self._session
        if session is None:
            raise CaptureError("capture_end() without a capture underway (got no "
                               "capture_begin() on this CUDAGraph); call capture_begin() first")
        current = _torch.current_torch_stream_ptr(session.device)
        if current != session.stream_ptr:
            raise CaptureError(
                f"Capture must end on the same stream it began on. (began on stream "
                f"0x{session.stream_ptr:x}, got torch's current stream 0x{current:x}) Make "
                f"the capture stream current again (with torch.cuda.stream(s): ...) first")
        self._session = None
        try:
            session.end()
        finally:
            self._close_streams()

    def _adopted(self, replay, exec_handle: int) -> None:
        # Called by the capture once the core adopted torch's graph. Torch's replay stays
        # this CUDAGraph's replay path (on torch's current stream) besides the route; a kept
        # graph is instantiated by its first replay.
        self._torch_replay = replay
        if replay is None:
            self._replay_fn = _replay_before_capture
        else:
            self._replay_fn = replay.on_torch_stream if exec_handle else _FirstReplay(self)

    # -- replay ----------------------------------------------------------------------------

    def replay(self, stream=None) -> None:
        """Replay the graph on torch's current stream (or on ``stream``).

        Parameters
        ----------
        stream : torch.cuda.Stream or cupy.cuda.Stream, optional
            Not in torch's signature: the stream to replay on; torch's current stream by
            default (a plain :class:`cugraphrt.Graph` defaults to CuPy's).

        Raises
        ------
        ReplayError
            Before a successful capture or after :meth:`reset`.
        """
        if stream is None:
            self._replay_fn()
            return
        core.ready_exec(self, "replay()")
        cast(Replay, self._torch_replay)(stream)  # set by _adopt with the executable

    def _first_replay(self) -> None:
        core.ready_exec(self, "replay()")  # instantiates the kept graph through torch
        replay = cast(Replay, self._torch_replay)
        self._replay_fn = replay.on_torch_stream
        replay.on_torch_stream()

    def instantiate(self) -> None:
        """(Re-)instantiate the kept graph, as torch does; needs ``keep_graph=True``.

        Raises
        ------
        CaptureError
            With ``keep_graph=False`` ("instantiate() is intended to be called by the user
            only when keep_graph=true"), or before :meth:`capture_end`.
        """
        if not self.keep_graph:
            raise CaptureError(
                "instantiate() is intended to be called by the user only when keep_graph=true "
                "(got CUDAGraph(keep_graph=False), instantiated at capture_end()); create the "
                "graph with keep_graph=True to instantiate it yourself")
        if not self.is_captured:
            raise CaptureError("capture_end() must have been called before calling instantiate "
                               "(got no captured graph); capture first")
        super().instantiate()
        if self._torch_replay is not None:
            self._replay_fn = self._torch_replay.on_torch_stream

    # -- lifetime --------------------------------------------------------------------------

    def reset(self) -> None:
        """Free the graph (and roll back a capture underway); the CUDAGraph can capture again.

        As in torch, generator states registered with :meth:`register_generator_state` are
        forgotten too.
        """
        session, self._session = self._session, None
        if session is not None:
            session.abort(CaptureError("capture reset"))  # rolls torch's capture back too
        self._close_streams()
        super().reset()
        self._torch_replay = None
        self._replay_fn = _replay_before_capture
        self._generator_states = []

    def _close_streams(self) -> None:
        streams, self._streams = self._streams, None
        if streams is not None:
            streams.close()

    def register_generator_state(self, state) -> None:
        """Let a torch generator state (``generator.graphsafe_get_state()`` or
        ``clone_state()``) advance on every replay, as ``torch.cuda.CUDAGraph`` does; call it
        before :meth:`capture_begin`."""
        self._generator_states.append(state)

    # -- introspection ---------------------------------------------------------------------

    def enable_debug_mode(self) -> None:
        """Let :meth:`debug_dump` write the graph without ``keep_graph=True``."""
        self._debug_mode = True

    def debug_dump(self, debug_path) -> None:
        """Write the graph as Graphviz DOT (``cudaGraphDebugDotPrint``, verbose).

        Without :meth:`enable_debug_mode` or ``keep_graph=True`` it only warns, as torch does.

        Raises
        ------
        CaptureError
            Before :meth:`capture_end`.
        """
        if not (self._debug_mode or self.keep_graph):
            warnings.warn("CUDA Graphs debug not enabled, set with [graph].enable_debug_mode() "
                          "(got debug_dump() without it); call enable_debug_mode() first",
                          UserWarning, stacklevel=2)
            return
        handle = core.graph_handles(self).graph
        if not handle:
            raise CaptureError("debug_dump() before capture_end() (got no captured graph); "
                               "capture first")
        _cuda.debug_dot_print(handle, str(debug_path))

    def raw_cuda_graph(self) -> int:
        """The ``cudaGraph_t`` as an int; needs ``keep_graph=True`` (as in torch).

        Raises
        ------
        CaptureError
            With ``keep_graph=False`` or before :meth:`capture_end`.
        """
        if not self.keep_graph:
            raise CaptureError(
                "You cannot access the raw cudaGraph_t instance unless CUDAGraph was "
                "initialized with keep_graph=true (got keep_graph=False); create it with "
                "CUDAGraph(keep_graph=True)")
        if not core.graph_handles(self).graph:
            raise CaptureError("You cannot access the raw cudaGraph_t instance until "
                               "capture_end() has been called (got no captured graph)")
        return core.graph_handles(self).graph

    def raw_cuda_graph_exec(self) -> int:
        """The ``cudaGraphExec_t`` as an int (after :meth:`instantiate` when ``keep_graph``).

        Raises
        ------
        CaptureError
            Before the graph was instantiated (``keep_graph=True`` without :meth:`instantiate`
            or a replay), or before :meth:`capture_end`.
        """
        exec_handle = core.graph_handles(self).exec
        if not exec_handle:
            raise CaptureError(
                "You cannot access the raw cudaGraphExec_t instance until instantiate() has "
                "been called (got a graph not instantiated yet); call instantiate() or "
                "replay() first")
        return exec_handle
