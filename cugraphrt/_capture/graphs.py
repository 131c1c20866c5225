"""Graph: capture CuPy work once, replay it with one launch.

The ``with cugraphrt.graph(g):`` block that drives a capture on a side stream lives in
:mod:`cugraphrt._capture.graph_context`.
"""

from __future__ import annotations

import warnings
import weakref
from collections.abc import Callable
from typing import Any, cast

import cupy

from cugraphrt._capture import launcher as _launcher
from cugraphrt._capture import stream_capture as _capture
from cugraphrt._capture.graph_handles import GraphHandles as _GraphHandles
from cugraphrt._capture.launcher import Launcher
from cugraphrt._cuda import runtime as _cuda
from cugraphrt._cuda.devices import stream_ptr
from cugraphrt._flags import FLAGS
from cugraphrt._memory.backing import _on_device
from cugraphrt._memory.pool import MemPool
from cugraphrt.errors import CaptureError, OptionsError, ReplayError
from cugraphrt.options import CaptureOptions, validate_options

__all__ = ["Graph"]

_current_stream = cupy.cuda.get_current_stream
_launch = _cuda.graph_launch
_get_device = _cuda.get_device
_flags = FLAGS  # the switches every replay reads (cugraphrt._flags)


class _Hooks:
    """What the floors above plug into every capture (a lower floor never imports a higher
    one): ``prepare_capture()`` before a capture begins (the libraries' handles and
    patches, :mod:`cugraphrt._libraries.capture_setup`), and ``arm_collectives(graph, log)``
    when a capture that recorded collectives ends (:mod:`cugraphrt.distributed.replay`).
    ``cugraphrt/__init__.py`` installs both before anything can capture."""

    __slots__ = ("prepare_capture", "arm_collectives")

    def __init__(self) -> None:
        self.prepare_capture: Callable[[], None] | None = None
        self.arm_collectives: Callable[[Graph, Any], None] | None = None


hooks = _Hooks()


def _note_devices() -> None:
    """After a capture: note whether this process sees several devices."""
    if not _flags.multi_device and _cuda.device_count() > 1:
        _flags.set(multi_device=True)


class Graph:
    """A CUDA graph captured from CuPy work.

    Parameters
    ----------
    keep_graph : bool, default False
        Keep the graph definition after capture: needed by :meth:`instantiate`,
        :meth:`debug_dump` and :attr:`raw_graph`. Without it the graph is instantiated at
        :meth:`capture_end` and its definition freed.

    Examples
    --------
    >>> g = cugraphrt.Graph()
    >>> with cugraphrt.graph(g):
    ...     y = x * 2 + 1
    >>> x[...] = new_values     # update the static input in place
    >>> g.replay()              # y now holds new_values * 2 + 1

    .. seealso:: ``cudaStreamBeginCapture``, ``cudaGraphInstantiateWithFlags``,
       ``cudaGraphLaunch``
    """

    def __init__(self, keep_graph: bool = False) -> None:
        self._keep_graph = bool(keep_graph)
        self._handles = _GraphHandles()
        self._finalizer = weakref.finalize(self, _GraphHandles.release, self._handles)
        self._capture: _capture.Capture | None = None
        self._pool: MemPool | None = None
        self._captured = False
        # The executable replay() launches itself: _handles.exec, or None while there is none
        # or while a route replays instead (the launch then fails fast into the checked path).
        self._exec: int | None = None
        self._route: Callable[..., None] | None = None
        self._orphan_guard: weakref.finalize | None = None
        self._device = -1  # the device of the capture; -1 before the first one
        self._bodies: tuple = ()

    # -- capture ---------------------------------------------------------------------------

    def capture_begin(self, pool: MemPool | None = None,
                      capture_error_mode: str = "global") -> None:
        """Begin capturing the work issued on CuPy's current stream.

        Parameters
        ----------
        pool : MemPool, optional
            Pool the capture allocates from; a new private pool if omitted. Share a pool
            between graphs that always replay in capture order.
        capture_error_mode : {"global", "thread_local", "relaxed"}
            See :class:`cugraphrt.options.CaptureOptions`.

        Raises
        ------
        CaptureError
            On the legacy default stream, for a nested capture, or if this Graph already
            holds a graph (call :meth:`reset` first).
        OptionsError
            For a bad ``pool`` or ``capture_error_mode``.
        """
        options = validate_options(CaptureOptions, capture_error_mode=capture_error_mode)
        self._begin(pool, options.capture_error_mode, start=None)

    def _begin(self, pool, mode: str, start) -> _capture.Capture:
        """Begin a capture; ``start`` lets an adapter perform the CUDA-level begin."""
        if self._capture is not None:
            raise CaptureError(
                "this Graph is already capturing (got a second capture_begin()); call "
                "capture_end() first"
            )
        if self._captured:
            raise CaptureError(
                "this Graph already holds a captured graph (got capture_begin() again); "
                "call reset() first, or create a new Graph"
            )
        chosen = _resolve_pool(pool)
        capture = _capture.begin(chosen, mode, prepare=hooks.prepare_capture, start=start)
        self._capture = capture
        self._pool = chosen
        self._device = capture.device_id
        _note_devices()
        # A Graph dropped in the middle of its capture (capture_begin() without a matching
        # capture_end()) must not leave the stream capturing and the pool reserved forever.
        orphan_guard = weakref.finalize(self, _capture.abort, capture, CaptureError(
            "the Graph was garbage-collected during its capture (got no capture_end()); the "
            "capture was rolled back: keep a reference to the Graph until capture_end()"))
        orphan_guard.atexit = False
        self._orphan_guard = orphan_guard
        return capture

    def capture_end(self) -> None:
        """End the capture and instantiate the graph (unless ``keep_graph=True``).

        Warns with a UserWarning when nothing was captured.

        Raises
        ------
        CaptureError
            Without a capture underway, when the current stream is not the capture stream,
            or when CUDA rejects the capture (a fork not joined back, an earlier illegal
            call); in the last case the capture is rolled back.
        """
        self._end(finish=None, instantiate=True)

    def _end(self, finish, instantiate: bool) -> int:
        """End the capture; ``finish`` lets an adapter perform the CUDA-level end.

        Returns the raw graph handle (0 once destroyed, when the definition is not kept).
        """
        capture = self._capture
        if capture is None:
            raise CaptureError(
                "capture_end() without a capture underway (got no capture_begin() on this "
                "Graph); call capture_begin() first"
            )
        try:
            handle, seq = _capture.end(capture, finish)
        except CaptureError:
            if capture.aborted_by is not None:
                self._capture = None
                self._pool = None
                self._drop_orphan_guard()
            raise
        self._capture = None
        self._drop_orphan_guard()
        handles = self._handles
        handles.pool, handles.seq, handles.keepalive = capture.pool, seq, capture.keepalive
        handles.graph = handle
        self._bodies = tuple(capture.bodies)
        self._captured = True
        if _cuda.graph_node_count(handle) == 0:
            # "The CUDA Graph is empty" is PyTorch's wording, which code and tests match on.
            warnings.warn(
                "The CUDA Graph is empty: nothing was captured (got 0 nodes). Work was probably "
                "issued on another stream (an explicit `with stream:` inside the captured "
                "region, or the legacy default stream) or on another device; issue it on the "
                "capture stream",
                UserWarning,
                stacklevel=3,
            )
        if instantiate and not self._keep_graph:
            self._instantiate()
            _cuda.destroy_graph(handle)
            handles.graph = 0
        if capture.collectives is not None and finish is None:  # adapters arm their own
            arm = hooks.arm_collectives
            assert arm is not None  # installed by cugraphrt/__init__.py
            arm(self, capture.collectives)
        return handles.graph

    def _adopt(self, owner: object, graph_handle: int, exec_handle: int, replay=None,
               instantiate: Callable[[], int] | None = None) -> None:
        """Adapter hook: the graph and executable belong to ``owner``, which frees them.

        Used by the PyTorch adapter, whose ``torch.cuda.CUDAGraph`` owns the handles; the
        Graph keeps ``owner`` alive until :meth:`reset`. ``replay``, if given, becomes this
        Graph's route (see :meth:`_set_route`): PyTorch's replay also advances its RNG
        offsets. ``instantiate``
        (re-)instantiates through the owner, returning the executable (``exec_handle`` 0).
        """
        handles = self._handles
        handles.owned = False
        handles.instantiate = instantiate
        handles.graph, handles.exec = graph_handle, exec_handle
        handles.keepalive.append(owner)
        self._set_route(replay)

    def _set_route(self, route: Callable[..., None] | None) -> None:
        """Replay through ``route(stream=None)`` instead of launching the executable (None:
        launch it). Used by adapters and by graphs holding collectives.

        ``route`` must not reference this Graph (a weak reference at most): ``g.replay`` is
        always the bound method, which holds the Graph, and the Graph holds the route, so a
        strong reference back would make a cycle that only the garbage collector frees.
        """
        self._route = route
        self._refresh_exec()

    def _refresh_exec(self) -> None:
        """``_exec`` follows the executable; None while a route replays instead."""
        self._exec = (self._handles.exec or None) if self._route is None else None

    def _drop_orphan_guard(self) -> None:
        guard, self._orphan_guard = self._orphan_guard, None
        if guard is not None:
            guard.detach()

    def _abort_capture(self, error: BaseException | None = None) -> None:
        capture, self._capture = self._capture, None
        if capture is not None:
            self._drop_orphan_guard()
            _capture.abort(capture, error)
        self._pool = None

    # -- replay ----------------------------------------------------------------------------

    def replay(self, stream=None) -> None:
        """Launch the graph.

        The graph runs on the device it was captured on, whatever device is current: with
        another device current, the launch switches to the graph's device and back (as
        ``torch.cuda.CUDAGraph.replay`` does), and ``stream=None`` means CuPy's current
        stream *of the graph's device*. For a hot loop, :meth:`launcher` costs less.

        Parameters
        ----------
        stream : cupy.cuda.Stream or int, optional
            A stream of the graph's device (or a raw handle); CuPy's current stream by
            default.

        Raises
        ------
        ReplayError
            Before a successful capture or after :meth:`reset`, and for a stream of another
            device.
        """
        try:
            if _flags.plain:  # one device, no pool checks: nothing to decide
                # The one device is the graph's. Naming it spares the cudaGetDevice that
                # CuPy's lookup of the current device's stream makes (docs/performance.md).
                _launch(self._exec,
                        (_current_stream(self._device) if stream is None else stream).ptr)
                return
            if not _flags.pool_checks:  # several devices: launch here only on the graph's own
                # One device query, then CuPy's current stream of the graph's device by
                # number (docs/performance.md, "What remains on the replay path").
                if stream is None:
                    if _get_device() == self._device:
                        _launch(self._exec, _current_stream(self._device).ptr)
                        return
                else:  # an explicit stream says its own device, not which one is current
                    owner = stream.device_id
                    if (owner == self._device or owner < 0) and _get_device() == self._device:
                        _launch(self._exec, stream.ptr)
                        return
        except (TypeError, AttributeError):
            pass  # no executable to launch here (a route, none yet) or an int handle
        except _cuda.CUDARuntimeError as exc:
            raise _cuda.error_from_status(exc.status, "cudaGraphLaunch") from exc
        self._replay_checked(stream)

    def _replay_checked(self, stream) -> None:
        """Replay through the route, or launch with every check: the device switch, the
        stream's device, pool order."""
        route = self._route
        if route is not None:
            route(stream)
            return
        self._launch_own(stream)

    def _launch_own(self, stream) -> None:
        """Launch this Graph's executable with every check, whatever the route."""
        exec_handle = self._ready_exec("replay()")
        device = self._device
        if _flags.multi_device and _cuda.current_device() != device:
            with _on_device(device):
                self._launch_checked(exec_handle, stream, device)
        else:
            self._launch_checked(exec_handle, stream, device)

    def _launch_checked(self, exec_handle: int, stream, device: int) -> None:
        ptr = stream_ptr(stream, device)
        try:
            if not _flags.pool_checks:
                _launch(exec_handle, ptr)
                return
            handles = self._handles
            pool = cast(MemPool, handles.pool)  # the checked replay is chosen only with a pool
            pool._check_replay(handles.seq, ptr)
            _launch(exec_handle, ptr)
            pool._note_replay(handles.seq, ptr)
        except _cuda.CUDARuntimeError as exc:
            raise _cuda.error_from_status(exc.status, "cudaGraphLaunch") from exc

    def launcher(self, stream=None) -> Launcher:
        """The graph's launch on one stream as a C-level callable, for hot loops.

        ``launch = g.launcher(); launch()`` does what ``g.replay()`` does at the cost of
        CuPy's own ``Graph.launch``: the call runs no Python frame and checks nothing. The
        stream is fixed now (``None``: CuPy's current stream of the graph's device, as it
        is now); there is no device switch (call it with the graph's device current); CUDA
        failures raise CuPy's ``CUDARuntimeError``. The launcher holds this Graph, follows
        the executable of a new :meth:`instantiate`, and raises ReplayError after
        :meth:`reset`. See :class:`cugraphrt.Launcher` for the whole contract.

        Parameters
        ----------
        stream : cupy.cuda.Stream or int, optional
            A stream of the graph's device (or a raw handle).

        Returns
        -------
        Launcher
            Call it with no argument.

        Raises
        ------
        ReplayError
            Before a successful capture or after :meth:`reset`, for a stream of another
            device, and for a graph captured by ``cugraphrt_torch`` (torch's ``CUDAGraph``
            owns its executable, and its replay also advances torch's RNG offsets, which a
            bare launch would skip: use :meth:`replay`).
        """
        return _launcher.for_graph(self, stream)

    def _ready_exec(self, what: str) -> int:
        if self._capture is not None:
            raise ReplayError(f"{what} during capture (got a capture underway); call "
                              f"capture_end() first")
        if not self._captured:
            raise ReplayError(
                f"{what} before a successful capture or after reset() (got an empty Graph); "
                f"capture work into it first"
            )
        if not self._handles.exec:
            self._instantiate()
        return self._handles.exec

    def upload(self, stream=None) -> None:
        """Upload the executable graph to the device ahead of the first replay.

        Parameters
        ----------
        stream : cupy.cuda.Stream, optional
            CuPy's current stream by default.
        """
        _cuda.upload(self._ready_exec("upload()"), stream_ptr(stream))

    def instantiate(self) -> None:
        """(Re-)instantiate the kept graph definition; needs ``keep_graph=True``.

        Raises
        ------
        CaptureError
            Without ``keep_graph=True`` or before :meth:`capture_end`.
        """
        if not self._keep_graph:
            raise CaptureError(
                "instantiate() needs Graph(keep_graph=True) (got keep_graph=False: the graph "
                "was instantiated at capture_end() and its definition freed)"
            )
        if not self._captured:
            raise CaptureError("instantiate() before capture_end() (got no captured graph)")
        self._instantiate()

    def _instantiate(self) -> None:
        handles = self._handles
        if not handles.owned and handles.instantiate is not None:
            handles.exec = handles.instantiate()  # the owner frees the old one
            self._refresh_exec()
            return
        if not handles.owned:
            raise CaptureError(
                "this graph's executable belongs to an adapter (got a torch-captured graph); "
                "it is instantiated once by the adapter and cannot be re-instantiated"
            )
        if handles.exec:
            handles.suspend_launchers()  # before the executable goes
            _cuda.destroy_exec(handles.exec)
            handles.exec = 0
            self._exec = None
        with _on_device(self._device):  # the executable belongs to the graph's context
            handles.exec = _cuda.instantiate(handles.graph)
        self._refresh_exec()
        _launcher.arm_all(handles.launchers)

    # -- lifetime --------------------------------------------------------------------------

    def reset(self) -> None:
        """Free the graph and its hold on the pool; the Graph can capture again.

        During a capture, this ends the capture and rolls its allocations back.
        """
        if self._capture is not None:
            self._abort_capture(CaptureError("capture reset"))
        self._handles.release("reset")
        self._captured = False
        self._set_route(None)  # the executable is gone: _exec becomes None too
        self._pool = None

    @property
    def keep_graph(self) -> bool:
        """Whether the graph definition is kept after capture (``Graph(keep_graph=True)``)."""
        return self._keep_graph

    @property
    def device_id(self) -> int | None:
        """The device the graph was captured on (None before the first capture)."""
        return self._device if self._device >= 0 else None

    def pool(self) -> MemPool | None:
        """The pool this Graph's capture allocated from (None before capture_begin()).

        Pass it as ``pool=`` to later captures to share the memory.
        """
        return self._pool if self._pool is not None else self._handles.pool

    # -- introspection ---------------------------------------------------------------------

    def debug_dump(self, path) -> None:
        """Write the graph as Graphviz DOT (``cudaGraphDebugDotPrint``, verbose).

        Parameters
        ----------
        path : str or os.PathLike
            Output file.

        Raises
        ------
        CaptureError
            Without ``keep_graph=True`` or before :meth:`capture_end`.
        """
        _cuda.debug_dot_print(self.raw_graph, str(path))

    @property
    def body_nodes(self) -> tuple:
        """What each loop or branch body of the latest capture holds, in capture order: a
        tuple of ``BodyNodes(label, kinds, taken_out)`` (the body, its node kinds sorted, and
        how many event nodes of collectives were taken out of it; see docs/distributed.md)."""
        return self._bodies

    @property
    def raw_graph(self) -> int:
        """The ``cudaGraph_t`` handle as an int; needs ``keep_graph=True``."""
        if not self._keep_graph:
            raise CaptureError(
                "the graph definition is only kept with Graph(keep_graph=True) (got "
                "keep_graph=False); create the Graph with keep_graph=True"
            )
        if not self._handles.graph:
            raise CaptureError("no graph captured yet (got an empty Graph); capture first")
        return self._handles.graph

    @property
    def raw_graph_exec(self) -> int:
        """The ``cudaGraphExec_t`` handle as an int (instantiating a kept graph if needed)."""
        return self._ready_exec("raw_graph_exec")

    @property
    def is_captured(self) -> bool:
        """Whether the Graph holds a captured graph."""
        return self._captured

    def __repr__(self) -> str:
        if self._capture is not None:
            state = "capturing"
        elif self._captured:
            state = "captured"
        else:
            state = "empty"
        pool = self.pool()
        return f"<cugraphrt.Graph {state} pool={pool.id if pool else None}>"


def _resolve_pool(pool) -> MemPool:
    if pool is None:
        return MemPool(_private=True)
    if isinstance(pool, MemPool):
        return pool
    raise OptionsError(
        "pool", pool,
        "a cugraphrt.MemPool (from cugraphrt.graph_pool_handle() or Graph.pool()) or None",
    )
