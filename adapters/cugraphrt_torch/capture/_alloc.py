"""Torch's memory during a capture comes from the cugraphrt pool.

Torch allocates through its caching allocator. During a capture it routes every allocation
of the capturing streams to a private pool (``torch.cuda.MemPool``); we give that pool a
pluggable allocator whose two C callbacks, defined here with ctypes, carve *segments* out of
the cugraphrt :class:`~cugraphrt.MemPool` of the capture underway. Torch then splits and
caches those segments itself, as it does with ``cudaMalloc`` memory: the callbacks run
only when torch's pool grows (a few times per capture) or gives a whole segment back.

Ownership. Each segment is a CuPy ``MemoryPointer`` from ``cugraphrt.adapter.allocate``; it is
kept in ``_live`` until torch calls the free callback, so the cugraphrt pool can never reuse memory
torch still holds (graph intermediates, outputs a caller kept). Torch frees a segment once it
is unused and its pool is released (the last graph using it reset, the torch MemPool gone),
on its next ``empty_cache``.

One torch MemPool per cugraphrt pool (alive while a capture or a graph uses it), so graphs
sharing a cugraphrt pool share torch's cache too.
"""

from __future__ import annotations

import contextlib
import ctypes
import gc
import sys
import threading
import weakref
from collections.abc import Callable, Iterator
from typing import Any

from cugraphrt import adapter as core
from cugraphrt.adapter import capture_activity
from cugraphrt.adapter import cuda as _cuda
from cugraphrt.errors import PoolOutOfMemoryError

from .._internals import cuda as _cuda_internals

__all__ = ["register", "unregister", "pool_error", "torch_mempool", "release", "retire",
           "allocator", "hold", "sweep_when_safe", "is_torch_capture", "body_pool",
           "MemoryKeep", "warming"]

# void* alloc(size_t size, int device, cudaStream_t stream)
# void free(void* ptr, size_t size, int device, cudaStream_t stream)
# (torch's CUDAPluggableAllocator signatures, as in torch.cuda.memory._use_uvm)
_ALLOC_FN = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p)
_FREE_FN = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p)


class _Underway:
    """A torch capture underway: the core's Capture and the first pool error it met."""

    __slots__ = ("capture", "error")

    def __init__(self, capture) -> None:
        self.capture = capture
        self.error: BaseException | None = None


_lock = threading.RLock()
# capture id -> _Underway. A process-wide table, not thread-local: torch may allocate for a
# capture from another thread (autograd's device threads run backward ops on the capturing
# streams), and the callbacks get only the stream.
_underway: dict[int, _Underway] = {}
# segment address -> the CuPy MemoryPointer that keeps it out of the cugraphrt pool's reach
_live: dict[int, object] = {}


def register(capture) -> None:
    """Let torch's allocations for ``capture`` (a cugraphrt Capture) come from its pool."""
    with _lock:
        _underway[capture.capture_id] = _Underway(capture)


def unregister(capture) -> None:
    """Stop serving ``capture``; used as the Capture's finish hook (never raises)."""
    with _lock:
        entry = _underway.get(capture.capture_id)
        if entry is not None and entry.capture is capture:
            del _underway[capture.capture_id]


def is_torch_capture(capture) -> bool:
    """Whether ``capture`` is a torch capture (begun by cugraphrt_torch.graph)."""
    entry = _underway.get(capture.capture_id)
    return entry is not None and entry.capture is capture


@contextlib.contextmanager
def body_pool(capture, body_id: int) -> Iterator[None]:
    """Torch's allocations in a conditional node's body come from the capture's pool.

    Torch routes the allocations of a capture to its graph's MemPool by the CUDA capture id,
    and a body is captured under an id of its own (see cugraphrt.adapter.control). So the body gets
    a     torch MemPool of its own on this thread, built on the same allocator, and the body's
    capture id is served like the capture's. The MemPool lives as long as the graph (its
    blocks are the body's memory on every replay), and goes with it (:class:`MemoryKeep`).
    """
    import torch

    with torch.cuda.device(capture.device_id):
        mempool = hold(torch.cuda.MemPool(allocator()))
    capture.keepalive.append(MemoryKeep(mempool))
    with _lock:
        _underway[body_id] = _underway[capture.capture_id]
    try:
        with torch.cuda.use_mem_pool(mempool, device=capture.device_id):
            yield
    finally:
        with _lock:
            _underway.pop(body_id, None)


class MemoryKeep:
    """Keeps a torch MemPool, so its segments stay mapped, for memory no tensor owns: a
    conditional body's pool (kept by its graph), a capture's pool under shape buckets' shared
    outputs (kept by the outputs: ``cugraphrt_torch.graph.memory``).

    The MemPool is also held in ``_held`` until a safe point. When the last holder lets go,
    so does this, and it sweeps: the segments go back then (now, or when the capture underway
    ends), not at the next capture, and not never (torch gives them back only once the
    MemPool is gone).
    """

    __slots__ = ("mempool",)

    def __init__(self, mempool) -> None:
        self.mempool = mempool

    def __del__(self) -> None:
        self.mempool = None
        try:
            sweep_when_safe()
        except Exception:  # noqa: BLE001 - never raise from a finalizer
            pass


def pool_error(capture) -> BaseException | None:
    """The pool error (out of memory) the allocator met for ``capture``, if any."""
    entry = _underway.get(capture.capture_id)
    return entry.error if entry is not None and entry.capture is capture else None


class _Warming:
    """What :func:`_on_alloc` reads of a capture while its warm-ups run, before it begins."""

    __slots__ = ("pool", "token")

    def __init__(self, pool, token) -> None:
        self.pool = pool
        self.token = token


# thread id -> the warm-ups of a capture that thread is about to begin (see warming()).
_warming: dict[int, _Underway] = {}


@contextlib.contextmanager
def warming(pool, token, mempool, device: int) -> Iterator[None]:
    """Let this thread's torch allocations come from ``pool`` (with the capture ``token``)
    while the block runs: the warm-ups of the capture about to begin.

    Their activations are freed into ``mempool`` (the capture's torch MemPool), where the
    capture reuses them, instead of staying cached in torch's general pool; the cuBLAS
    workspace they create is the one the capture bakes in, and it belongs to the graph's
    pool (see ``_torch.drop_blas_workspaces``). Keyed by thread: torch routes a thread's
    allocations to a MemPool (``use_mem_pool``) whatever the stream.
    """
    import torch

    with serving_thread(pool, token), torch.cuda.use_mem_pool(mempool, device=device):
        yield


@contextlib.contextmanager
def serving_thread(pool, token) -> Iterator[None]:
    """While the block runs, the callbacks serve this thread's allocations from ``pool``
    (``token``: the capture's), whatever the stream: :func:`warming`'s half that needs no
    device."""
    thread = threading.get_ident()
    with _lock:
        _warming[thread] = _Underway(_Warming(pool, token))
    try:
        yield
    finally:
        with _lock:
            _warming.pop(thread, None)


def _entry_for(stream: int | None) -> _Underway | None:
    if _warming:
        entry = _warming.get(threading.get_ident())
        if entry is not None:
            return entry
    entries = tuple(_underway.values())
    if len(entries) == 1 and not _warming:
        # Torch only routes allocations to a pool built on this allocator while one of our
        # captures is underway (or warms up: above): with one capture there is nothing to
        # look up.
        return entries[0]
    if not entries or not stream or stream in (1, 2):
        return None  # never query the legacy stream: that would break a global capture
    status, capture_id = _cuda.capture_info(stream)
    if status == _cuda.STATUS_NONE:
        return None
    return _underway.get(capture_id)


def _on_alloc(size: int, device: int, stream: int | None) -> int | None:
    """Torch's pool grows: hand it a segment of the capture's pool, or NULL."""
    collecting = gc.isenabled()
    # A collection here could free torch tensors and re-enter torch's allocator, which is
    # in the middle of this allocation (it holds its lock).
    gc.disable()
    try:
        entry = _entry_for(stream)
        if entry is None:
            return None
        capture = entry.capture
        pool = capture.pool
        if device != pool.device_id:
            return None
        try:
            memory = core.allocate(pool, int(size), int(stream or 0), capture.token)
        except PoolOutOfMemoryError as exc:
            if entry.error is None:
                entry.error = exc
            return None
        _live[memory.ptr] = memory
        return memory.ptr
    except BaseException:  # noqa: BLE001 - nothing may propagate into C; NULL means failure
        return None
    finally:
        if collecting:
            gc.enable()


def _on_free(ptr: int | None, size: int, device: int, stream: int | None) -> None:
    """Torch gives a whole segment back: the cugraphrt pool may reuse it."""
    try:
        _live.pop(ptr or 0, None)
    except BaseException:  # noqa: BLE001 - nothing may propagate into C
        pass


# Module-level for the life of the process: the C allocator keeps these addresses, and torch
# may call them until its last pool built on them is gone.
_C_ALLOC = _ALLOC_FN(_on_alloc)
_C_FREE = _FREE_FN(_on_free)
_allocator = None


def allocator():
    """The process's torch pluggable allocator built on the callbacks (created once)."""
    global _allocator
    if _allocator is None:
        with _lock:
            if _allocator is None:
                alloc_ptr = ctypes.cast(_C_ALLOC, ctypes.c_void_p).value
                free_ptr = ctypes.cast(_C_FREE, ctypes.c_void_p).value
                _allocator = _cuda_internals.custom_allocator(alloc_ptr, free_ptr)
    return _allocator


# cugraphrt MemPool -> _TorchPool. Weak keys: the segments in _live keep the cugraphrt pool
# alive, so the entry must not keep it alive in turn.
_mempools: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


class _TorchPool:
    """Which torch MemPool serves a cugraphrt pool, and how many torch graphs use it.

    Torch's pinned-host allocator keeps a use count per pool id, raised by every
    ``CUDAGraph.capture_begin`` and lowered by every graph reset, and it asserts (leaving the
    RNG and device allocator half in capture mode) if a capture reuses an id whose count fell
    to zero. So a torch pool id is never reused once all its graphs are gone: the next
    capture gets a fresh torch MemPool, and the old one returns its segments to the
    cugraphrt pool when it dies.
    """

    __slots__ = ("ref", "users", "used")

    def __init__(self, mempool) -> None:
        try:
            self.ref: Callable[..., Any] = weakref.ref(mempool)
        except TypeError:  # a torch whose MemPool takes no weak references
            self.ref = lambda kept=mempool: kept
        self.users = 0
        self.used = False


# Torch objects whose destructors must not run during a capture: a torch MemPool empties its
# cache (cudaFree) and a CUDAGraph destroys its executable when it dies, and torch aborts the
# process if that fails under an active capture. A garbage collection can drop the last
# reference at any moment, so the adapter holds every such object here and lets go of those
# nothing else references only at safe points, when no capture is underway.
_held: list = []


def hold(obj):
    """Keep ``obj`` (a torch MemPool or CUDAGraph) until a safe point after its last use."""
    with _lock:
        _held.append(obj)
    return obj


def _sweep() -> None:
    with _lock:
        if capture_activity.active:
            return
        # A reference from the list, one from the loop variable, one from getrefcount's
        # argument: anything more means someone else still uses the object.
        keep = [obj for obj in _held if sys.getrefcount(obj) > 3]
        dropped, _held[:] = _held[:], keep
    del dropped  # destructors run here, outside any capture and outside the lock
    _empty_host_cache()


def _empty_host_cache() -> None:
    """Let torch's pinned-host allocator drop what it keeps for finished captures.

    Torch's host allocator keeps state for every graph capture (about 48 KiB of host
    memory each, measured on an H100 with torch 2.11) that only its ``empty_cache`` gives
    back. ``torch.cuda.graph`` calls it before each capture; ``CUDAGraph.capture_begin``,
    which this adapter uses, does not, so without this every capture leaked that much
    (docs/reliability.md). It frees pinned memory (``cudaFreeHost``), which a capture
    underway forbids: it runs here, where no cugraphrt capture is underway.
    """
    try:
        _cuda_internals.host_empty_cache()
    except Exception:  # noqa: BLE001 - runs from finalizers; the cache stays as it was
        pass


def sweep_when_safe() -> None:
    """Release held torch objects nothing uses any more, now or when the last capture ends."""
    capture_activity.defer_or_run(_sweep)


def torch_mempool(pool):
    """The torch MemPool for a new torch capture into ``pool`` (a cugraphrt MemPool).

    Counts one user until :func:`release` is called for it (when the torch graph is reset,
    or its capture failed). The caller keeps the MemPool alive while it uses it.
    """
    import torch

    with _lock:
        entry = _mempools.get(pool)
        mempool = entry.ref() if entry is not None else None
        if mempool is None or (entry.used and entry.users == 0):
            with torch.cuda.device(pool.device_id):
                mempool = torch.cuda.MemPool(allocator())
            _held.append(mempool)  # see hold(); _lock is already held here
            entry = _mempools[pool] = _TorchPool(mempool)
        entry.users += 1
        entry.used = True
        return mempool


def release(pool, mempool) -> None:
    """A torch graph that used ``mempool`` for ``pool`` was reset (or its capture failed)."""
    with _lock:
        entry = _mempools.get(pool)
        if entry is not None and entry.ref() is mempool and entry.users > 0:
            entry.users -= 1


def retire(pool) -> None:
    """Forget ``pool``'s torch MemPool: the next capture gets a fresh one.

    Used when torch's allocator may still believe a capture into the old one is underway
    (a failed capture that could not be ended cleanly): a fresh pool id avoids that state.
    """
    with _lock:
        _mempools.pop(pool, None)
