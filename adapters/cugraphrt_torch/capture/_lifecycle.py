"""Graphs holding collectives go before their process group does.

NCCL (2.26 and newer) does not destroy a communicator while a CUDA graph that captured its
operations is alive: ``ncclCommDestroy`` and ``ncclCommAbort`` poll until every such graph is
destroyed (``commDestroySync``). ``destroy_process_group()`` destroys the communicators of
every group it shuts down, so with such a graph still referenced (a local variable of the
calling function, a module graphed by ``make_graphed_callables``, which references itself
through its new ``forward`` and so only dies in a garbage collection) it never returns; and
without ``destroy_process_group()``, the process group's destructor at exit aborts the
communicator and waits the same way.

So once a graph holding collectives exists, :func:`install` wraps
``ProcessGroup.shutdown`` (what ``destroy_process_group`` calls for each group, however it
was imported): the graphs holding collectives of that group are reset first
(:func:`cugraphrt.distributed.log.release_graphs`), and at exit all of them are (an
``atexit`` handler, which runs before the interpreter destroys the process groups). A
released graph raises :class:`cugraphrt.ReplayError` if replayed.
"""

from __future__ import annotations

import threading

from cugraphrt.adapter import collectives as _collectives

from .._internals import distributed as _distributed

__all__ = ["install"]

_lock = threading.Lock()
_installed = False


def install() -> None:
    """Wrap ``ProcessGroup.shutdown`` once (see the module docstring); never raises."""
    global _installed
    if _installed:
        return
    with _lock:
        if _installed:
            return
        try:
            ProcessGroup = _distributed.process_group_class()
        except ImportError:  # torch without distributed: nothing can hold collectives
            return
        original = ProcessGroup.shutdown

        def shutdown(self, *args, **kwargs):
            try:
                _collectives.release_graphs(groups=(str(self.group_name),))
            except Exception:  # noqa: BLE001 - the shutdown itself must still happen
                pass
            return original(self, *args, **kwargs)

        shutdown.__doc__ = getattr(original, "__doc__", None)
        shutdown.__wrapped__ = original  # type: ignore[attr-defined]
        ProcessGroup.shutdown = shutdown
        _installed = True
