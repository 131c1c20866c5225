"""Replay-order bookkeeping of the graphs sharing one memory pool (see docs/memory.md)."""

from __future__ import annotations

import itertools

from cugraphrt._cuda import runtime as _cuda
from cugraphrt._flags import FLAGS
from cugraphrt.errors import PoolOrderError

__all__ = ["ReplayOrder", "pool_checks_enabled", "set_pool_checks"]


class ReplayOrder:
    """Replay-order and concurrency bookkeeping of the graphs sharing one pool.

    Allowed transitions between replays: the same graph again, the next graph in capture
    order, or the first graph (a new round). A replay on another stream while the previous
    replay of the pool has not finished is a concurrent replay.
    """

    def __init__(self) -> None:
        self._seqs = itertools.count()
        self.live: list[int] = []
        self.last: int | None = None
        self.last_stream: int | None = None
        self.event = None

    def add(self) -> int:
        seq = next(self._seqs)
        self.live.append(seq)
        return seq

    def remove(self, seq: int) -> None:
        if seq in self.live:
            self.live.remove(seq)
        if self.last == seq:
            self.last = None

    def check(self, pool_id: int, seq: int, stream_ptr: int) -> None:
        if len(self.live) < 2 or self.last is None:
            return
        position = self.live.index(seq)
        last_position = self.live.index(self.last)
        if position not in (last_position, last_position + 1, 0):
            raise PoolOrderError(
                f"graph #{position + 1} of the {len(self.live)} graphs sharing memory pool "
                f"{pool_id} was replayed right after graph #{last_position + 1} (got an "
                f"out-of-order replay); graphs sharing a pool must replay in the order they "
                f"were captured (each graph may repeat, and a round may restart at graph #1), "
                f"or they overwrite each other's memory: replay in capture order, or give "
                f"each graph its own pool"
            )
        if stream_ptr != self.last_stream and self.event is not None:
            if not _cuda.event_done(self.event.ptr):
                raise PoolOrderError(
                    f"graph #{position + 1} sharing memory pool {pool_id} was replayed on "
                    f"stream 0x{stream_ptr:x} while the previous replay of the pool, on "
                    f"stream 0x{self.last_stream:x}, has not finished (got a concurrent "
                    f"replay); graphs sharing a pool must not run at the same time: replay "
                    f"them on one stream, synchronize in between, or give each its own pool"
                )

    def note(self, seq: int, stream_ptr: int) -> None:
        from cupy.cuda import Event

        event = self.event
        if event is None:
            event = self.event = Event(disable_timing=True)
        _cuda.event_record(event.ptr, stream_ptr)
        self.last = seq
        self.last_stream = stream_ptr


# -- the switch --------------------------------------------------------------------------


def set_pool_checks(enabled: bool) -> None:
    """Turn the replay-order safety mode on or off.

    While on, replaying a graph that shares its pool with other live graphs verifies that
    replays follow capture order and do not overlap on different streams, raising
    :class:`cugraphrt.PoolOrderError` instead of letting them corrupt each other. Costs about
    one event record and a few dictionary operations (a few microseconds) per replay of a
    pool-sharing graph; graphs with a pool of their own pay one flag test. Also enabled by
    the environment variable ``CUGRAPHRT_POOL_CHECKS=1``.

    Parameters
    ----------
    enabled : bool
    """
    FLAGS.set(pool_checks=enabled)
    for listener in _check_listeners:
        listener(FLAGS.pool_checks)


# What must follow the switch beyond the replay paths, which read FLAGS: the launchers
# handed out, which bound their target when made (cugraphrt._capture.launcher).
_check_listeners: list = []


def pool_checks_enabled() -> bool:
    """Whether the replay-order safety mode is on."""
    return FLAGS.pool_checks
