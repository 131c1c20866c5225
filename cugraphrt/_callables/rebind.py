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

from cugraphrt._callables.call_path import CopyIn, Mismatch
from cugraphrt._callables.rebind_plan import RebindPlan, build_plan
from cugraphrt._cuda.conditional import driver_api
from cugraphrt.errors import OptionsError

__all__ = ["INPUT_MODES", "RebindIn", "load_step", "check_inputs_mode", "plan_for",
           "rebind_step", "min_bytes", "MIN_BYTES_ENV"]

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
                 "_setters", "_make_exec", "_few", "_view")

    def __init__(self, framework: Any, leaves: Sequence[Any], paths: Sequence[str],
                 plan: RebindPlan, cuda_graph: Any) -> None:
        array_type = framework.array_type
        signature, strides, address = framework.signature, framework.strides, framework.address
        arrays = [(i, leaf, path) for i, (leaf, path) in enumerate(zip(leaves, paths,
                                                                         strict=True))
                  if isinstance(leaf, array_type)]
        # layout None: the input has no site, so it is always copied (see __call__).
        self._arrays = tuple((i, leaf, signature(leaf),
                              strides(leaf) if plan.sites_per_input[k] else None, path)
                             for k, (i, leaf, path) in enumerate(arrays))
        self._constants = tuple((i, leaf, path) for i, (leaf, path)
                                in enumerate(zip(leaves, paths, strict=True))
                                if not isinstance(leaf, array_type))
        self._signature, self._strides, self._address = signature, strides, address
        self._copy = framework.copy
        self._statics_at = [address(static) for _, static, _, _, _ in self._arrays]
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
        for index, static, expected, layout, path in self._arrays:
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
                    at = address(static)
            except (AttributeError, TypeError):  # not an array of the framework
                raise Mismatch(index, path, static, value) from None
            addresses.append(at)
        for index, expected, path in self._constants:
            if leaves[index] != expected:
                raise Mismatch(index, path, expected, leaves[index])
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
            if low <= at < high:
                i = bisect_right(starts, at) - 1
                if i >= 0 and at < ends[i]:
                    index, static = self._arrays[k][0], self._arrays[k][1]
                    if leaves[index] is not static:
                        self._copy(static, leaves[index])
                    addresses[k] = self._statics_at[k]


def _extents(framework: Any, arrays: Sequence[Any]) -> list[tuple[int, int, int]]:
    return [(framework.address(a), *framework.extent(a)) for a in arrays]


def load_step(framework: Any, leaves: Sequence[Any], paths: Sequence[str], cuda_graph: Any,
              inputs: str, outputs: Sequence[Any] = (), *, label: str = "") -> Any:
    """The ``load`` step of a graphed callable: :class:`CopyIn`, or for ``inputs="rebind"``
    and a complete plan, :class:`RebindIn`. An incomplete plan warns once, naming why.

    ``outputs`` are the static outputs' leaves (arrays among them are checked not to lie
    inside an input); ``cuda_graph`` must keep its graph definition (``keep_graph=True``,
    or an adapter's adopted graph).
    """
    if check_inputs_mode(inputs) == "copy":
        return CopyIn(framework, leaves, paths)
    plan = plan_for(framework, leaves, paths, cuda_graph, outputs)
    step = rebind_step(framework, leaves, paths, cuda_graph, plan, label)
    return step


def rebind_step(framework: Any, leaves: Sequence[Any], paths: Sequence[str], cuda_graph: Any,
                plan: RebindPlan, label: str = "") -> Any:
    """:class:`RebindIn` for a complete ``plan``; otherwise :class:`CopyIn`, after warning
    once why (the plan's ``explain``)."""
    if not plan.complete:
        warnings.warn(f"{label or 'graphed callable'}: inputs='rebind' falls back to copying "
                      f"({plan.explain([])}); see docs/rebinding.md", UserWarning,
                      stacklevel=4)
        return CopyIn(framework, leaves, paths)
    return RebindIn(framework, leaves, paths, plan, cuda_graph)


def plan_for(framework: Any, leaves: Sequence[Any], paths: Sequence[str], cuda_graph: Any,
             outputs: Sequence[Any] = ()) -> RebindPlan:
    """The rebinding plan of ``cuda_graph`` for the array leaves among ``leaves``."""
    array_type = framework.array_type
    arrays = [(leaf, path) for leaf, path in zip(leaves, paths, strict=True)
              if isinstance(leaf, array_type)]
    if not hasattr(framework, "extent") or not hasattr(framework, "strides"):
        plan = RebindPlan(len(arrays))
        plan.reasons.append(f"the {framework.name} framework gives no extent() and strides()")
        return plan
    handle = cuda_graph._handles.graph
    if not handle:
        plan = RebindPlan(len(arrays))
        plan.reasons.append("the graph definition was not kept (Graph(keep_graph=True))")
        return plan
    out = [(*framework.extent(o), f"output {i}") for i, o in enumerate(outputs)
           if isinstance(o, array_type)]
    return build_plan(handle, _extents(framework, [a for a, _ in arrays]),
                      [p for _, p in arrays], out, min_bytes=min_bytes())


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
