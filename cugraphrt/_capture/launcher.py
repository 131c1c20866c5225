"""Launcher: a graph's launch as one C-level call, for hot loops.

:meth:`cugraphrt.Graph.launcher` returns a :class:`Launcher`, a :class:`functools.partial`
of CuPy's ``runtime.graphLaunch`` bound to the graph's executable and a stream handle.
Calling it runs no Python frame: it costs what CuPy's own ``Graph.launch`` costs. What
``Graph.replay()`` checks on every call is settled when the launcher is made, and whenever
something changes it the launcher is rewritten in place (``functools.partial.__setstate__``),
so it never launches a destroyed executable. This module makes launchers and rewrites them;
the Graph says when (:meth:`~cugraphrt.Graph.instantiate`, :meth:`~cugraphrt.Graph.reset`),
and so do the pool-order checks when they are turned on or off.
"""

from __future__ import annotations

import functools
import weakref
from collections.abc import Iterable
from typing import Any

import cupy

from cugraphrt._cuda import runtime as _cuda
from cugraphrt._cuda.devices import stream_ptr
from cugraphrt._flags import FLAGS
from cugraphrt._memory import replay_order as _checks_switch
from cugraphrt.errors import ReplayError

__all__ = ["Launcher"]

_partial_new = functools.partial.__new__
_set_state = getattr(functools.partial, "__setstate__")  # noqa: B009 - typeshed omits it
_current_stream = cupy.cuda.get_current_stream
# Every launcher still tied to a graph: turning the pool checks on or off re-arms them all.
_live: weakref.WeakSet[Launcher] = weakref.WeakSet()

NO_EXECUTABLE = (
    "the launcher's graph has no executable (got a launcher of a graph whose instantiate() "
    "failed or is underway); call g.instantiate() again: the launcher follows the new "
    "executable")


class Launcher(functools.partial):
    """A graph's launch on one stream as a C-level callable; made by :meth:`Graph.launcher`.

    ``launch()`` (no argument) launches the graph's executable on the stream bound when the
    launcher was made. The contract:

    * **No Python frame, no check per call.** It calls CuPy's ``runtime.graphLaunch``
      directly: the cost of CuPy's own ``Graph.launch``.
    * **The stream is fixed when it is made.** ``Graph.launcher()`` binds CuPy's current
      stream of the graph's device as it is then; a later ``with stream:`` does not move
      it. A stream object is kept alive with the launcher.
    * **No device switch.** Call it with the graph's device current; from another device
      CUDA may refuse the launch. :meth:`Graph.replay` switches devices.
    * **CUDA's errors as they come.** A failed launch raises CuPy's
      ``cupy_backends.cuda.api.runtime.CUDARuntimeError``: translating it would take a frame.
    * **It holds its Graph**, as the bound method ``g.replay`` does: the executable and the
      pool memory live as long as the launcher.
    * **It follows the graph's executable.** After ``g.instantiate()`` it launches the new
      executable. After ``g.reset()`` (a re-capture needs one) it raises
      :class:`~cugraphrt.ReplayError` for good, saying why: a new capture needs a new
      launcher. At interpreter exit, when the Graph's handles are released, likewise.
    * **Pool-order checks.** While :func:`cugraphrt.set_pool_checks` is on, it goes through
      the checked replay (one Python frame, the checks of :meth:`Graph.replay`).
    * It cannot be made directly, pickled or copied (its handles belong to this process).

    Attributes
    ----------
    graph : Graph or None
        The graph it launches; None once it is dead.
    stream_ptr : int
        The handle of the stream it launches on.
    alive : bool
        False once its graph was reset or released: a call then raises ReplayError.
    """

    __slots__ = ("_graph", "_stream", "_ptr")

    _graph: Any
    _stream: object
    _ptr: int

    def __new__(cls, *args: object, **kwargs: object) -> Launcher:
        raise TypeError("a Launcher cannot be created directly (got Launcher(...)); call "
                        "Graph.launcher(stream) on a captured graph")

    @property
    def graph(self) -> Any:
        """The graph it launches (None once dead)."""
        return self._graph

    @property
    def stream_ptr(self) -> int:
        """The handle of the stream it launches on."""
        return self._ptr

    @property
    def alive(self) -> bool:
        """Whether it is still tied to its graph."""
        return self._graph is not None

    def __reduce__(self):
        # Pickled, the handles would point into another process's memory.
        raise TypeError("a Launcher cannot be pickled or copied (got a launch bound to this "
                        "process's CUDA handles); call Graph.launcher() where it is needed")

    def __repr__(self) -> str:
        if self._graph is None:
            return "<cugraphrt.Launcher dead>"
        return f"<cugraphrt.Launcher of {self._graph!r} on stream 0x{self._ptr:x}>"


def for_graph(graph: Any, stream: object) -> Launcher:
    """``graph.launcher(stream)``: validate once, make the launcher, register it."""
    graph._ready_exec("launcher()")
    if not graph._handles.owned:
        raise ReplayError(
            "launcher() needs an executable cugraphrt owns (got a graph captured by "
            "cugraphrt_torch, whose torch.cuda.CUDAGraph owns it and whose replay also "
            "advances torch's RNG offsets, which a bare launch would skip); call g.replay() "
            "instead")
    if graph._route is not None:
        # A graph holding collectives replays through a function of its own until its
        # first replay has checked them across ranks, and for good while the collective
        # watchdog watches its replays (cugraphrt.distributed.replay): a bare launch would
        # skip both.
        raise ReplayError(
            "launcher() of a graph holding collectives before its cross-rank check, or "
            "while the collective watchdog is on (got a graph whose replay checks or "
            "watches its collectives); replay it once with g.replay() first, and make "
            "the launcher with the watchdog off (CUGRAPHRT_COLLECTIVE_TIMEOUT unset)")
    if stream is None:
        stream = _current_stream(graph._device)
    ptr = stream_ptr(stream, graph._device)  # refuses a stream of another device
    launcher = _partial_new(Launcher, *_target(graph, stream, ptr))
    launcher._graph = graph
    launcher._stream = stream  # a stream object stays alive: its handle must stay valid
    launcher._ptr = ptr
    graph._handles.launchers.add(launcher)
    _live.add(launcher)
    return launcher


def _target(graph: Any, stream: object, ptr: int) -> tuple[Any, ...]:
    """The launcher's function and arguments: the launch itself, or the checked replay."""
    if FLAGS.pool_checks:
        return graph._replay_checked, stream
    return _cuda.graph_launch, graph._exec, ptr


def arm_all(launchers: Iterable[Launcher]) -> None:
    """Point each launcher at its graph's current executable (or the checked replay)."""
    for launcher in list(launchers):
        graph = launcher._graph
        if graph is None:
            continue
        if graph._exec is None:
            suspend(launcher, NO_EXECUTABLE)
        else:
            func, *args = _target(graph, launcher._stream, launcher._ptr)
            _set_state(launcher, (func, tuple(args), None, None))


def suspend(launcher: Launcher, message: str) -> None:
    """Make ``launcher()`` raise ReplayError(``message``) until it is armed again."""
    _set_state(launcher, (_raise_replay_error, (message,), None, None))


def kill(launcher: Launcher, message: str) -> None:
    """Make ``launcher()`` raise ReplayError(``message``) for good; it lets go of its graph
    and stream."""
    suspend(launcher, message)
    launcher._graph = None
    launcher._stream = None
    _live.discard(launcher)


def _raise_replay_error(message: str, *args: object, **kwargs: object) -> None:
    raise ReplayError(message)


def _on_checks_toggled(enabled: bool) -> None:
    arm_all(_live)


_checks_switch._check_listeners.append(_on_checks_toggled)
