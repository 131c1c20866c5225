"""The collectives torch issues during a cugraphrt_torch capture, recorded and checked.

Every ``torch.distributed`` collective reaches the dispatcher as a ``c10d`` operation
(``c10d.allreduce_``, ``c10d.broadcast_``, ...; the functional collectives as
``_c10d_functional`` ones), whoever issues it: ``dist.all_reduce`` in user code, the
differentiable collectives of ``torch.distributed.nn``, DDP's reducer in C++. A
``TorchDispatchMode`` active during the capture sees them all, backward ones included: the
autograd engine runs a backward with the thread-local state of the thread that called it
(dispatch modes among it), also on its device threads. The mode records each one into the
capture's :class:`~cugraphrt.distributed.log.CollectiveLog`; when the capture ends the graph is
armed (:func:`arm`): checked across ranks through the process group's store before its first
replay, watched afterwards if a collective timeout is set, and released before its process
group shuts down (see :mod:`cugraphrt_torch.capture._lifecycle`).

The mode is only active while ``torch.distributed`` is initialized; set
``CUGRAPHRT_CHECK_COLLECTIVES=0`` to turn recording off (no check, no release).
"""

from __future__ import annotations

import contextlib
import os
import weakref
from collections.abc import Iterator
from typing import Any

import torch

from cugraphrt.adapter import collectives as _collectives
from cugraphrt.adapter import control as _control

from .._internals import distributed as _distributed
from .._internals import ops as _ops
from . import _torch

__all__ = ["prepare", "recording", "arm", "describe_op", "TorchExchanger"]

_Tensor = torch.Tensor
_TENSOR_DISPATCH = torch.Tensor.__torch_dispatch__
_NAMESPACES = ("c10d", "_c10d_functional")

# c10d op -> (kind, index of the tensor argument every rank passes alike or None).
_C10D = {
    "allreduce_": ("all_reduce", 0), "allreduce_coalesced_": ("all_reduce_coalesced", 0),
    "allgather_": ("all_gather", 1), "_allgather_base_": ("all_gather_into_tensor", 1),
    "allgather_coalesced_": ("all_gather_coalesced", 1),
    "allgather_into_tensor_coalesced_": ("all_gather_into_tensor_coalesced", 1),
    "reduce_scatter_": ("reduce_scatter", 0), "_reduce_scatter_base_": ("reduce_scatter_tensor", 0),
    "reduce_scatter_tensor_coalesced_": ("reduce_scatter_tensor_coalesced", 0),
    "broadcast_": ("broadcast", 0), "reduce_": ("reduce", 0), "gather_": ("gather", 1),
    "scatter_": ("scatter", 0), "alltoall_": ("all_to_all", None),
    "alltoall_base_": ("all_to_all_single", None), "send": ("send/recv", 0),
    "recv_": ("send/recv", 0), "recv_any_source_": ("send/recv", 0), "barrier": ("barrier", None),
}
_ROOTED = ("broadcast", "reduce", "gather", "scatter")
_RED_OPS: dict[int, str] = {}


def _reduce_name(op: Any) -> str:
    if not _RED_OPS:
        members: Any = torch.distributed.ReduceOp.RedOpType.__members__
        for name, value in members.items():
            _RED_OPS[int(value)] = name.lower()
    kind = _distributed.reduce_op_kind(op)
    # An op object this torch does not let us read (2.8): compare the collective kind only.
    return "op" if kind is None else _RED_OPS.get(kind, "op")


def _tensors(value: Any) -> list:
    if isinstance(value, _Tensor):
        return [value]
    if isinstance(value, (list, tuple)):
        return [t for item in value for t in _tensors(item)]
    return []


def _script_type(value: Any) -> str:
    return _distributed.script_type_name(value)


def _group_name(value: Any) -> str:
    """A c10d ProcessGroup argument (a TorchBind object) as its group name."""
    ProcessGroup = _distributed.process_group_class()
    try:
        return str(ProcessGroup.unbox(value).group_name)
    except Exception:  # noqa: BLE001 - no unbox in this torch: fall back to the default
        return _distributed.default_group_name()


def describe_op(func: Any, args: tuple) -> Any:
    """The :class:`Collective` a ``c10d``/``_c10d_functional`` operation issues, or None
    for one that issues none (``wait_tensor``, ...)."""
    name = _ops.op_name(func)
    if func.namespace == "_c10d_functional":
        if name.startswith("wait") or "wrap" in name:
            return None
        strings = [a for a in args if isinstance(a, str)]
        tensors = _tensors(args[0]) if args else []
        detail = strings[0] if len(strings) > 1 else ""
        group = strings[-1] if strings else "?"
        kind, symmetric = name.rstrip("_"), tensors
    else:
        if name not in _C10D:
            return None
        kind, index = _C10D[name]
        symmetric = _tensors(args[index]) if index is not None else []
        group, op, root = "?", "", ""
        for arg in args:
            typename = _script_type(arg)
            if typename.endswith("ProcessGroup"):
                group = _group_name(arg)
            elif typename.endswith("ReduceOp"):
                op = _reduce_name(arg)
            elif (group != "?" and kind in _ROOTED and not root and isinstance(arg, int)
                  and not isinstance(arg, bool)):
                root = f"root {arg}"  # the first int after the group: the root rank
        detail = " ".join(part for part in (op, root) if part)
    dtype = str(symmetric[0].dtype).replace("torch.", "") if symmetric else "-"
    count = sum(t.numel() for t in symmetric) if symmetric else -1
    return _collectives.Collective(kind, dtype, count, group, detail)


class _Recorder(_ops.TorchDispatchMode):
    """Records the collectives dispatched while a capture is underway (see the module)."""

    def __init__(self, capture: Any) -> None:
        super().__init__()
        self.capture = capture

    @classmethod
    def ignore_compile_internals(cls) -> bool:
        # Compiled code still runs compiled under this mode (dynamo skips frames under modes
        # that do not say this), and its collectives still reach the dispatcher.
        return True

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        # A tensor subclass (DTensor) turns into plain ops and collectives itself: let it,
        # and see what it issues.
        for t in types:
            if getattr(t, "__torch_dispatch__", _TENSOR_DISPATCH) is not _TENSOR_DISPATCH:
                return NotImplemented
        collective = describe_op(func, args) if func.namespace in _NAMESPACES else None
        if collective is None:
            return func(*args, **(kwargs or {}))
        # In a loop or branch body, the core takes out the event nodes NCCL adds (a body
        # cannot hold them): it must see them added.
        with _control.collective_call(collective.describe()):
            out = func(*args, **(kwargs or {}))
        _collectives.log_for(self.capture, TorchExchanger()).add(collective)
        return out


def enabled() -> bool:
    """Whether captures record collectives now (torch.distributed is initialized)."""
    if os.environ.get("CUGRAPHRT_CHECK_COLLECTIVES", "1") == "0":
        return False
    dist = torch.distributed
    return bool(dist.is_available() and dist.is_initialized())


_prepared = False


def prepare() -> None:
    """Load what the recorder's first use loads, before a capture begins.

    A dispatch mode's first activation and first dispatched operation import parts of
    torch (``torch._dynamo`` among them: seconds in a cold process, enough to trip a 3 s
    capture watchdog on an H100 host) that would otherwise load inside the capture, where
    the capture's collective watchdog counts them and where nothing slow belongs.
    """
    global _prepared
    if _prepared or not enabled():
        return
    with _Recorder(None):
        torch.zeros(1).add_(1)  # one CPU operation through the mode: nothing is recorded
    _prepared = True


@contextlib.contextmanager
def recording(capture: Any) -> Iterator[None]:
    """Record ``capture``'s collectives while the block runs (nothing without a process
    group); with a collective timeout set, watch the capture itself too (see
    :func:`cugraphrt.distributed.watchdog.guard_capture`)."""
    if not enabled():
        yield
        return
    stop = _no_guard
    if _collectives.collective_timeout() is not None:
        world = TorchExchanger()
        world_group: Any = torch.distributed.group.WORLD
        world.bind(frozenset({str(world_group.group_name)}))
        stop = _collectives.guard_capture("a capture with torch.distributed initialized", world)
    try:
        with _Recorder(capture):
            yield
    finally:
        stop()


def _no_guard() -> None:
    return None


_counters: dict[str, int] = {}


class TorchExchanger:
    """The ranks of a torch graph's groups, reached through the default process group's
    store (a TCP store on the host: a missing rank makes it time out, never hang)."""

    def __init__(self) -> None:
        self.groups: tuple[str, ...] = ()
        self.rank = 0
        self.ranks: tuple[int, ...] = (0,)
        self.key = ""

    def bind(self, groups: frozenset[str]) -> None:
        """Resolve the groups the graph's collectives use to their global ranks."""
        dist = torch.distributed
        self.groups = tuple(sorted(groups))
        ranks: set[int] = set()
        for name in self.groups:
            ranks.update(dist.get_process_group_ranks(self._resolve(name)))
        self.rank = dist.get_rank()
        self.ranks = tuple(sorted(ranks)) or (self.rank,)
        self.key = "+".join(self.groups)

    @staticmethod
    def _resolve(name: str) -> Any:
        return _distributed.resolve_process_group(name)

    def next_index(self) -> int:
        index = _counters.get(self.key, 0)
        _counters[self.key] = index + 1
        return index

    def exchange(self, tag: str, payload: bytes, timeout_s: float) -> dict[int, bytes]:
        if len(self.ranks) == 1:
            return {self.rank: payload}
        store = _distributed.default_store()
        return _collectives.exchange_over_store(
            store, f"cugraphrt/collectives/{self.key}/{tag}", self.rank,
                                   self.ranks, payload, timeout_s)

    def default_timeout_s(self) -> float:
        try:
            store: Any = _distributed.default_store()
            return float(store.timeout.total_seconds())
        except Exception:  # noqa: BLE001 - no store timeout to read: torch's NCCL default
            return 600.0

    def abort(self) -> None:
        for name in self.groups:
            self._resolve(name).abort()

    def describe(self) -> str:
        groups = ", ".join(repr(g) for g in self.groups)
        return f"rank {self.rank} of ranks {list(self.ranks)} (group {groups})"


def arm(cuda_graph: Any, log: Any, replay: Any, torch_graph: Any, device: int) -> None:
    """Arm an adopted torch graph whose capture recorded collectives (see the module)."""
    from . import _lifecycle

    exchanger = log.exchanger
    if isinstance(exchanger, TorchExchanger):
        exchanger.bind(log.groups)
    log.seal()
    _collectives.track(cuda_graph, log)
    ref = weakref.ref(torch_graph)

    def reset_torch_graph() -> None:
        graph = ref()
        if graph is not None:
            graph.reset()  # whoever else still holds it: NCCL waits for this

    log.release_hooks.append(reset_torch_graph)

    def install(steady) -> None:
        replay._replay = steady

    def stream_of() -> int:
        return _torch.current_torch_stream_ptr(device)

    replay._replay = _collectives.first_replay(log, replay._replay, install, stream_of, device)
    _lifecycle.install()
