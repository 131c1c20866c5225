"""Replaying on the call's own buffers: the ``load`` step that rebinds instead of copying.

With ``inputs="rebind"``, a graphed callable does not copy its arguments into the graph's
static inputs: it points the graph at them. At capture, :func:`load_step` builds the graph's
:class:`~cugraphrt._callables.rebind_plan.RebindPlan`; if the plan is complete, every call
runs :class:`RebindIn`:

1. per argument, the comparison the copy path makes (shape, dtype, device), one more for
   the strides, and its address (C-level callables, as :class:`CopyIn`);
2. if the addresses are those of the last call, nothing else (a KV cache passed again);
3. otherwise one vectorised store of ``address + delta`` into every site, and one
   ``cuGraphExec*SetParams`` per node that holds a site (about 1.5 µs each on an H100).

An argument is copied into its static input, as before, where pointing the graph at it
could change the result: its strides differ from the capture's, or it lies in the memory of
the graph's pool (an output of this or another graph of the pool, which the replay may
overwrite before it has read it: ``x = f(x)``).

Wherever an input is copied in (the plan is incomplete, or that one input is: see above),
``inputs="rebind"`` keeps its meaning: after the replay, each copied input the graph writes
goes back to the caller's array (:class:`WriteBack`), so an in-place update lands there as
it does when the input is rebound; except an argument in the graph's pool (an earlier
output, ``x = f(x)``), whose memory the replay itself may write, as it writes its outputs.
Which inputs the graph writes is decided once, at capture:
those the plan finds in a kernel's parameters or as a copy's or a set's destination
(``RebindPlan.written``), narrowed by the framework where it knows better (torch: the
inputs whose version counter the capture moved). A framework's ``copy_changed(dst, src)``,
where it has one (CuPy's), writes only the elements that differ, so an input a kernel only
read costs a read, not a write. With ``strict=True`` an incomplete plan raises instead.

What keeps what alive: the step holds the arrays of its latest call until the next call,
because the executable points at them; a direct ``Graph.replay()`` afterwards reads those.
If the plan is incomplete, :func:`load_step` returns the copying step and warns once, naming
why (``explain``).
"""

from __future__ import annotations

import os
import warnings
from bisect import bisect_right
from collections.abc import Sequence
from typing import Any

import numpy

from cugraphrt._callables.call_path import CopyIn, Mismatch, check_constants, split_leaves
from cugraphrt._callables.rebind_plan import RebindPlan, build_plan
from cugraphrt._cuda.conditional import driver_api
from cugraphrt.errors import CaptureError, OptionsError

__all__ = ["INPUT_MODES", "RebindIn", "CopyBack", "WriteBack", "load_step",
           "check_inputs_mode", "plan_for", "rebind_step", "with_write_back", "outside_pool",
           "min_bytes", "MIN_BYTES_ENV"]

INPUT_MODES = ("copy", "rebind")
_array = numpy.array
_int64 = numpy.int64
_uint64 = numpy.uint64
_FEW = 16
MIN_BYTES_ENV = "CUGRAPHRT_REBIND_MIN_BYTES"
DEFAULT_MIN_BYTES = 1 << 20


def check_inputs_mode(inputs: object) -> str:
    """``inputs`` as given, or OptionsError naming the allowed values."""
    if inputs not in INPUT_MODES:
        raise OptionsError("inputs", inputs, "allowed values are 'copy' and 'rebind'")
    return str(inputs)


class RebindIn:
    """The ``load`` step of a complete plan (see the module docstring).

    Parameters
    ----------
    framework : cugraphrt.adapter.Framework
        Supplies ``array_type``, ``signature``, ``strides``, ``address`` and ``copy``.
    leaves, paths : sequence
        The static inputs as captured and their places, as for :class:`CopyIn`.
    plan : RebindPlan
        Complete; its inputs are the array leaves, in order.
    cuda_graph : cugraphrt.Graph
        The graph the plan was made from; its executable is read on every call, so that a
        new one (``Graph.instantiate()``) is patched before its first replay.
    """

    __slots__ = ("plan", "_arrays", "_constants", "_signature", "_strides", "_address",
                 "_copy", "_statics_at", "_bound", "_exec", "_exec_obj", "_held", "_graph",
                 "_pool", "_spans", "_words", "_site_word", "_site_input", "_site_delta",
                 "_setters", "_make_exec", "_few", "_view", "copied", "writes")

    def __init__(self, framework: Any, leaves: Sequence[Any], paths: Sequence[str],
                 plan: RebindPlan, cuda_graph: Any) -> None:
        signature, strides, address = framework.signature, framework.strides, framework.address
        arrays, self._constants = split_leaves(framework, leaves, paths)
        # layout None: the input has no site, so it is always copied (see __call__); written:
        # a copy of it goes back after the replay (module docstring).
        self._arrays = tuple((i, leaf, signature(leaf),
                              strides(leaf) if plan.sites_per_input[k] else None, path,
                              plan.written[k])
                             for k, (i, leaf, path) in enumerate(arrays))
        self._signature, self._strides, self._address = signature, strides, address
        self._copy = framework.copy
        self._statics_at = [address(static) for _, static, _, _, _, _ in self._arrays]
        #: (static input, caller's array) of this call's copies the graph writes.
        self.copied: list[tuple[Any, Any]] = []
        self.writes = any(entry[5] for entry in self._arrays)
        self.plan = plan
        self._words, self._setters = plan.words, tuple(plan.setters)
        self._site_word, self._site_input = plan.site_word, plan.site_input
        self._site_delta = plan.site_delta
        # Up to _FEW sites are stored one by one through a memoryview (about 0.1 µs each);
        # more take one vectorised numpy store (a few µs, whatever the count).
        self._view: Any = (memoryview(plan.words.data).cast("B").cast("Q")
                           if len(plan.words) else None)
        self._few = (tuple(zip(plan.site_word.tolist(), plan.site_input.tolist(),
                               plan.site_delta.tolist(), strict=True))
                     if len(plan.site_word) <= _FEW else None)
        self._bound: list[int] = []
        self._exec = 0
        self._exec_obj: Any = None
        self._held: Any = None
        self._graph = cuda_graph
        self._pool = cuda_graph.pool()
        self._spans: Any = None
        self._make_exec = driver_api().CUgraphExec

    def __call__(self, leaves: Sequence[Any]) -> None:
        signature, strides, address = self._signature, self._strides, self._address
        addresses = []
        copied = self.copied
        if copied:
            copied.clear()
        for index, static, expected, layout, path, written in self._arrays:
            value = leaves[index]
            try:
                if signature(value) != expected:
                    raise Mismatch(index, path, static, value)
                at = address(value)
                # Copied: another layout than the graph reads, or an input whose address
                # appears in no node (read through a place the plan cannot see, or unused).
                if layout is None or strides(value) != layout:
                    if value is not static:
                        self._copy(static, value)
                        if written and outside_pool(self._pool, at):
                            copied.append((static, value))
                    at = address(static)
            except (AttributeError, TypeError):  # not an array of the framework
                raise Mismatch(index, path, static, value) from None
            addresses.append(at)
        if self._constants:
            check_constants(self._constants, leaves)
        self._held = leaves  # the executable points at them until the next call
        exec_handle = self._graph._handles.exec or self._graph._ready_exec("replay()")
        spans = self._pool._spans()  # cached: the same object until the pool's segments change
        if addresses != self._bound or exec_handle != self._exec or spans is not self._spans:
            self._bind(addresses, leaves, exec_handle, spans)

    def _bind(self, addresses: list[int], leaves: Sequence[Any], exec_handle: int,
              spans: tuple) -> None:
        self._spans = spans
        starts, ends, low, high = spans
        # Arguments in the pool's memory are copied. min/max first: C loops over the list,
        # and the usual answer (every argument outside the pool's span) needs no more.
        if addresses and (max(addresses) >= low and min(addresses) < high):
            self._copy_pool_arguments(addresses, leaves, starts, ends, low, high)
        if self._few is not None:  # a few sites: plain stores beat numpy's per-call cost
            words = self._view
            for word, k, delta in self._few:
                words[word] = addresses[k] + delta
        else:
            values = _array(addresses, dtype=_int64)
            self._words[self._site_word] = (values[self._site_input]
                                            + self._site_delta).view(_uint64)
        if exec_handle != self._exec:
            self._exec_obj = self._make_exec(exec_handle)
            self._exec = exec_handle
        exec_obj = self._exec_obj
        for setter in self._setters:
            setter(exec_obj)
        self._bound = addresses

    def _copy_pool_arguments(self, addresses: list[int], leaves: Sequence[Any],
                             starts: list[int], ends: list[int], low: int, high: int) -> None:
        for k, at in enumerate(addresses):
            if low <= at < high and _in_segment(starts, ends, at):
                index, static = self._arrays[k][0], self._arrays[k][1]
                if leaves[index] is not static:
                    self._copy(static, leaves[index])  # never copied back (below)
                addresses[k] = self._statics_at[k]


def _extents(framework: Any, arrays: Sequence[Any]) -> list[tuple[int, int, int]]:
    return [(framework.address(a), *framework.extent(a)) for a in arrays]


class CopyBack:
    """The ``load`` step of ``inputs="rebind"`` when the plan is incomplete: every array is
    copied in (:class:`CopyIn`), and those the graph writes are listed in ``copied`` for
    :class:`WriteBack` to copy back after the replay."""

    __slots__ = ("_copy_in", "_written", "_address", "_pool", "copied", "writes")

    def __init__(self, framework: Any, leaves: Sequence[Any], paths: Sequence[str],
                 written: Sequence[bool], cuda_graph: Any) -> None:
        self._copy_in = CopyIn(framework, leaves, paths)
        address = self._address = framework.address
        arrays, _ = split_leaves(framework, leaves, paths)
        self._written = tuple((i, leaf, address(leaf))
                              for (i, leaf, _), w in zip(arrays, written, strict=True) if w)
        self.copied: list[tuple[Any, Any]] = []
        self.writes = bool(self._written)
        self._pool = cuda_graph.pool()

    def __call__(self, leaves: Sequence[Any]) -> None:
        self._copy_in(leaves)
        copied = self.copied
        copied.clear()
        address = self._address
        for index, static, at in self._written:
            value = leaves[index]
            if value is not static and (where := address(value)) != at \
                    and outside_pool(self._pool, where):
                copied.append((static, value))


def outside_pool(pool: Any, address: int) -> bool:
    """Whether ``address`` lies outside every segment of ``pool``: an argument inside one is
    an earlier output, which the replay may write itself (never copied back to)."""
    starts, ends, low, high = pool._spans()
    return not (low <= address < high and _in_segment(starts, ends, address))


def _in_segment(starts: list[int], ends: list[int], address: int) -> bool:
    """Whether ``address`` lies in one of the sorted segments ``[starts[i], ends[i])``."""
    i = bisect_right(starts, address) - 1
    return i >= 0 and address < ends[i]


class WriteBack:
    """A replay, then each written input the load step copied in goes back to the caller's
    array (``load.copied``), on the stream the replay ran on, ordered after it."""

    __slots__ = ("_replay", "_load", "_write")

    def __init__(self, replay: Any, load: Any, write: Any) -> None:
        self._replay = replay
        self._load = load
        self._write = write

    def __call__(self) -> None:
        self._replay()
        write = self._write
        for static, value in self._load.copied:
            write(value, static)


def with_write_back(framework: Any, load: Any, replay: Any) -> Any:
    """``replay``, or a :class:`WriteBack` around it when ``load`` may copy written inputs in
    (a rebinding step whose plan lists any: ``load.writes``)."""
    if not getattr(load, "writes", False):
        return replay
    return WriteBack(replay, load, getattr(framework, "copy_changed", framework.copy))


def load_step(framework: Any, leaves: Sequence[Any], paths: Sequence[str], cuda_graph: Any,
              inputs: str, outputs: Sequence[Any] = (), *, label: str = "",
              written: Sequence[bool] | None = None, strict: bool = False) -> Any:
    """The ``load`` step of a graphed callable: :class:`CopyIn`, or for ``inputs="rebind"``
    :class:`RebindIn` (a complete plan) or :class:`CopyBack` (an incomplete one, after a
    warning naming why; ``strict`` raises instead).

    ``outputs`` are the static outputs' leaves (arrays among them are checked not to lie
    inside an input); ``cuda_graph`` must keep its graph definition (``keep_graph=True``,
    or an adapter's adopted graph); ``written`` narrows the inputs the graph writes
    (:func:`plan_for`). Build the call path's replay with :func:`with_write_back`.
    """
    if check_inputs_mode(inputs) == "copy":
        return CopyIn(framework, leaves, paths)
    plan = plan_for(framework, leaves, paths, cuda_graph, outputs, written=written)
    return rebind_step(framework, leaves, paths, cuda_graph, plan, label, strict=strict)


def rebind_step(framework: Any, leaves: Sequence[Any], paths: Sequence[str], cuda_graph: Any,
                plan: RebindPlan, label: str = "", *, strict: bool = False) -> Any:
    """:class:`RebindIn` for a complete ``plan``; otherwise :class:`CopyBack`, after warning
    once why (the plan's ``explain``).

    Raises
    ------
    CaptureError
        With ``strict``, when the plan is incomplete.
    """
    if not plan.complete:
        name = label or "graphed callable"
        if strict:
            raise CaptureError(f"{name}: inputs='rebind' cannot rebind every input "
                               f"({plan.explain([])}); graph it with inputs='copy', or with "
                               f"strict=False to copy the inputs in and the ones it writes "
                               f"back out (docs/rebinding.md)")
        warnings.warn(f"{name}: inputs='rebind' falls back to copying ({plan.explain([])}); "
                      f"the inputs the graph writes are copied back to yours after each "
                      f"replay; see docs/rebinding.md", UserWarning, stacklevel=4)
        return CopyBack(framework, leaves, paths, plan.written, cuda_graph)
    return RebindIn(framework, leaves, paths, plan, cuda_graph)


def plan_for(framework: Any, leaves: Sequence[Any], paths: Sequence[str], cuda_graph: Any,
             outputs: Sequence[Any] = (), *, written: Sequence[bool] | None = None
             ) -> RebindPlan:
    """The rebinding plan of ``cuda_graph`` for the array leaves among ``leaves``.

    ``written``, one per array leaf, narrows ``plan.written`` (what the nodes say the graph
    may write) to what the framework saw it write during the capture (torch: version
    counters); None keeps the nodes' answer.
    """
    array_type = framework.array_type
    arrays = [(leaf, path) for leaf, path in zip(leaves, paths, strict=True)
              if isinstance(leaf, array_type)]
    if not hasattr(framework, "extent") or not hasattr(framework, "strides"):
        plan = _unread(len(arrays), f"the {framework.name} framework gives no extent() and "
                                    f"strides()")
    elif not cuda_graph._handles.graph:
        plan = _unread(len(arrays), "the graph definition was not kept "
                                    "(Graph(keep_graph=True))")
    else:
        out = [(*framework.extent(o), f"output {i}") for i, o in enumerate(outputs)
               if isinstance(o, array_type)]
        plan = build_plan(cuda_graph._handles.graph,
                          _extents(framework, [a for a, _ in arrays]),
                          [p for _, p in arrays], out, min_bytes=min_bytes())
    if written is not None:
        plan.written = [a and b for a, b in zip(plan.written, written, strict=True)]
    return plan


def _unread(count: int, reason: str) -> RebindPlan:
    """The plan of a graph whose nodes were not read: incomplete, every input maybe written."""
    plan = RebindPlan(count)
    plan.reasons.append(reason)
    plan.written = [True] * count
    return plan


def min_bytes() -> int:
    """Inputs smaller than this are copied even with ``inputs="rebind"``: measured on an H100
    (docs/rebinding.md), a node update costs the launch a few µs of device time, more than
    copying a small input; ``CUGRAPHRT_REBIND_MIN_BYTES`` sets it (0: rebind every input)."""
    raw = os.environ.get(MIN_BYTES_ENV, "")
    if not raw:
        return DEFAULT_MIN_BYTES
    try:
        value = int(raw)
    except ValueError:
        value = -1
    if value < 0:
        raise OptionsError(MIN_BYTES_ENV, raw, "a byte count >= 0")
    return value
