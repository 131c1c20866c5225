"""Timing helpers: host time over batches of calls, GPU time from events, statistics.

Every helper returns seconds per call for one *batch*: a loop of ``calls`` calls. A repeat is
one batch; the runner takes medians over repeats. Systems of one table row are measured
interleaved (one batch of each per round, in an order shuffled per round) so that clock
ramps, background activity and whatever one system leaves behind spread over all of them
instead of favouring one; every row gets at least :data:`MIN_ROUNDS` timed rounds after at
least :data:`MIN_WARMUP` untimed ones.

Three kinds of time:

* :func:`host_batch` with ``include_sync=False``: the host's issue time per call, the device
  synchronized after the clock stops. For launch-bound metrics (a one-kernel graph launch):
  what the Python caller pays per call.
* :func:`host_batch` with ``include_sync=True``: wall time per call including the wait for
  the device at the end of the batch, i.e. throughput. For workloads whose GPU work may
  outlast the host's, where issue time alone would flatter graphs.
* :func:`gpu_batch`: device time per call from a pair of CUDA events. A spin kernel first
  holds the stream for a moment so that the host has queued the whole batch before the start
  event fires: the events then time the GPU work back to back (the floor), not the host.
"""

from __future__ import annotations

import random
import statistics
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from time import perf_counter

__all__ = [
    "Summary",
    "summarize",
    "single",
    "device_sync",
    "host_batch",
    "gpu_batch",
    "timed_once",
    "interleave",
    "rounds",
    "round_order",
    "HEAD_START_CYCLES",
    "MIN_ROUNDS",
    "MIN_WARMUP",
]

#: Clock cycles the spin kernel holds the stream before a GPU-timed batch (about 2 ms at
#: 2 GHz): longer than the host needs to queue any batch this benchmark times.
HEAD_START_CYCLES = 4_000_000
#: Timed rounds every interleaved row gets at least, whatever its workload asks for: a
#: verdict is the median of this many paired rounds or more, with its interval (issue 41).
MIN_ROUNDS = 9
#: Untimed rounds before them, at least: no row's first sample pays for a first call.
MIN_WARMUP = 1
#: Seed of the order within each round (:func:`round_order`).
ORDER_SEED = 41


@dataclass(frozen=True)
class Summary:
    """Statistics of one system's samples, in one unit.

    Attributes
    ----------
    median, min, max : float
    repeats : int
        Number of samples.
    samples : tuple of float
        The samples themselves, in the order measured (round by round when the systems were
        interleaved): the spread of a ratio is computed from them. Not compared by ``==``.
    """

    median: float
    min: float
    max: float
    repeats: int
    samples: tuple[float, ...] = field(default=(), compare=False)

    def scaled(self, factor: float) -> Summary:
        """The same statistics multiplied by ``factor`` (a unit change)."""
        return Summary(self.median * factor, self.min * factor, self.max * factor, self.repeats,
                       tuple(v * factor for v in self.samples))


def summarize(samples: Sequence[float]) -> Summary:
    """Median, min and max of ``samples`` (kept too, in order).

    Raises
    ------
    ValueError
        For no samples.
    """
    if not samples:
        raise ValueError("no samples to summarize (got an empty list); measure at least once")
    return Summary(float(statistics.median(samples)), float(min(samples)),
                   float(max(samples)), len(samples), tuple(float(v) for v in samples))


def single(value: float) -> Summary:
    """The statistics of one measurement (a memory size, read once)."""
    return Summary(value, value, value, 1, (value,))


def device_sync() -> None:
    """Wait for all work on the current device (CuPy's and PyTorch's share the context)."""
    import cupy

    cupy.cuda.runtime.deviceSynchronize()


def host_batch(fn: Callable[[], object], calls: int, sync: Callable[[], None] = device_sync,
               *, include_sync: bool = False) -> float:
    """Seconds per call of ``calls`` calls of ``fn``, timed with ``perf_counter``.

    Parameters
    ----------
    fn : callable
        Issues one call's work.
    calls : int
        Calls in the batch.
    sync : callable
        Waits for the device; run before the batch (so earlier work is not billed to it)
        and after it.
    include_sync : bool
        Stop the clock after the final synchronization (wall time, throughput) instead of
        before it (host issue time).
    """
    sync()
    start = perf_counter()
    for _ in range(calls):
        fn()
    if include_sync:
        sync()
        return (perf_counter() - start) / calls
    elapsed = perf_counter() - start
    sync()
    return elapsed / calls


def timed_once(fn: Callable[[], object], sync: Callable[[], None] = device_sync) -> float:
    """Wall seconds of one call of ``fn``, synchronized before and after."""
    sync()
    start = perf_counter()
    fn()
    sync()
    return perf_counter() - start


_spin_kernel = None
_SPIN_SOURCE = r"""
extern "C" __global__ void cgrt_bench_spin(long long cycles) {
    long long start = clock64();
    while (clock64() - start < cycles) { }
}
"""


def _spin():
    global _spin_kernel
    if _spin_kernel is None:
        import cupy

        _spin_kernel = cupy.RawKernel(_SPIN_SOURCE, "cgrt_bench_spin")
    return _spin_kernel


def gpu_batch(fn: Callable[[], object], calls: int, stream,
              *, head_start_cycles: int = HEAD_START_CYCLES) -> float:
    """Device seconds per call of ``calls`` calls of ``fn``, from CUDA events.

    Parameters
    ----------
    fn : callable
        Issues one call's work on ``stream``.
    calls : int
        Calls in the batch.
    stream : cupy.cuda.Stream or int
        The stream ``fn`` issues on (an ``int`` is a raw handle, e.g. a torch stream's
        ``cuda_stream``).
    head_start_cycles : int
        Cycles the spin kernel holds the stream before the start event.
    """
    import cupy
    import numpy as np

    if isinstance(stream, int):
        stream = cupy.cuda.ExternalStream(stream)
    start, end = cupy.cuda.Event(), cupy.cuda.Event()
    with stream:
        _spin()((1,), (1,), (np.int64(head_start_cycles),))
        start.record(stream)
        for _ in range(calls):
            fn()
        end.record(stream)
    end.synchronize()
    return cupy.cuda.get_elapsed_time(start, end) * 1e-3 / calls


def rounds(repeats: int, warmup: int) -> tuple[int, int]:
    """``(repeats, warmup)`` raised to :data:`MIN_ROUNDS` and :data:`MIN_WARMUP`."""
    return max(repeats, MIN_ROUNDS), max(warmup, MIN_WARMUP)


def round_order(names: Sequence[str], round_index: int) -> list[str]:
    """The order the systems of a row run in, in round ``round_index``: shuffled per round.

    A fixed order would bill whatever one system leaves behind (caches, clocks, a deferred
    teardown) to the one after it, every round. The shuffle is seeded by the round, so a
    rerun, and every rank of a distributed run, takes the same order.
    """
    order = list(names)
    random.Random(ORDER_SEED * 1_000_003 + round_index).shuffle(order)
    return order


def interleave(batches: Mapping[str, Callable[[], float]], repeats: int, *, warmup: int = 2,
               on_error: Callable[[str, BaseException], None]) -> dict[str, list[float]]:
    """Run one batch of each system per round, in :func:`round_order`: ``warmup`` untimed
    rounds, then ``repeats`` timed ones (at least :data:`MIN_WARMUP` and :data:`MIN_ROUNDS`).

    Parameters
    ----------
    batches : mapping of str to callable
        Per system, a callable that runs one batch and returns its seconds per call.
    repeats : int
        Timed rounds.
    warmup : int
        Rounds whose results are dropped (kernel compilation, caches, clocks).
    on_error : callable
        Called with the system and the exception when a batch raises; that system then
        leaves the rotation and gets no samples.

    Returns
    -------
    dict of str to list of float
        The samples of each system that never failed, in round order (the i-th samples of
        two systems were taken in the same round).
    """
    repeats, warmup = rounds(repeats, warmup)
    live = dict(batches)
    samples: dict[str, list[float]] = {name: [] for name in live}
    for round_index in range(warmup + repeats):
        for name in round_order(list(live), round_index):
            batch = live[name]
            try:
                value = batch()
            except Exception as exc:  # noqa: BLE001 - one system's failure ends only its row cell
                on_error(name, exc)
                del live[name]
                del samples[name]
                continue
            if round_index >= warmup:
                samples[name].append(value)
    return samples
