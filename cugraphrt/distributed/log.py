"""What collectives a captured graph holds, and which live graphs hold any.

A graph that holds NCCL collectives is a collective object: every rank must have captured the
same collectives (kind, dtype, count, order, group) and must replay it. cugraphrt records them
while a capture is underway, framework-neutrally: :class:`cugraphrt.distributed.Collectives`
records its own calls (CuPy), and ``cugraphrt_torch`` records the ``c10d`` operations torch
dispatches (see ``cugraphrt_torch.capture._collective_mode``). The record of one capture is a
:class:`CollectiveLog`; it is checked across ranks before the graph's first replay
(:mod:`cugraphrt.distributed.crossrank`) and, on request, watched during replays
(:mod:`cugraphrt.distributed.watchdog`).

This module also keeps the live graphs that hold collectives, because their lifetime is tied
to the communicator's: NCCL (2.26 and newer) does not let a communicator be destroyed while a
CUDA graph that captured its operations is alive. ``ncclCommDestroy`` and ``ncclCommAbort``
poll until those graphs are gone, so destroying the communicator first (torch's
``destroy_process_group()``, or the process group's destructor at exit) blocks forever.
:func:`release_graphs` frees such graphs first; the adapters call it before the communicator
goes, and at interpreter exit.
"""

from __future__ import annotations

import atexit
import json
import threading
import weakref
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, replace
from typing import Any, Protocol

from cugraphrt._control import bodies as _bodies

__all__ = ["Collective", "CollectiveLog", "Exchanger", "log_for", "track", "release_graphs",
           "live_graphs", "encode", "decode"]


@dataclass(frozen=True)
class Collective:
    """One collective recorded during a capture.

    Attributes
    ----------
    kind : str
        ``all_reduce``, ``all_gather``, ``reduce_scatter``, ``broadcast``, ...
    dtype : str
        Element type of the buffers, e.g. ``float32``.
    count : int
        Elements that every rank passes alike (the input of a gather, the output of a
        scatter); -1 for a kind whose sizes may differ between ranks (all-to-all).
    group : str
        The process group's name (torch) or the communicator's label (CuPy).
    detail : str
        The reduction (``sum``) and the root (``root 0``), where the kind has them.
    scope : str
        The device-side loop or branch bodies it was issued in, outermost first
        (``"while_loop body"``, ``"while_loop body > cond body"``); empty at the graph's
        top level. Filled in by :meth:`CollectiveLog.add`. A body's collectives run once
        per iteration, so comparing them with their scope compares what every iteration
        issues; how many iterations each rank runs is decided on the device, and a rank
        whose loop runs on alone is the watchdog's to catch.
    """

    kind: str
    dtype: str
    count: int
    group: str
    detail: str = ""
    scope: str = ""

    def describe(self) -> str:
        """One line, e.g. ``all_reduce float32[4096] sum on group '0'`` (and ``in a
        while_loop body``)."""
        size = f"{self.dtype}[{self.count}]" if self.count >= 0 else self.dtype
        detail = f" {self.detail}" if self.detail else ""
        where = f" in a {self.scope}" if self.scope else ""
        return f"{self.kind} {size}{detail} on group {self.group!r}{where}"


def encode(collectives: Iterable[Collective]) -> bytes:
    """The wire form of a list of collectives (JSON): what ranks exchange."""
    return json.dumps([asdict(c) for c in collectives], separators=(",", ":")).encode()


def decode(payload: bytes) -> list[Collective]:
    """The inverse of :func:`encode`."""
    return [Collective(**item) for item in json.loads(payload.decode())]


class Exchanger(Protocol):
    """How the ranks that share a graph's collectives reach each other outside NCCL streams.

    Torch's implementation goes through the process group's store; CuPy's through an eager
    NCCL all-gather of the communicator (or a store the user passes).
    """

    #: This process's rank among ``ranks``.
    rank: int
    #: Every rank that takes part, this one included (global ranks for torch).
    ranks: tuple[int, ...]

    def next_index(self) -> int:
        """The number of the next graph captured with these collectives (0, 1, ...): the same
        graph has the same number on every rank, because every rank captures in one order."""

    def exchange(self, tag: str, payload: bytes, timeout_s: float) -> dict[int, bytes]:
        """Publish ``payload`` under ``tag`` and return every rank's, by rank; raise
        :class:`cugraphrt.CaptureError` naming the ranks that did not arrive in time."""

    def default_timeout_s(self) -> float:
        """How long to wait for the other ranks when no collective timeout is set."""

    def abort(self) -> None:
        """Abort the communicator(s), so that work stuck in them returns (the watchdog)."""

    def describe(self) -> str:
        """Where this rank stands, for messages: ``rank 1 of 2 (group '0')``."""


class CollectiveLog:
    """The collectives one capture recorded, in order, and what the cross-rank check said.

    Attributes
    ----------
    entries : list of Collective
        In the order they were issued (the order NCCL runs them in).
    exchanger : Exchanger
        The first recorder's way to reach the other ranks.
    index : int
        The graph's number among the graphs captured with this exchanger (set when the
        capture ends successfully; -1 before).
    verdict : None, True or BaseException
        None before the check, True once it passed, the error it raised otherwise (raised
        again on every later replay: the graph must never run).
    """

    __slots__ = ("entries", "exchanger", "index", "verdict", "release_hooks", "__weakref__")

    def __init__(self, exchanger: Exchanger) -> None:
        self.entries: list[Collective] = []
        self.exchanger = exchanger
        self.index = -1
        self.verdict: Any = None
        # Run before the graph is reset by release_graphs (torch: reset its CUDAGraph now,
        # whoever else still references it).
        self.release_hooks: list[Callable[[], None]] = []

    def add(self, collective: Collective) -> None:
        """Record one more collective, with the bodies it is issued in (see
        :attr:`Collective.scope`)."""
        if not collective.scope:
            where = _bodies.scope()
            if where:
                collective = replace(collective, scope=where)
        self.entries.append(collective)

    @property
    def groups(self) -> frozenset[str]:
        """The groups (communicators) the collectives use."""
        return frozenset(c.group for c in self.entries)

    def seal(self) -> None:
        """The capture ended: number the graph (see :meth:`Exchanger.next_index`)."""
        if self.index < 0:
            self.index = self.exchanger.next_index()

    def describe(self, limit: int = 4) -> str:
        """``graph #2 (3 collectives: all_reduce float32[8] sum on group '0', ...)``."""
        shown = ", ".join(c.describe() for c in self.entries[:limit])
        more = f", and {len(self.entries) - limit} more" if len(self.entries) > limit else ""
        plural = "s" if len(self.entries) != 1 else ""
        return f"graph #{self.index} ({len(self.entries)} collective{plural}: {shown}{more})"


def log_for(capture: Any, exchanger: Exchanger) -> CollectiveLog:
    """The log of ``capture`` (a core Capture), created with ``exchanger`` on first use."""
    log = capture.collectives
    if log is None:
        log = capture.collectives = CollectiveLog(exchanger)
    return log


# -- live graphs that hold collectives -------------------------------------------------------
_lock = threading.Lock()
# graph -> its log. Weak keys: tracking must never keep a graph (or its memory) alive.
_live: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_atexit_registered = False


def track(graph: Any, log: CollectiveLog) -> None:
    """Remember that ``graph`` holds the collectives of ``log`` until it dies or is reset."""
    global _atexit_registered
    with _lock:
        _live[graph] = log
        if not _atexit_registered:
            # Atexit handlers run before the interpreter tears modules down, so before the
            # communicators' destructors (torch's process groups, CuPy's NcclCommunicator),
            # which would otherwise wait for these graphs forever.
            atexit.register(release_graphs)
            _atexit_registered = True


def live_graphs(groups: Iterable[str] | None = None, exchanger: Any = None
                ) -> list[tuple[Any, CollectiveLog]]:
    """The live captured graphs holding collectives, with their logs: those of ``groups``
    or of ``exchanger`` if given."""
    wanted = None if groups is None else frozenset(groups)
    with _lock:
        items = list(_live.items())
    return [(g, log) for g, log in items
            if g.is_captured and (wanted is None or log.groups & wanted)
            and (exchanger is None or log.exchanger is exchanger)]


def release_graphs(groups: Iterable[str] | None = None, *, exchanger: Any = None) -> int:
    """Reset every live graph that holds collectives (of ``groups`` or ``exchanger``, if
    given).

    Call it before the communicator is destroyed (``destroy_process_group()``,
    ``NcclCommunicator.destroy()``): NCCL waits for every graph that captured its operations
    to be destroyed first. ``cugraphrt_torch`` calls it for you when a process group shuts
    down, and at exit. A released graph raises :class:`cugraphrt.ReplayError` if replayed.
    Never raises.

    Parameters
    ----------
    groups : iterable of str, optional
        Group names (torch) or communicator labels (CuPy); every graph if omitted.
    exchanger : Exchanger, optional
        Only the graphs recorded through this one (one CuPy communicator).

    Returns
    -------
    int
        How many graphs were reset.
    """
    released = 0
    for graph, log in live_graphs(groups, exchanger):
        for hook in log.release_hooks:
            try:
                hook()
            except Exception:  # noqa: BLE001 - the graph's own reset below still runs
                pass
        try:
            graph.reset()
            released += 1
        except Exception:  # noqa: BLE001 - release what can be released
            pass
        with _lock:
            _live.pop(graph, None)
    return released
