"""What a Graph owns, kept apart from it so that a finalizer can free it without the Graph.

The executable and graph handles, the hold on the pool, what the capture must keep alive,
and the launchers handed out (see :mod:`cugraphrt._capture.launcher`): a launcher must never launch
an executable once it is destroyed, so releasing the handles kills the launchers first.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable

from cugraphrt._capture import launcher as _launcher
from cugraphrt._cuda import runtime as _cuda
from cugraphrt._memory.backing import capture_activity
from cugraphrt._memory.pool import MemPool

__all__ = ["GraphHandles"]


class GraphHandles:
    """The handles of one Graph; :meth:`release` frees them (also from a finalizer)."""

    __slots__ = ("graph", "exec", "pool", "seq", "keepalive", "owned", "launchers",
                 "instantiate")

    def __init__(self) -> None:
        self.graph = 0
        self.exec = 0
        self.pool: MemPool | None = None
        self.seq = -1
        self.keepalive: list[object] = []
        self.owned = True  # False when an adapter's object (torch's CUDAGraph) frees them
        self.launchers: weakref.WeakSet[_launcher.Launcher] = weakref.WeakSet()
        self.instantiate: Callable[[], int] | None = None  # the adapter's, if it has one

    def suspend_launchers(self) -> None:
        """Make every launcher raise ReplayError until it is armed again (the executable is
        about to go, and a new one may follow)."""
        for launcher in list(self.launchers):
            _launcher.suspend(launcher, _launcher.NO_EXECUTABLE)

    def kill_launchers(self, message: str) -> None:
        """Make every launcher raise ReplayError(``message``) for good."""
        launchers, self.launchers = list(self.launchers), weakref.WeakSet()
        for launcher in launchers:
            _launcher.kill(launcher, message)

    def release(self, why: str = "released") -> None:
        """Destroy the executable and the graph and let go of the pool; never raises.

        ``why`` completes the message of the launchers it kills ("the graph was ...").
        While any capture is underway (a garbage collection can run this in the middle of
        one) the work is handed to a detached copy that runs when the last capture ends.
        """
        try:
            self.kill_launchers(
                f"the launcher's graph was {why} (got a launcher of a graph without its "
                f"executable); capture again and make a new launcher with Graph.launcher()")
        except Exception:  # noqa: BLE001 - runs from finalizers too
            pass
        if capture_activity.active:
            detached = GraphHandles()
            for name in self.__slots__:
                setattr(detached, name, getattr(self, name))
            type(self).__init__(self)
            capture_activity.defer_or_run(detached.release)
            return
        if self.exec and self.owned:
            _cuda.destroy_exec(self.exec)
        if self.graph and self.owned:
            _cuda.destroy_graph(self.graph)
        self.exec = 0
        self.graph = 0
        self.owned = True
        self.instantiate = None
        pool, self.pool = self.pool, None
        if pool is not None:
            try:
                pool._remove_graph(self.seq)
            except Exception:  # noqa: BLE001 - runs from finalizers too
                pass
        self.keepalive = []
