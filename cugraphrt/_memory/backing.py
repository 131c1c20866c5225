"""Backing allocators: where a graph memory pool gets its segments from.

A backing allocator is any object with this small, versioned interface (version 1)::

    interface_version: int            # 1
    device_id: int                    # the device the memory lives on
    malloc(nbytes: int) -> int        # device pointer; raise BackingOutOfMemoryError
    free(ptr: int, nbytes: int) -> None
    mem_info() -> tuple[int, int]     # (free_bytes, total_bytes) of the device

Pools ask for large segments (2 MiB and up) and carve them into blocks themselves, so a
backing allocator sees few calls. The default, :class:`CudaBackingAllocator`, uses
``cudaMalloc``/``cudaFree``. Plug in another (an RMM pool, a NUMA-aware arena, a fake for
tests) with ``cugraphrt.MemPool(backing=...)``.
"""

from __future__ import annotations

import contextlib
import functools
import threading
from collections.abc import Callable, Iterator
from typing import Protocol, runtime_checkable

from cugraphrt._cuda import runtime as _cuda
from cugraphrt.errors import OptionsError

__all__ = [
    "BACKING_INTERFACE_VERSION",
    "BackingAllocator",
    "BackingOutOfMemoryError",
    "CudaBackingAllocator",
    "check_backing",
]

#: The interface version this release of cugraphrt speaks.
BACKING_INTERFACE_VERSION = 1


class BackingOutOfMemoryError(MemoryError):
    """Raised by a backing allocator's ``malloc`` when the device has no room."""


@runtime_checkable
class BackingAllocator(Protocol):
    """The interface a pool's backing allocator implements (version 1)."""

    interface_version: int
    device_id: int

    def malloc(self, nbytes: int) -> int:
        """Allocate ``nbytes`` of device memory and return its address."""

    def free(self, ptr: int, nbytes: int) -> None:
        """Give back memory returned by :meth:`malloc`."""

    def mem_info(self) -> tuple[int, int]:
        """Free and total bytes of the device."""


def check_backing(backing: object) -> None:
    """Reject objects that do not implement the version-1 interface."""
    version = getattr(backing, "interface_version", None)
    if version != BACKING_INTERFACE_VERSION or not isinstance(backing, BackingAllocator):
        raise OptionsError(
            "backing",
            backing,
            f"a backing allocator with interface_version == {BACKING_INTERFACE_VERSION} "
            f"and malloc(nbytes), free(ptr, nbytes), mem_info() and device_id "
            f"(got interface_version={version!r})",
        )


class _CaptureActivity:
    """Counts captures underway in the process; holds unsafe work back meanwhile.

    Two kinds of work must not overlap a capture in *any* thread:

    * clean-up that calls ``cudaFree`` or destroys graphs: forbidden in other threads while a
      global-mode capture runs. A garbage collection in the middle of a capture may trigger
      it; it is queued (:meth:`defer_or_run`) and runs when the last capture ends.
    * calls that invalidate every capture underway, whatever its mode (``cublasCreate``
      synchronizes the device: measured on an H100 with CUDA 13). They run inside
      :meth:`exclusive`, which waits until no capture is underway and holds new captures
      back until the call is done.

    A thread that has a capture of its own underway never waits in :meth:`enter` (it would
    wait for itself); :meth:`exclusive` refuses it instead.
    """

    def __init__(self) -> None:
        self._cond = threading.Condition(threading.Lock())
        self._active = 0
        self._exclusive_waiting = 0
        self._exclusive_running = False
        self._deferred: list[Callable[[], None]] = []
        self._mine = threading.local()

    @property
    def active(self) -> int:
        """Captures underway in the process."""
        return self._active

    def active_in_this_thread(self) -> int:
        """Captures underway in the calling thread."""
        return getattr(self._mine, "count", 0)

    def enter(self) -> None:
        """A capture begins in this thread (may wait for :meth:`exclusive` work to finish)."""
        mine = self.active_in_this_thread()
        with self._cond:
            if not mine:
                # Writers first: a steady stream of overlapping captures must not starve them.
                while self._exclusive_running or self._exclusive_waiting:
                    self._cond.wait()
            self._active += 1
        self._mine.count = mine + 1

    def exit(self) -> None:
        """A capture of this thread ended; runs the deferred clean-up after the last one."""
        self._mine.count = max(self.active_in_this_thread() - 1, 0)
        with self._cond:
            self._active -= 1
            if self._active > 0:
                return
            self._cond.notify_all()
            if not self._deferred:
                return
            deferred, self._deferred = self._deferred, []
        for action in deferred:
            try:
                action()
            except Exception:  # noqa: BLE001 - clean-up of dead objects must not raise here
                pass

    def defer_or_run(self, action: Callable[[], None]) -> None:
        """Run ``action`` now, or when the last capture ends if one is underway."""
        with self._cond:
            if self._active > 0:
                self._deferred.append(action)
                return
        action()

    @contextlib.contextmanager
    def exclusive(self, what: str) -> Iterator[None]:
        """Run a block while no capture is underway in any thread.

        Raises
        ------
        CaptureError
            When the calling thread has a capture of its own underway.
        """
        if self.active_in_this_thread():
            from cugraphrt.errors import CaptureError

            raise CaptureError(
                f"{what} would invalidate the capture underway in this thread (got "
                f"{self.active_in_this_thread()} capture(s) underway here); warm up first: run "
                f"the operation once before capturing"
            )
        with self._cond:
            self._exclusive_waiting += 1
            try:
                while self._active or self._exclusive_running:
                    self._cond.wait()
            finally:
                self._exclusive_waiting -= 1
            self._exclusive_running = True
        try:
            yield
        finally:
            with self._cond:
                self._exclusive_running = False
                self._cond.notify_all()


capture_activity = _CaptureActivity()


class CudaBackingAllocator:
    """Segments from ``cudaMalloc``, safe to grow during any capture.

    ``cudaMalloc`` is an unsafe call under a global-mode capture. Like PyTorch, the thread's
    capture mode is exchanged for relaxed around the call, so the pool can grow in the middle
    of a capture without invalidating it.

    Parameters
    ----------
    device_id : int
        The device to allocate on.
    """

    interface_version = BACKING_INTERFACE_VERSION

    def __init__(self, device_id: int) -> None:
        self.device_id = int(device_id)

    def malloc(self, nbytes: int) -> int:
        with _cuda.relaxed_capture_mode(), _on_device(self.device_id):
            try:
                return _cuda.malloc(nbytes)
            except _cuda.CUDARuntimeError as exc:
                if exc.status == _cuda.OUT_OF_MEMORY:
                    raise BackingOutOfMemoryError(nbytes) from None
                raise _cuda.error_from_status(exc.status, "cudaMalloc") from exc

    def free(self, ptr: int, nbytes: int) -> None:
        capture_activity.defer_or_run(functools.partial(self._free_now, ptr))

    def _free_now(self, ptr: int) -> None:
        with _cuda.relaxed_capture_mode(), _on_device(self.device_id):
            _cuda.free(ptr)

    def mem_info(self) -> tuple[int, int]:
        # Asked while a capture may be underway (to report an out-of-memory error).
        with _cuda.relaxed_capture_mode(), _on_device(self.device_id):
            return _cuda.mem_info()

    def __repr__(self) -> str:
        return f"CudaBackingAllocator(device_id={self.device_id})"


class _on_device:
    """Make ``device_id`` current for a block, restoring the previous device after."""

    __slots__ = ("device_id", "previous")

    def __init__(self, device_id: int) -> None:
        self.device_id = device_id

    def __enter__(self) -> None:
        self.previous = _cuda.get_device()
        if self.previous != self.device_id:
            _cuda.set_device(self.device_id)

    def __exit__(self, *exc: object) -> None:
        if self.previous != self.device_id:
            _cuda.set_device(self.previous)
