"""Arm a graph that holds collectives: checked before its first replay, watched after each.

A graph whose capture recorded collectives (:mod:`cugraphrt.distributed.log`) gets a replay
function of its own until its first replay, which exchanges the collectives with the other
ranks (:func:`cugraphrt.distributed.crossrank.verify`) and then installs the steady replay: the
plain launch, or, with a collective timeout set, the launch followed by one event for the
watchdog (:mod:`cugraphrt.distributed.watchdog`). Graphs without collectives are never
touched, and with the watchdog off the steady replay of a core graph is its plain launch.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import Any

from cugraphrt._cuda.devices import stream_ptr
from cugraphrt.distributed import crossrank
from cugraphrt.distributed.log import CollectiveLog, track
from cugraphrt.distributed.watchdog import collective_timeout, pending_error, watch

__all__ = ["first_replay", "steady_replay", "arm_graph"]


def steady_replay(log: CollectiveLog, launch: Callable, stream_of: Callable[..., int],
                  device: int) -> Callable:
    """``launch`` itself with the watchdog off; with it on, launch, then watch the replay.

    ``stream_of`` takes the replay's arguments and returns the handle of the stream the
    graph was launched on.
    """
    timeout = collective_timeout()
    if timeout is None:
        return launch

    def watched(*args: Any, **kwargs: Any) -> None:
        error = pending_error()
        if error is not None:
            raise error
        launch(*args, **kwargs)
        watch(stream_of(*args, **kwargs), device, log, timeout)

    return watched


def first_replay(log: CollectiveLog, launch: Callable, install: Callable[[Callable], None],
                 stream_of: Callable[..., int], device: int) -> Callable:
    """The replay a graph holding collectives starts with: check across ranks, then hand
    over to :func:`steady_replay` (through ``install``) and replay."""

    settled: list[Callable] = []  # a caller that kept this function: straight through

    def replay(*args: Any, **kwargs: Any) -> None:
        if settled:
            settled[0](*args, **kwargs)
            return
        crossrank.verify(log, collective_timeout())
        steady = steady_replay(log, launch, stream_of, device)
        settled.append(steady)
        install(steady)
        steady(*args, **kwargs)

    return replay


def arm_graph(graph: Any, log: CollectiveLog) -> None:
    """Arm a core :class:`cugraphrt.Graph` through its route (``Graph._set_route``).

    The route reaches the graph through a weak reference: the graph holds its route, and
    ``g.replay`` (which holds the graph) is the only way in.
    """
    log.seal()
    track(graph, log)
    device = graph.device_id
    ref: Callable[[], Any] = weakref.ref(graph)

    def launch(stream=None) -> None:
        ref()._launch_own(stream)  # alive: the replay that called the route holds it

    def install(steady: Callable) -> None:
        target = ref()
        if target is not None:
            target._set_route(None if steady is launch else steady)

    def stream_of(stream=None) -> int:
        return stream_ptr(stream, device)

    graph._set_route(first_replay(log, launch, install, stream_of, device))
