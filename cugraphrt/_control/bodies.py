"""The bodies of loops and branches being captured, and what a body may hold.

A conditional body can hold kernel, memcpy, memset, empty, child-graph and conditional nodes
only (see :mod:`cugraphrt._cuda.graph_nodes`); CUDA refuses anything else when the whole
graph is instantiated, without saying which node. Two things follow.

* **Collectives in bodies.** NCCL (2.19 and newer, with its default graph-mixing support)
  brackets every captured collective with a wait on an external event and a record of it,
  so that graph launches and eager launches of one communicator run in one order even on
  different streams. Those two nodes are what make ``torch.cond`` with NCCL fail to
  instantiate (pytorch/pytorch#180960). cugraphrt notes the nodes a collective adds to a
  body while it is issued (:func:`collective_call`, used by
  :class:`cugraphrt.distributed.Collectives` and by adapters), and when the body's capture
  has ended takes the event nodes out, keeping the order of what was before and after
  them (:func:`finish`). The kernel then runs where the stream put it, exactly as with
  ``NCCL_GRAPH_MIXING_SUPPORT=0``, for those collectives only and without a process-wide
  setting; what the events did is then the stream's job: replay the graph on a stream that
  is ordered with the communicator's eager work (the one eager collectives use, or after a
  synchronization). Nothing is taken out while the body is still captured: NCCL keeps the
  nodes of a capture underway as the dependencies of its next collective.
* **A loop that runs on alone.** A loop whose body holds collectives reads the process's stop
  flag at each condition (:func:`cugraphrt._cuda.conditional.stop_loops`): when the collective
  watchdog aborts a communicator, such loops end after the iteration underway instead of
  running on forever on a rank whose peers stopped.
* **Anything else a body cannot hold** (a host node, an external event of the user's) is a
  :class:`~cugraphrt.errors.CaptureError` at the end of the body, naming the node kinds and,
  when a collective added them, the collective.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from typing import Any, NamedTuple

from cugraphrt._cuda import graph_nodes as _nodes
from cugraphrt.errors import CaptureError

__all__ = ["Body", "BodyNodes", "open_bodies", "innermost", "scope", "collective_call",
           "finish"]

_ALLOWED = "kernel, memcpy, memset, empty, child-graph and conditional nodes"


class BodyNodes(NamedTuple):
    """What one captured body holds (``Graph.body_nodes``)."""

    #: ``"while_loop body"``, ``"cond body"``, ``"cond else body"``; a nested body's label
    #: names the bodies around it first, joined by ``" > "``.
    label: str
    #: The kinds of its nodes, sorted, child graphs' included (``KERNEL``, ``MEMCPY``, ...).
    kinds: tuple[str, ...]
    #: Event nodes of collectives taken out of it.
    taken_out: int


class Body:
    """One body being captured on this thread."""

    __slots__ = ("capture", "stream_ptr", "graph", "label", "added", "collectives", "slot")

    def __init__(self, capture: Any, stream_ptr: int, graph: Any, label: str) -> None:
        self.capture = capture
        self.stream_ptr = stream_ptr
        self.graph = graph
        self.label = label  # "while_loop body", "cond body", "cond else body"
        # (what issued them, the nodes it added): collectives issued in this body
        self.added: list[tuple[str, list]] = []
        # Collectives issued in this body or in bodies nested in it.
        self.collectives = 0
        # Its place in the capture's list of bodies (the order bodies begin in).
        self.slot = len(capture.bodies)
        capture.bodies.append(None)


class _Open(threading.local):
    def __init__(self) -> None:
        self.stack: list[Body] = []


_open = _Open()


def open_bodies() -> list[Body]:
    """This thread's bodies being captured, innermost last (the list itself)."""
    return _open.stack


def innermost() -> Body | None:
    """The body this thread captures into now, or None outside bodies."""
    stack = _open.stack
    return stack[-1] if stack else None


def scope() -> str:
    """Where work issued now lands: ``""`` outside bodies, else the bodies, outermost first
    (``"while_loop body > cond body"``). Recorded with each collective, so that the ranks'
    graphs are compared body by body."""
    return " > ".join(body.label for body in _open.stack)


@contextlib.contextmanager
def collective_call(what: str) -> Iterator[None]:
    """Around the issue of one collective (``what`` describes it): inside a body, note the
    nodes it adds, for :func:`finish`. Outside bodies it does nothing."""
    body = innermost()
    if body is None:
        yield
        return
    for each in _open.stack:
        each.collectives += 1
    before = {_nodes.key(n) for n in _nodes.nodes(body.graph)}
    yield
    added = [n for n in _nodes.nodes(body.graph) if _nodes.key(n) not in before]
    body.added.append((what, added))


def finish(body: Body) -> BodyNodes:
    """After the body's capture ended: take out the event nodes its collectives added, then
    refuse what a body cannot hold. Records and returns what the body holds."""
    removed = 0
    from_collectives: dict[int, str] = {}
    for what, added in body.added:
        for node in added:
            if _nodes.kind(node) in _nodes.EVENT_KINDS:
                _nodes.remove_keeping_order(body.graph, node)
                removed += 1
            else:
                from_collectives[_nodes.key(node)] = what
    bad = _forbidden(body.graph, from_collectives)
    if bad:
        raise CaptureError(_forbidden_message(body.label, bad))
    label = scope() if innermost() is body else body.label  # still open: its whole path
    report = BodyNodes(label, tuple(_nodes.kinds(body.graph)), removed)
    body.capture.bodies[body.slot] = report
    return report


def _forbidden(graph: Any, sources: dict[int, str]) -> list[tuple[str, str]]:
    """(kind, who added it) of every node a body cannot hold, child graphs included."""
    return [(name, sources.get(_nodes.key(node), "")) for node, name, _ in _nodes.walk(graph)
            if name in _nodes.NOT_IN_BODIES]


def _forbidden_message(label: str, bad: list[tuple[str, str]]) -> str:
    kinds = sorted({name for name, _ in bad})
    collectives = sorted({who for _, who in bad if who})
    got = ", ".join(kinds) + (" node" if len(kinds) == 1 else " nodes")
    if collectives:
        source = f" added by {'; '.join(collectives)}"
        fix = ("NCCL drives this communicator's transport from a host thread here (its "
               "proxy: a network or shared-memory path between the ranks), which a device-side "
               "loop cannot call. Issue this collective outside the loop or branch, or run the "
               "ranks on GPUs of one host that reach each other directly (NVLink or PCIe peer "
               "access: leave NCCL_P2P_DISABLE unset)")
    else:
        source = ""
        fix = ("a host function (cudaLaunchHostFunc), an event record or wait across graphs "
               "(cudaEventRecordExternal, cudaEventWaitExternal), an external semaphore or a "
               "graph-owned allocation cannot run inside a device-side loop or branch; move "
               "it before or after the loop")
    return (f"a {label} can hold only {_ALLOWED} (got {got}{source}); {fix}")
