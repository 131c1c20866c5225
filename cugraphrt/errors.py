"""Exceptions raised by cugraphrt.

Every exception derives from :class:`CugraphrtError` and from the built-in exception that
describes it best, so callers can catch either (``except MemoryError`` keeps working for
:class:`PoolOutOfMemoryError`). Messages follow one pattern: what went wrong, the value seen
``(got ...)``, and what to do about it.
"""

from __future__ import annotations

__all__ = [
    "CugraphrtError",
    "CaptureError",
    "ReplayError",
    "OverwrittenOutputError",
    "OptionsError",
    "PoolOutOfMemoryError",
    "PoolOrderError",
    "CollectiveTimeoutError",
]


class CugraphrtError(Exception):
    """Base class of every error raised by cugraphrt."""


class CaptureError(CugraphrtError, RuntimeError):
    """An operation is not allowed during stream capture, or a capture is used wrongly.

    Raised for illegal operations inside a captured region (host synchronization, library
    calls CUDA cannot record), capture on the legacy default stream, a capture ended on a
    different stream than it began on, a forked stream that was never joined back, and
    nested captures. When raised by :class:`cugraphrt.graph`, the original exception is
    chained as ``__cause__``.
    """


class ReplayError(CugraphrtError, RuntimeError):
    """A graph cannot be replayed as asked.

    Raised when replaying before a capture or after :meth:`cugraphrt.Graph.reset`, and when a
    graphed callable is called with inputs that differ from the capture (count, shape, dtype,
    device).
    """


class OverwrittenOutputError(ReplayError):
    """A replay would overwrite an output of an earlier call that is still referenced.

    Raised by :func:`cugraphrt.make_graphed` callables made with ``check_outputs=True``
    before the replay, naming the output and the call that returned it. CuPy cannot
    intercept reading an array, so the checked mode refuses the replay instead (see
    docs/reliability.md, "Reading an overwritten output").
    """


class OptionsError(CugraphrtError, ValueError):
    """An option has a value outside the allowed set.

    Attributes
    ----------
    field : str
        Name of the offending option.
    value : object
        The value that was given.
    allowed : str
        Human-readable description of the allowed values.
    """

    def __init__(self, field: str, value: object, allowed: str) -> None:
        self.field = field
        self.value = value
        self.allowed = allowed
        super().__init__(f"invalid value for option '{field}' (got {value!r}): {allowed}")

    def __reduce__(self):  # keep pickling (multiprocessing, pytest-xdist) working
        return (type(self), (self.field, self.value, self.allowed))


class PoolOutOfMemoryError(CugraphrtError, MemoryError):
    """A graph memory pool could not grow during capture.

    The capture that asked for the memory has already been ended and rolled back when this
    is raised; the pool's statistics are back at their pre-capture values (apart from arrays
    created inside the failed capture that are still referenced).

    Attributes
    ----------
    requested_bytes : int
        Size of the allocation that failed.
    reserved_bytes : int
        Bytes the pool held from the device when the allocation failed.
    device_free_bytes, device_total_bytes : int
        The device's free and total memory as reported by the driver at that moment.
    """

    def __init__(
        self,
        requested_bytes: int,
        reserved_bytes: int,
        device_free_bytes: int,
        device_total_bytes: int,
    ) -> None:
        self.requested_bytes = requested_bytes
        self.reserved_bytes = reserved_bytes
        self.device_free_bytes = device_free_bytes
        self.device_total_bytes = device_total_bytes
        super().__init__(
            f"graph memory pool out of memory during capture: could not allocate "
            f"{_fmt_bytes(requested_bytes)} (got {_fmt_bytes(device_free_bytes)} free of "
            f"{_fmt_bytes(device_total_bytes)} on the device; the pool already reserves "
            f"{_fmt_bytes(reserved_bytes)}). The capture was rolled back. Free memory held "
            f"elsewhere (cupy.get_default_memory_pool().free_all_blocks(), "
            f"cugraphrt.empty_cache()), share one pool between graphs that replay in order, "
            f"or capture a smaller problem."
        )

    def __reduce__(self):
        return (
            type(self),
            (
                self.requested_bytes,
                self.reserved_bytes,
                self.device_free_bytes,
                self.device_total_bytes,
            ),
        )


class PoolOrderError(CugraphrtError, RuntimeError):
    """Graphs that share a memory pool were replayed in an order that can corrupt them.

    Only raised while pool checks are enabled (:func:`cugraphrt.set_pool_checks` or the
    environment variable ``CUGRAPHRT_POOL_CHECKS=1``).
    """


class CollectiveTimeoutError(ReplayError):
    """A replayed graph's collectives did not finish in time: the hang watchdog fired.

    Raised (only with a collective timeout set, see docs/distributed.md) in the thread that
    replayed the graph, and by every later replay of a graph that holds collectives; the
    message names the rank, the graph and its collectives. The communicator has been
    aborted by then.
    """


def _fmt_bytes(n: int) -> str:
    size = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(size) < 1024.0 or unit == "GiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.2f} {unit}"
        size /= 1024.0
    return f"{n} B"  # pragma: no cover - loop always returns
