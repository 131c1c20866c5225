"""Graph memory pools: device memory reserved for captured graphs.

A captured graph reads and writes the same addresses on every replay, so the memory a capture
used must never go to eager code, nor to another graph that may run in between. Each capture
allocates from a :class:`MemPool`: a private one by default, or one shared with graphs that
always replay in capture order (``pool=`` on every capture entry point).

Rules, in short:

* Only captures allocate from a pool. Eager code never receives pool memory.
* A block freed during a capture may be reused later in that capture (on the same stream) or
  by a later capture into the same pool.
* A graph pins the segments its capture allocated from (blocks it freed again included). A
  segment goes back to the device only when it is fully free (every array on it has died)
  and no live graph pins it, so a released graph's memory can go back while other graphs of
  a shared pool live. Private pools give segments back as soon as they can; pools made with
  :func:`graph_pool_handle` keep their cache for the next capture until :func:`empty_cache`
  (or until the pool is dropped). Nothing goes back while a capture into the pool is underway.
* Graphs of one pool replay one after another, so they can share scratch memory (a library
  workspace): :meth:`MemPool._shared_block` lends one block per key while any graph lives.
"""

from __future__ import annotations

import itertools
import threading
import weakref
from collections.abc import Hashable

from cupy.cuda import get_current_stream as _get_current_stream
from cupy.cuda.memory import MemoryPointer as _MemoryPointer
from cupy.cuda.memory import UnownedMemory as _UnownedMemory

from cugraphrt._cuda.devices import resolve_device
from cugraphrt._memory.backing import (
    BackingOutOfMemoryError,
    CudaBackingAllocator,
    check_backing,
)
from cugraphrt._memory.blocks import Block, BlockArena, Segment
from cugraphrt._memory.holds import SegmentHold
from cugraphrt._memory.replay_order import ReplayOrder, pool_checks_enabled, set_pool_checks
from cugraphrt.errors import CaptureError, PoolOutOfMemoryError, _fmt_bytes
from cugraphrt.options import PoolStats

__all__ = [
    "MemPool",
    "graph_pool_handle",
    "empty_cache",
    "set_pool_checks",
    "pool_checks_enabled",
]

_pool_ids = itertools.count(1)
_all_pools: weakref.WeakSet[MemPool] = weakref.WeakSet()


class MemPool:
    """Device memory with a stable identity, reserved for captured graphs.

    Parameters
    ----------
    device : int, optional
        Device to allocate on; defaults to the current CuPy device (or to the backing
        allocator's device when ``backing`` is given). Only captures on this device can
        use the pool.
    backing : BackingAllocator, optional
        Where segments come from; defaults to
        :class:`cugraphrt._memory.backing.CudaBackingAllocator`.

    Notes
    -----
    Create shared pools with :func:`graph_pool_handle` and pass them as ``pool=`` to several
    captures; ``Graph.pool()`` returns the pool a capture used. Graphs sharing a pool must
    replay in the order they were captured (see docs/memory.md); enable
    :func:`set_pool_checks` to have that verified.
    """

    def __init__(self, device: int | None = None, *, backing=None, _private: bool = False):
        if backing is None:
            backing = CudaBackingAllocator(resolve_device(device))
        else:
            check_backing(backing)
        self._id = next(_pool_ids)
        self._device_id = int(backing.device_id)
        self._arena = BlockArena(backing)
        self._lock = threading.Lock()
        self._pending_frees: list = []
        self._pending_unpins: list = []  # keys of holds that died (_unhold)
        self._private = _private
        self._live_graphs = 0
        self._capture_token: Hashable | None = None
        self._baseline: tuple[int, int] | None = None
        # Segments the capture underway allocated from: its graph pins them (_add_graph).
        self._touched: set = set()
        self._capture_seq: int | None = None  # the graph of the capture underway, once added
        # key -> (block, token of the capture that allocated it); see _shared_block.
        self._shared: dict[Hashable, tuple[Block, Hashable]] = {}
        self._order = ReplayOrder()
        _all_pools.add(self)
        # Segments go back when the pool object dies; the finalizer holds only the arena.
        weakref.finalize(self, _release_all, self._arena)

    # -- public ----------------------------------------------------------------------------

    @property
    def id(self) -> int:
        """The pool's identity: unique within the process, stable for the pool's life."""
        return self._id

    @property
    def device_id(self) -> int:
        """The device the pool's memory lives on."""
        return self._device_id

    def stats(self) -> PoolStats:
        """A snapshot of the pool's accounts.

        Returns
        -------
        PoolStats
            reserved_bytes, active_bytes, peak_active_bytes, segments, live_graphs,
            live_arrays.
        """
        with self._lock:
            self._drain_pending()
            arena = self._arena
            return PoolStats(
                pool_id=self._id,
                device_id=self._device_id,
                reserved_bytes=arena.reserved_bytes,
                active_bytes=arena.active_bytes,
                peak_active_bytes=arena.peak_active_bytes,
                segments=len(arena.segments),
                live_graphs=self._live_graphs,
                live_arrays=arena.active_blocks - len(self._shared),
            )

    def empty_cache(self) -> int:
        """Give back every fully free segment that no live graph uses.

        A segment a live graph's capture allocated from stays (the graph replays into it),
        as does any segment holding a live array; the rest goes back even while other
        graphs of the pool live.

        Returns
        -------
        int
            Bytes given back (0 while a capture into the pool is underway).
        """
        with self._lock:
            self._drain_pending()
            if self._capture_token is not None:
                return 0
            return self._arena.release_free_segments()

    def __repr__(self) -> str:
        s = self.stats()
        kind = "private" if self._private else "shared"
        return (
            f"<cugraphrt.MemPool id={self._id} device={self._device_id} {kind} "
            f"reserved={_fmt_bytes(s.reserved_bytes)} active={_fmt_bytes(s.active_bytes)} "
            f"graphs={s.live_graphs} arrays={s.live_arrays}>"
        )

    # -- used by captures ------------------------------------------------------------------

    def _begin_capture(self, token: Hashable) -> None:
        with self._lock:
            if self._capture_token is not None:
                raise CaptureError(
                    f"memory pool {self._id} is already used by a capture that is underway "
                    f"(got a second, concurrent capture into it); pools can be shared by "
                    f"graphs captured one after another, not at the same time: give the "
                    f"concurrent capture its own pool"
                )
            self._drain_pending()
            self._capture_token = token
            self._baseline = (self._arena.peak_active_bytes, self._live_graphs)
            self._touched = set()

    def _allocate(self, nbytes: int, stream_ptr: int, token: Hashable):
        """Allocate a block for a capture; returns a CuPy MemoryPointer.

        This is the allocation path of every array created during a capture, so it is kept
        short: one lock, one arena call, one set insertion and two objects (the lease, which
        is the CuPy memory object itself, and the pointer).
        """
        with self._lock:
            if self._pending_frees or self._pending_unpins:
                self._drain_pending()
            try:
                ptr, size, segment = self._arena.take(nbytes, stream_ptr, token)
            except BackingOutOfMemoryError:
                raise self._out_of_memory(nbytes) from None
            self._touched.add(segment)
        lease = _Lease(ptr, size, None, self._device_id)
        lease.pool = self
        lease.segment = segment
        return _MemoryPointer(lease, 0)

    def _out_of_memory(self, nbytes: int) -> PoolOutOfMemoryError:
        free, total = self._arena.backing.mem_info()
        return PoolOutOfMemoryError(nbytes, self._arena.reserved_bytes, free, total)

    def _shared_block(self, key: Hashable, nbytes: int, stream_ptr: int,
                      token: Hashable) -> int:
        """Address of the pool's block for ``key`` (>= ``nbytes``) for the capture ``token``.

        The first capture asking allocates it; later captures asking with the same key get
        the same block while any graph of the pool lives (graphs of one pool never run at
        the same time, so scratch memory can be shared). Work that may run concurrently
        within one capture needs distinct keys. A larger request replaces the block (the
        old one is freed like a temporary of earlier graphs). The block's segment counts as
        touched by the capture. It is freed when no graph and no capture holds the pool, or
        with the failed capture that allocated it. Raises CaptureError if ``token`` is not
        the capture underway, PoolOutOfMemoryError if the pool cannot grow.
        """
        with self._lock:
            if token is None or token is not self._capture_token:
                raise CaptureError(
                    f"a shared block of memory pool {self._id} was requested outside a "
                    f"capture into it (got key {key!r}); request it from the capture "
                    f"underway, with its token"
                )
            held = self._shared.get(key)
            if held is None or held[0].size < nbytes:
                self._drain_pending()
                try:
                    block = self._arena.allocate(nbytes, stream_ptr, token)
                except BackingOutOfMemoryError:
                    raise self._out_of_memory(nbytes) from None
                if held is not None:
                    # Earlier graphs and possibly this capture used it: reusable on this
                    # stream during the capture, by anyone after it.
                    self._arena.free(held[0], stream_ptr)
                self._shared[key] = held = (block, token)
            self._touched.add(held[0].segment)
            return held[0].ptr

    def _end_capture(self, token: Hashable, succeeded: bool) -> None:
        with self._lock:
            if self._capture_token != token:
                return
            self._drain_pending()
            arena = self._arena
            if succeeded:
                seq = self._capture_seq
                if seq is not None and seq in self._order.live:
                    arena.pin(seq, self._touched)  # allocations after _add_graph (hooks)
                arena.forget_owner(token)
                arena.settle()
            else:
                peak, _ = self._baseline or (arena.peak_active_bytes, 0)
                arena.mark_owned_segments(token)
                self._drop_shared(None if self._live_graphs == 0 else token)
                arena.settle()
                arena.release_free_segments(only_marked=True)
                arena.peak_active_bytes = max(peak, arena.active_bytes)
            self._capture_token = None
            self._baseline = None
            self._touched = set()
            self._capture_seq = None
            if not succeeded:
                self._release_if_idle()

    def _add_graph(self) -> int:
        """A capture into this pool succeeded; returns the graph's place in capture order.

        The graph pins the segments its capture touched until :meth:`_remove_graph`.
        """
        with self._lock:
            self._live_graphs += 1
            seq = self._order.add()
            self._arena.pin(seq, self._touched)
            if self._capture_token is not None:
                self._capture_seq = seq
            return seq

    def _remove_graph(self, seq: int) -> None:
        with self._lock:
            self._live_graphs -= 1
            self._order.remove(seq)
            self._arena.unpin(seq)
            self._drain_pending()
            if self._live_graphs == 0 and self._capture_token is None:
                self._drop_shared(None)
            self._release_if_idle()

    def _drop_shared(self, token: Hashable | None) -> None:
        """Free the shared blocks a capture allocated (``token``), or all of them (None)."""
        for key, (block, owner) in list(self._shared.items()):
            if token is None or owner is token:
                del self._shared[key]
                self._arena.free(block)

    def _release(self, ptr: int, size: int, segment: Segment) -> None:
        """Called when the last array on a block dies; never raises (runs in finalizers)."""
        tag = None
        if self._capture_token is not None:
            # Freed while a capture into this pool is underway: only later work on the same
            # stream is ordered after the block's last use, so only that stream may reuse it.
            try:
                tag = _get_current_stream().ptr
            except Exception:  # noqa: BLE001 - no device context in this thread
                tag = -1  # a stream no capture uses: reusable only once the capture ends
        lock = self._lock
        if not lock.acquire(False):  # positional: a keyword costs more on every free
            # Another thread holds the lock, or a garbage collection ran inside one of this
            # pool's own operations: the lock holder takes the block back.
            self._pending_frees.append((ptr, size, segment, tag))
            return
        try:
            if self._pending_frees or self._pending_unpins:
                self._drain_pending()
            self._arena.give(ptr, size, segment, tag)
            self._release_if_idle()
        except Exception:  # noqa: BLE001 - never raise from a finalizer
            pass
        finally:
            lock.release()

    def _hold(self, memory) -> SegmentHold:
        """Pin the segment of ``memory`` (a lease from :meth:`_allocate`) while the returned
        hold lives, as a live graph does (:mod:`cugraphrt._memory.holds`)."""
        hold = SegmentHold(self)
        with self._lock:
            self._arena.pin(hold.key, (memory.segment,))
        return hold

    def _unhold(self, key) -> None:
        """A hold died (a finalizer: never raises). Unpinned under the lock, now or by its
        holder (as in _release); list.append needs no lock."""
        self._pending_unpins.append(key)
        if self._lock.acquire(False):
            try:
                self._drain_pending()
                self._release_if_idle()
            except Exception:  # noqa: BLE001 - never raise from a finalizer
                pass
            finally:
                self._lock.release()

    def _spans(self) -> tuple:
        """The pool's segments as :meth:`BlockArena.spans` gives them: what the
        rebinding step checks an argument against (cugraphrt._callables.rebind)."""
        return self._arena.spans()

    def _drain_pending(self) -> None:
        pending = self._pending_frees
        while pending:
            self._arena.give(*pending.pop())
        unpins = self._pending_unpins
        while unpins:
            self._arena.unpin(unpins.pop())

    def _release_if_idle(self) -> None:
        arena = self._arena
        if self._capture_token is not None:
            return
        if self._live_graphs == 0 and self._private:
            arena.release_free_segments()
        else:
            arena.release_free_segments(only_marked=True)

    # -- replay-order checks ---------------------------------------------------------------

    def _check_replay(self, seq: int, stream_ptr: int) -> None:
        with self._lock:
            self._order.check(self._id, seq, stream_ptr)

    def _note_replay(self, seq: int, stream_ptr: int) -> None:
        with self._lock:
            self._order.note(seq, stream_ptr)


class _Lease(_UnownedMemory):
    """The CuPy memory of one block handed out; the block goes back when the last array (or
    view) on it dies. The memory object itself, not an owner hanging off one: one object and
    one call fewer on every allocation of a capture."""

    __slots__ = ("pool", "segment")

    def __del__(self) -> None:
        pool = getattr(self, "pool", None)  # unset if the lease was never handed out
        if pool is not None:
            pool._release(self.ptr, self.size, self.segment)


def _release_all(arena: BlockArena) -> None:
    try:
        arena.settle()
        arena.release_free_segments()
    except Exception:  # noqa: BLE001 - finalizer: the process must stay usable
        pass


# -- module-level functions ----------------------------------------------------------------


def graph_pool_handle(device: int | None = None) -> MemPool:
    """A new memory pool for sharing between graphs.

    Parameters
    ----------
    device : int, optional
        Defaults to the current device. Only captures on this device can use the pool:
        a multi-GPU process needs one pool per device.

    Returns
    -------
    MemPool
        Pass it as ``pool=`` to several captures whose graphs always replay in the order
        they were captured; they then reserve about the memory of the largest one.

    Raises
    ------
    OptionsError
        When ``device`` is not an int from 0 to the device count - 1.
    """
    return MemPool(device)


def empty_cache() -> int:
    """Free, in every pool without a capture underway, the free segments no live graph uses.

    Returns
    -------
    int
        Bytes given back to the device.
    """
    return sum(pool.empty_cache() for pool in list(_all_pools))
