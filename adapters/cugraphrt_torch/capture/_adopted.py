"""An adopted torch graph's lifetime and replay: what a :class:`cugraphrt.Graph` keeps of a
capture that :mod:`.capture` handed it, and what the capture hands its caller
(:class:`CapturedGraph`).

The lifetime rule (stated here once): the Graph keeps the :class:`Owner` alive until it is
reset or dropped; the owner alone keeps torch's graph, then the torch MemPool it used.
Everything else reaches torch's graph through the owner or a weak reference, and a
:class:`Replay` held elsewhere (a GraphedModule's call path, a :class:`CapturedGraph`) is
disarmed when the owner goes. A CapturedGraph keeps its Graph, hence the owner, alive: what
holds one replays a live graph until the Graph is reset.
"""

from __future__ import annotations

import weakref
from typing import Any

import cupy

from cugraphrt import Graph
from cugraphrt import adapter as core
from cugraphrt.adapter import FLAGS, check_replay_stream
from cugraphrt.errors import OptionsError, ReplayError

from . import _alloc, _torch

__all__ = ["CapturedGraph", "Owner", "Instantiate", "Replay", "replay_after_reset"]

_current_cupy_stream = cupy.cuda.get_current_stream


class Owner:
    """What an adopted Graph keeps alive: torch's graph, then the torch pool it used.

    Released in that order, so that when the pool's last user goes, torch's MemPool is
    destroyed after the graph and returns the segments to the cugraphrt pool at once. The
    replay object is disarmed first: a GraphedModule may still hold it.

    Everything else the adapter keeps reaches torch's graph through this owner or a weak
    reference (``graph.torch_graph``, ``GraphedModule.torch_graph``, the collectives' reset
    hook). So when the owner dies outside a capture, its finalizer's safe point finds the
    graph and pool unused and destroys them then: the executable and the segments go back
    when the user drops the graph, not as a cost of their next capture.
    """

    __slots__ = ("torch_graph", "pool", "mempool", "replay")

    def __init__(self, torch_graph, pool, mempool, replay) -> None:
        self.torch_graph = torch_graph
        self.pool = pool
        self.mempool = mempool
        self.replay = replay

    def __del__(self) -> None:
        replay, self.replay = self.replay, None
        if replay is not None:
            replay._replay = replay_after_reset
        self.torch_graph = None  # torch resets its graph: the pool id loses a user
        mempool, self.mempool = self.mempool, None
        try:
            _alloc.release(self.pool, mempool)
            del mempool
            _alloc.sweep_when_safe()  # torch's graph and pool die now, or after the capture
        except Exception:  # noqa: BLE001 - never raise from a finalizer
            pass
        self.pool = None


class Instantiate:
    """(Re-)instantiate through torch, which destroys the executable it replaces; returns the
    new ``cudaGraphExec_t``. The Graph drops it when it lets go of the torch graph (reset).

    It reaches torch's graph through the :class:`Owner`, never directly: the owner must hold
    the last reference besides the adapter's safe-point list, so that the graph dies in the
    owner's finalizer and not at the next capture's safe point (see :class:`Owner`).
    """

    __slots__ = ("_owner",)

    def __init__(self, owner: Owner) -> None:
        self._owner = owner

    def __call__(self) -> int:
        torch_graph = self._owner.torch_graph
        torch_graph.instantiate()
        return int(torch_graph.raw_cuda_graph_exec())


def replay_after_reset() -> None:
    raise ReplayError("replay after the graph was reset (got a released torch graph); capture "
                      "the work again")


class Replay:
    """Graph.replay for an adopted torch graph: torch's replay on the requested stream.

    Torch's replay must run with the replay stream current in torch: it writes the RNG
    offsets for this replay on torch's current stream, then launches there.
    """

    __slots__ = ("_replay", "_graph_handles", "_device")

    def __init__(self, torch_replay, handles, device: int) -> None:
        self._replay = torch_replay
        self._graph_handles = handles
        self._device = device

    def __call__(self, stream=None) -> None:
        # The graph replays on its own device (torch's replay switches to it): None means
        # CuPy's current stream of that device, whatever device is current.
        if stream is None:
            ptr = _current_cupy_stream(self._device).ptr
        else:
            try:
                ptr = _torch.stream_handle(stream)
            except AttributeError:
                raise OptionsError("stream", stream, "a cupy.cuda.Stream, a torch.cuda.Stream, "
                                   "an int handle, or None for CuPy's current stream") from None
            check_replay_stream(stream, self._device)
        checked = FLAGS.pool_checks
        if checked:
            pool, seq = self._graph_handles.pool, self._graph_handles.seq
            core.check_replay(pool, seq, ptr)
        if _torch.current_torch_stream_ptr(self._device) == ptr:
            self._replay()
        else:
            import torch

            with torch.cuda.stream(_torch.torch_stream_for(ptr, self._device)):
                self._replay()
        if checked:
            core.note_replay(pool, seq, ptr)

    def on_torch_stream(self) -> None:
        """Replay on torch's current stream (what graph_module calls)."""
        if FLAGS.pool_checks:
            self(_torch.current_torch_stream_ptr(self._device))
        else:
            self._replay()

    def launch(self) -> None:
        """Torch's replay on torch's current stream, past the pool-order checks: for callers
        that keep the pool's overwrite order themselves (call paths, bucket families)."""
        # Read at each call: a reset disarms it, the collectives' first replay swaps it.
        self._replay()


class CapturedGraph:
    """What a successful :class:`cugraphrt_torch.graph` capture hands its caller (its
    ``captured`` attribute): the graph, its replays, the memory its tensors live in and its
    number in the pool's capture order.

    It keeps ``graph`` alive, hence torch's graph and pool (the module docstring states the
    lifetime rule); after ``graph.reset()`` every replay raises :class:`cugraphrt.ReplayError`.

    Attributes
    ----------
    graph : cugraphrt.Graph
        The graph captured into.
    memory : object
        What keeps the torch MemPool the capture allocated from (see
        ``cugraphrt_torch.graph.memory``): shape buckets keep their outputs mapped with it.
    seq : int
        The capture's number in its pool's overwrite order (``cugraphrt.adapter.order_for``),
        taken as the capture ended: what a call path settles before replaying.

    Methods
    -------
    replay(stream=None)
        ``graph.replay(stream)``: through torch, with the pool-order checks of
        ``cugraphrt.set_pool_checks``.
    on_torch_stream()
        Replay on torch's current stream, with those checks when they are on.
    launch()
        Replay on torch's current stream past the checks: for callers that keep the pool's
        order themselves (a call path settles ``seq`` first; bucket graphs replay in any
        order). The hot path: one Python call into torch's replay.
    """

    __slots__ = ("graph", "memory", "seq", "replay", "on_torch_stream", "launch",
                 "_torch_graph")

    def __init__(self, graph: Graph, replay: Replay, memory: Any, seq: int,
                 torch_graph: Any) -> None:
        self.graph = graph
        self.memory = memory
        self.seq = seq
        self.replay = replay
        self.on_torch_stream = replay.on_torch_stream
        self.launch = replay.launch
        self._torch_graph = weakref.ref(torch_graph)

    @property
    def torch_graph(self) -> Any:
        """Torch's ``CUDAGraph`` that owns the capture; None once the Graph let it go."""
        return self._torch_graph()

    def __repr__(self) -> str:
        state = "live" if self._torch_graph() is not None else "reset"
        return f"<cugraphrt_torch.CapturedGraph #{self.seq} ({state})>"
