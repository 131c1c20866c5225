"""The lifetime test family: a replay handle is enough to keep what it replays.

docs/concepts.md, "Lifetimes", states the rule: anything a user can call to replay a graph
holds that graph, and the graph's executable and memory go back when the last such handle
goes, at once (no garbage collection needed), neither before nor never.

A case is a function that builds a graph (or a graphed callable) inside its own scope and
returns a :class:`Kept`: the one handle a user keeps, and a check that replays through the
handle and compares with an independent reference (an eager run, NumPy). Everything else the
build named is gone when it returns. :func:`check_lifetime` then

1. collects garbage, replays through the handle three times and compares (nothing was freed
   behind the handle's back);
2. checks that the graph and its pool memory are still there (not before);
3. drops the handle and, with no garbage collection, checks that every graph made by the
   build released its executable (not never, and at once);
4. drops the check's arrays, and checks that the pool gave every byte back and that
   ``cudaMemGetInfo`` saw the memory return.

Graphs are observed through their finalizers (``weakref.finalize`` objects hold no
reference to the Graph), recorded by :func:`graphs_made` as the build creates them.
"""

from __future__ import annotations

import contextlib
import gc
import weakref
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import cupy

from cugraphrt._capture import graphs

#: Every case's capture frees a temporary of this size inside the capture: memory the graph
#: pins, visible in its pool's reserved bytes and in ``cudaMemGetInfo``.
BIG_BYTES = 64 << 20


@dataclass
class Kept:
    """What a case's build hands back: the handle, and how to check a replay through it.

    ``check(handle)`` replays through the handle and compares with a reference; it may hold
    the static arrays, never a graph. ``pool`` is the pool the graphs allocated from (a pool
    holds no graph). ``flush`` gives cached memory back to the pool after the handle and the
    arrays are gone (torch keeps freed segments until ``torch.cuda.empty_cache()``).
    """

    handle: Any
    check: Callable[[Any], None]
    pool: Any
    flush: Callable[[], None] = lambda: None
    finalizers: list[weakref.finalize] = field(default_factory=list)


@contextlib.contextmanager
def graphs_made() -> Iterator[list[weakref.finalize]]:
    """Record the finalizer of every :class:`cugraphrt.Graph` created in the block."""
    made: list[weakref.finalize] = []
    original = graphs.Graph.__init__

    def recording_init(self, *args, **kwargs):
        original(self, *args, **kwargs)
        made.append(self._finalizer)

    graphs.Graph.__init__ = recording_init  # type: ignore[method-assign]
    try:
        yield made
    finally:
        graphs.Graph.__init__ = original  # type: ignore[method-assign]


def check_lifetime(build: Callable[[], Kept], *,
                   also_held_by: Callable[[], None] | None = None) -> None:
    """Run the four steps of the module docstring on the handle ``build()`` returns.

    ``also_held_by`` releases a holder outside cugraphrt that keeps the handle's graphs by
    design (dynamo's code cache keeps compiled code, pieces included, beyond the compiled
    function): step 3 then runs it after dropping the handle, and checks after it.
    """
    with graphs_made() as made:
        kept = build()
    kept.finalizers = made
    assert made, "the build made no cugraphrt.Graph: nothing to check"
    handle, check, pool, flush = kept.handle, kept.check, kept.pool, kept.flush
    del kept
    gc.collect()
    alive = [f.alive for f in made]
    assert all(alive), f"a graph died while its handle lived (alive: {alive})"
    for _ in range(3):
        check(handle)
    cupy.cuda.runtime.deviceSynchronize()
    held = pool.stats()
    assert held.live_graphs >= 1 and held.reserved_bytes >= BIG_BYTES, held
    assert all(f.alive for f in made), "a replay released its own graph"

    free_before, _ = cupy.cuda.runtime.memGetInfo()
    del handle  # the last reference: everything must go now, with no collection
    if also_held_by is not None:
        assert all(f.alive for f in made), "a graph died while the code cache still held it"
        also_held_by()
    alive = [f.alive for f in made]
    assert not any(alive), (f"graphs still alive once their last handle was dropped (alive: "
                            f"{alive}): a reference cycle or a leak keeps them")
    del check  # the static arrays
    gc.collect()
    flush()
    cupy.cuda.runtime.deviceSynchronize()
    after = pool.stats()
    assert after.live_graphs == 0 and after.reserved_bytes == 0, after
    free_after, _ = cupy.cuda.runtime.memGetInfo()
    assert free_after - free_before >= BIG_BYTES, (
        f"cudaMemGetInfo saw {(free_after - free_before) >> 20} MiB come back, expected at "
        f"least the {BIG_BYTES >> 20} MiB the graph pinned")
