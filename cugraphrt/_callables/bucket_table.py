"""The records of a bucketed callable: one per bucket, and what a front end's capture returns.

:class:`CapturedBucket` is what a front end hands :class:`cugraphrt._callables.buckets.Bucketed`
for one bucket's capture; :class:`BucketRecord` is the bucket's graph and counters as the
bucketed callable keeps them. Split out of the buckets module to keep each module readable.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

from cugraphrt._callables.call_path import CallPath
from cugraphrt._cuda import runtime as _cuda

__all__ = ["BucketRecord", "CapturedBucket", "Clock", "Use", "instantiate_measured",
           "takes_warm"]


class CapturedBucket:
    """One bucket's graph as the front end captured it.

    Parameters
    ----------
    replay : callable
        Launches the graph on the current stream (no pool-order checks: see the module
        docstring for why bucket graphs may replay in any order).
    outputs : Any
        The static outputs the graph writes.
    release : callable
        Frees the graph (its hold on the pool included).
    seq : int, default 0
        The graph's capture order in the pool (``cugraphrt._memory.overwrites``), for ``check``.
    graph : cugraphrt.Graph, optional
        The Graph, keeping its definition: needed for ``inputs="rebind"``.
    memory : object, optional
        What keeps the memory of the capture's outputs mapped once the outputs let go of it
        (torch: a keeper of the capture's torch MemPool, whose segments torch never returns
        while it lives; CuPy: the pool, whose holds pin a segment). Given with a framework
        that has ``unowned``, the family's buckets share their outputs' memory
        (:mod:`cugraphrt._callables.buckets`, "Outputs").
    exec_bytes : int, optional
        Device memory the executable took when instantiated (:func:`instantiate_measured`).
    written : sequence of bool, optional
        Per array argument, whether the capture wrote it, where the framework knows (torch:
        version counters); narrows what the rebinding plan reads from the nodes (None:
        the nodes' answer alone).
    """

    __slots__ = ("replay", "outputs", "release", "seq", "graph", "memory", "exec_bytes",
                 "written")

    def __init__(self, replay: Callable[[], None], outputs: Any,
                 release: Callable[[], None], seq: int = 0, graph: Any = None,
                 memory: Any = None, exec_bytes: int | None = None,
                 written: Any = None) -> None:
        self.replay = replay
        self.outputs = outputs
        self.release = release
        self.seq = seq
        self.graph = graph
        self.memory = memory
        self.exec_bytes = exec_bytes
        self.written = written


def instantiate_measured(graph: Any) -> int:
    """Instantiate ``graph`` (a Graph kept with ``keep_graph=True``) and return the device
    bytes the executable took, by ``cudaMemGetInfo`` before and after.

    The driver maps device memory in pages (2 MiB), so this reads 0 or whole pages; it counts
    any other allocation made meanwhile, so call it where nothing else runs (a capture's
    front end, right after the capture).
    """
    before = _cuda.mem_info()[0]
    graph.instantiate()
    return max(0, before - _cuda.mem_info()[0])


def takes_warm(capture: Callable[..., Any]) -> bool:
    """Whether ``capture`` accepts ``(args, pool, warm)``."""
    try:
        inspect.signature(capture).bind(None, None, True)
    except TypeError:
        return False
    except ValueError:  # no signature to read (a builtin): assume the current interface
        return True
    return True


class BucketRecord:
    """One bucket: its graph (or None while not captured) and its counters."""

    __slots__ = ("size", "entry", "path", "outputs_by_n", "use", "captures",
                 "evictions", "capture_seconds", "growth_bytes", "shared_bytes", "exec_bytes",
                 "over_budget", "alone_bytes", "cold_failures")

    def __init__(self, size: int) -> None:
        self.size = size
        self.entry: CapturedBucket | None = None
        self.path: CallPath | None = None  # the call path of entry's graph
        self.outputs_by_n: dict[int, Any] = {}
        self.use = Use()  # updated by the call path's steps, which must not hold the bucket
        self.captures = self.evictions = 0
        self.capture_seconds = 0.0
        self.growth_bytes = 0
        self.shared_bytes = 0  # the pool's reservation its capture found there
        self.exec_bytes: int | None = None
        self.cold_failures = 0  # captures without warm-up that failed (then warmed up)
        self.over_budget = False
        self.alone_bytes = 0  # what the pool reserved with only this bucket's graph, if over


class Use:
    """How a bucket's graph has been used: what eviction and the stats read."""

    __slots__ = ("last_used", "calls", "padded_rows")

    def __init__(self) -> None:
        self.last_used = self.calls = self.padded_rows = 0


class Clock:
    """Calls and captures so far, for least-recently-used eviction."""

    __slots__ = ("now",)

    def __init__(self) -> None:
        self.now = 0

    def tick(self) -> int:
        self.now += 1
        return self.now
