"""Hang watchdog for replays of graphs that hold collectives (opt-in).

Torch's NCCL watchdog never sees collectives inside replayed graphs (it would query events
recorded during capture, which CUDA forbids), so a rank whose peer does not replay waits
forever, usually inside ``cudaStreamSynchronize`` or ``.item()`` where no Python code runs.
This watchdog covers that case when a timeout is set (``CUGRAPHRT_COLLECTIVE_TIMEOUT=seconds``
or :func:`set_collective_timeout`, before the graphs are captured):

* after each replay of such a graph, one event is recorded on the replay stream (no
  allocation: events are recycled) and handed to a watcher thread;
* the watcher polls the events (``cudaEventQuery``, in relaxed capture mode so that another
  thread's capture is unaffected). An event still pending ``timeout`` seconds after its
  replay means the graph's collectives are stuck: the watcher prints every thread's Python
  stack, aborts the communicator in a daemon thread (NCCL's abort flag makes the stuck
  kernels return, which unblocks the waiting host call; the abort itself then waits for the
  graphs to be released, hence the daemon thread), and raises
  :class:`~cugraphrt.errors.CollectiveTimeoutError` in the thread that replayed the graph,
  as soon as that thread runs Python again;
* loops whose bodies hold collectives are stopped (``cugraphrt._cuda.conditional.stop_loops``):
  a loop that runs on alone on one rank ends after the iteration underway;
* every later replay of a watched graph raises the same error.

With no timeout set, nothing of this exists: graphs replay exactly as before.
"""

from __future__ import annotations

import collections
import ctypes
import faulthandler
import os
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from cugraphrt._cuda import conditional as _conditional
from cugraphrt._cuda import runtime as _cuda
from cugraphrt._memory.backing import _on_device
from cugraphrt.distributed.log import CollectiveLog
from cugraphrt.errors import CollectiveTimeoutError, OptionsError

__all__ = ["ENV", "collective_timeout", "set_collective_timeout", "watch", "guard_capture",
           "pending_error", "reset"]

#: The environment variable that turns the watchdog on: a timeout in seconds.
ENV = "CUGRAPHRT_COLLECTIVE_TIMEOUT"
_POLL_S = 0.005
_UNSET = object()
_timeout: Any = _UNSET


def _parse(value: Any, where: str) -> float | None:
    if value is None or value == "" or value == "0":
        return None
    try:
        seconds = float(value)
    except (TypeError, ValueError):
        seconds = -1.0
    if not seconds > 0:
        raise OptionsError(where, value, "a number of seconds > 0 (or 0/None for off)")
    return seconds


def collective_timeout() -> float | None:
    """The watchdog's timeout in seconds, or None when it is off (the default)."""
    global _timeout
    if _timeout is _UNSET:
        _timeout = _parse(os.environ.get(ENV), ENV)
    return _timeout


def set_collective_timeout(seconds: float | None) -> None:
    """Turn the hang watchdog on (``seconds`` > 0) or off (None) for graphs captured later.

    Parameters
    ----------
    seconds : float or None
        How long a replay of a graph holding collectives may run before the watchdog aborts
        the communicator and raises :class:`~cugraphrt.errors.CollectiveTimeoutError`. Also
        the time the cross-rank check waits for the other ranks.

    Raises
    ------
    OptionsError
        For anything but a positive number or None.
    """
    global _timeout
    _timeout = _parse(seconds, "seconds")


class _Entry:
    __slots__ = ("event", "deadline", "started", "log", "thread", "stream", "device")

    def __init__(self, event: int, timeout: float, log: CollectiveLog, stream: int,
                 device: int) -> None:
        self.started = time.monotonic()
        self.deadline = self.started + timeout
        self.event = event
        self.log = log
        self.thread = threading.get_ident()
        self.stream = stream
        self.device = device


class _Watcher:
    """The watcher thread and its queues: one queue per stream, in replay order."""

    def __init__(self) -> None:
        self.queues: dict[tuple[int, int], collections.deque] = {}
        self.free: dict[int, collections.deque] = {}  # recycled events, per device
        self.lock = threading.Lock()
        self.wake = threading.Event()
        self.error: CollectiveTimeoutError | None = None
        self.thread: threading.Thread | None = None
        self.idle = True

    def add(self, stream: int, device: int, log: CollectiveLog, timeout: float) -> None:
        free = self.free.get(device)
        if free:
            event = free.popleft()
        else:
            with _on_device(device):  # an event belongs to the device it was made on
                event = _cuda.event_create()
        _cuda.event_record(event, stream)
        queue = self.queues.get((device, stream))
        if queue is None:
            with self.lock:
                queue = self.queues.setdefault((device, stream), collections.deque())
                if self.thread is None:
                    self.thread = threading.Thread(target=self._run, daemon=True,
                                                   name="cugraphrt-collective-watchdog")
                    self.thread.start()
        queue.append(_Entry(event, timeout, log, stream, device))
        if self.idle:  # waking a busy watcher costs a lock per replay for nothing
            self.wake.set()

    def _run(self) -> None:
        # This thread only queries events: let it do so while other threads capture.
        mode = ctypes.c_int(2)
        _cuda.driver().exchange_mode(ctypes.byref(mode))
        while self.error is None:
            if self._poll():
                time.sleep(_POLL_S)
                continue
            self.idle = True  # an entry added from now on wakes it (at worst 0.1 s later)
            self.wake.wait(0.1)
            self.wake.clear()
            self.idle = False

    def _poll(self) -> bool:
        """One pass over the queues; True while replays are pending."""
        pending = False
        now = time.monotonic()
        for queue in list(self.queues.values()):
            while queue:
                entry = queue[0]
                if not _cuda.event_done(entry.event):
                    pending = True
                    if now > entry.deadline:
                        self._expire(entry, now)
                        return False
                    break
                queue.popleft()
                self.free.setdefault(entry.device, collections.deque()).append(entry.event)
        return pending

    def _expire(self, entry: _Entry, now: float) -> None:
        log = entry.log
        exchanger = log.exchanger
        error = CollectiveTimeoutError(
            f"{exchanger.describe()}: {log.describe()} did not finish within "
            f"{entry.deadline - entry.started:g} s of its replay (got it still running on "
            f"stream 0x{entry.stream:x} of device {entry.device} after "
            f"{now - entry.started:.1f} s); another rank did not replay the same graph, "
            f"replayed graphs in another order, or is stuck: compare every rank's stacks. The "
            f"communicator was aborted: restart the process group (or the processes)")
        self.fire(error, exchanger, entry.thread)

    def fire(self, error: CollectiveTimeoutError, exchanger: Any, thread: int) -> None:
        """Report ``error`` with every thread's stack, abort, raise it in ``thread``."""
        if self.error is not None:
            return
        self.error = error
        print(f"cugraphrt collective watchdog: {error}\nPython stacks of every thread:",
              file=sys.stderr, flush=True)
        try:
            faulthandler.dump_traceback(file=sys.stderr, all_threads=True)
        except (OSError, ValueError, AttributeError):  # no usable stderr file descriptor
            pass
        # Loops whose bodies hold collectives end after the iteration underway (its
        # collectives return once the communicator is aborted), instead of running on.
        _conditional.stop_loops()
        threading.Thread(target=_abort_quietly, args=(exchanger,), daemon=True,
                         name="cugraphrt-collective-abort").start()
        _raise_in(thread, error)


def _abort_quietly(exchanger: Any) -> None:
    try:
        exchanger.abort()
    except Exception as exc:  # noqa: BLE001 - a thread of our own: report, do not die loudly
        print(f"cugraphrt collective watchdog: aborting the communicator failed: {exc}",
              file=sys.stderr, flush=True)


def _raise_in(thread_id: int, error: CollectiveTimeoutError) -> None:
    """Raise ``error`` in ``thread_id`` when it next runs Python (after the abort unblocks
    it). CPython raises asynchronous exceptions by class, so the message travels in a
    subclass made for this error."""
    message = str(error)

    def init(self, *args) -> None:
        CollectiveTimeoutError.__init__(self, *(args or (message,)))

    carrier = type("CollectiveTimeoutError", (CollectiveTimeoutError,), {"__init__": init})
    ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(thread_id),
                                               ctypes.py_object(carrier))


_watcher = _Watcher()


def watch(stream: int, device: int, log: CollectiveLog, timeout: float) -> None:
    """After a replay of ``log``'s graph on ``stream``: watch it (see the module docstring)."""
    _watcher.add(stream, device, log, timeout)


def guard_capture(what: str, exchanger: Any) -> Callable[[], None]:
    """Watch a capture that may issue collectives; returns the function that ends the watch.

    Nothing runs on the GPU during a capture, but a collective's first use of a size or
    algorithm makes NCCL connect to its peers from the host, which blocks while a peer does
    not capture the same collective. With a timeout set, a capture still underway after it
    fires like a stuck replay; without one this returns a no-op.
    """
    timeout = collective_timeout()
    if timeout is None:
        return _no_watch
    thread = threading.get_ident()
    started = time.monotonic()

    def expire() -> None:
        _watcher.fire(CollectiveTimeoutError(
            f"{exchanger.describe()}: {what} did not finish within {timeout:g} s (got it still "
            f"capturing after {time.monotonic() - started:.1f} s); a collective inside it "
            f"waits for a peer that does not capture the same collective (NCCL connects to "
            f"its peers on a collective's first use: warm every collective up on every rank "
            f"before capturing): compare every rank's stacks. The communicator was aborted"),
            exchanger, thread)

    timer = threading.Timer(timeout, expire)
    timer.daemon = True
    timer.start()
    return timer.cancel


def _no_watch() -> None:
    return None


def pending_error() -> CollectiveTimeoutError | None:
    """The watchdog's error once it fired (then every watched replay raises it), or None."""
    return _watcher.error


def reset() -> None:
    """Forget a fired error and the pending replays (for tests, and after the process group
    was restarted)."""
    global _watcher
    _conditional.stop_loops(False)
    old, _watcher = _watcher, _Watcher()
    old.error = old.error or CollectiveTimeoutError("watchdog reset")  # stops its thread
    old.wake.set()
