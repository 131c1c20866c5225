"""The rebinding plan of a graph: where each input's address appears, made once at capture.

A captured graph reads its inputs at fixed addresses, written into its nodes: kernel
parameters (whole pointers, and interior pointers into a buffer: slices, offsets, a struct
of pointers passed by value as cuBLAS and torch's reductions do), memcpy and memset nodes.
The plan walks the graph's nodes once, reads those places (:mod:`cugraphrt._cuda.node_params`)
and records each *site*: a 64-bit word of a node's parameters that holds ``input address +
delta``. Replaying on new buffers then stores ``new address + delta`` into every site and
sets the changed nodes' parameters in the executable
(:class:`cugraphrt._callables.rebind.RebindIn`).

The plan is **complete** only when nothing can read an input's address from a place it does
not patch. Otherwise it lists why (``reasons``), and the call path copies as before:

* a value equal to the end of an input (one past its last byte) that is not the start of
  another input: an end pointer, or a neighbouring buffer; the plan cannot tell which;
* an input's address at an offset that is not a multiple of 8 (a packed struct);
* an input's address in a child graph or a conditional body (CUDA sets a body's nodes only
  through its whole graph), or in a kind of node the plan does not patch (batched memory
  operations), or in a 2-D/3-D memcpy or memset;
* a kernel whose parameters CUDA cannot describe (no ``cuFuncGetParamInfo``), or a memcpy
  from host memory (a table of addresses could hide there): anywhere in the graph, since
  what they read is unknown;
* two inputs that share memory, or an output inside an input (the output would keep
  viewing the capture's buffer).

An input whose address appears in no node is copied on every call, as before: either the
graph does not read it, or it reads it through a place the plan cannot see (a framework may
have copied it, or what it holds, elsewhere before capture). Measured: a Hugging Face Llama
decode step captured with ``cache_position`` as an input holds its address in none of its
594 kernels, and still depends on it.

What no plan can see: an address stored into device memory before capture and read back by
a kernel of the graph (a pointer table a library keeps on the device). Neither CuPy's nor
torch's kernels nor cuBLAS do this; docs/rebinding.md says how to check a library that might.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy

from cugraphrt._cuda import graph_nodes as _nodes
from cugraphrt._cuda import node_params as _params
from cugraphrt._cuda.conditional import driver_api

__all__ = ["Extent", "RebindPlan", "build_plan", "byte_extent"]

#: (first element's address, lowest byte, one past the highest byte) of an input.
Extent = tuple[int, int, int]

_COPY_FIELDS = {"src": ("srcDevice",), "dst": ("dstDevice",)}
# cuda-bindings' CUmemorytype values of memory with a device address (DEVICE, UNIFIED).
_DEVICE_TYPES = (2, 4)
_HOST_TYPE = 1


def byte_extent(address: int, shape: Sequence[int], strides: Sequence[int],
                itemsize: int) -> tuple[int, int]:
    """``(lo, hi)``: the bytes an array at ``address`` covers, ``strides`` in bytes (any
    sign); ``(address, address)`` for an empty array."""
    if any(n == 0 for n in shape):
        return address, address
    low = sum((n - 1) * s for n, s in zip(shape, strides, strict=True) if s < 0)
    high = sum((n - 1) * s for n, s in zip(shape, strides, strict=True) if s > 0)
    return address + low, address + high + itemsize


class RebindPlan:
    """Where the inputs' addresses appear in one graph (see the module docstring).

    Attributes
    ----------
    reasons : list of str
        Why the plan is incomplete; empty when every place is patched.
    setters : list of ExecSetter
        One per node holding a site.
    words : numpy.ndarray
        The ``uint64`` words of every setter, back to back.
    site_word, site_input, site_delta : numpy.ndarray
        Per site: its index in ``words``, the input it belongs to, its offset from the
        input's address.
    sites_per_input : list of int
    written : list of bool
        Per input, whether the graph may write it: its address (or one just past it) is in a
        kernel's parameters or is a copy's or a set's destination, or the graph holds what
        the plan cannot read (a body, an unreadable kernel). A copy read from it alone does
        not write it. Where an input is copied in, the inputs written are copied back after
        the replay (``inputs="rebind"`` keeps its meaning: docs/rebinding.md).
    """

    def __init__(self, count: int) -> None:
        self.reasons: list[str] = []
        self.setters: list[_params.ExecSetter] = []
        self.words = numpy.zeros(0, dtype=numpy.uint64)
        self.site_word = numpy.zeros(0, dtype=numpy.intp)
        self.site_input = numpy.zeros(0, dtype=numpy.intp)
        self.site_delta = numpy.zeros(0, dtype=numpy.int64)
        self.sites_per_input = [0] * count
        self.small = [False] * count  # under the size below which inputs are copied
        self.written = [False] * count

    @property
    def complete(self) -> bool:
        return not self.reasons

    def explain(self, names: Sequence[str]) -> str:
        """One paragraph: what the plan patches, or why it cannot."""
        if self.reasons:
            return "inputs are copied: " + "; ".join(dict.fromkeys(self.reasons))
        counts = ", ".join(
            f"{name}: {n}" if n else f"{name}: copied (smaller than a copy is worth "
            f"rebinding)" if small else f"{name}: copied (its address appears in no node)"
            for name, n, small in zip(names, self.sites_per_input, self.small, strict=True))
        return (f"inputs are rebound: {len(self.site_word)} address(es) in "
                f"{len(self.setters)} node(s) ({counts})")


class _Finder:
    """Looks up which input a 64-bit value points into."""

    def __init__(self, extents: Sequence[Extent]) -> None:
        order = sorted(range(len(extents)), key=lambda k: extents[k][1])
        self.extents = extents
        self.order = numpy.array(order, dtype=numpy.intp)
        self.lo = numpy.array([extents[k][1] for k in order], dtype=numpy.uint64)
        self.hi = numpy.array([extents[k][2] for k in order], dtype=numpy.uint64)
        self.starts = {extents[k][1] for k in order}

    def hits(self, raw: bytes) -> list[tuple[int, int, bool]]:
        """(byte position, input, is an end pointer) of every 8-byte value in ``raw`` at any
        byte alignment that points into an input or just past one."""
        found: list[tuple[int, int, bool]] = []
        if not len(self.lo) or len(raw) < 8:
            return found
        data = numpy.frombuffer(raw, dtype=numpy.uint8)
        for shift in range(8):
            usable = (len(raw) - shift) // 8 * 8
            if usable <= 0:
                continue
            values = data[shift:shift + usable].view("<u8")
            at = numpy.searchsorted(self.lo, values, side="right") - 1
            inside = (at >= 0) & (values < self.hi[numpy.maximum(at, 0)])
            ends = numpy.isin(values, self.hi) & ~inside
            for i in numpy.flatnonzero(inside | ends):
                pos = shift + 8 * int(i)
                if inside[i]:
                    found.append((pos, int(self.order[at[i]]), False))
                elif int(values[i]) not in self.starts:
                    k = int(self.order[int(numpy.flatnonzero(self.hi == values[i])[0])])
                    found.append((pos, k, True))
        return found


def _referenced(graph: Any, finder: _Finder) -> bool:
    """Whether any node of ``graph`` (or of graphs inside it) holds an input's address."""
    for node, kind, inner in _nodes.walk(graph, _nodes.NESTING):
        if inner is None:  # a body CUDA does not let us read: assume it does
            return True
        if kind == "KERNEL":
            layout = _params.kernel_params(node)
            if layout.why_not or any(finder.hits(raw) for raw in layout.raw):
                return True
        elif kind == "MEMCPY":
            copy = _params.copy_params(node)
            if any(finder.hits(int(getattr(copy, f)).to_bytes(8, "little"))
                   for f in ("srcDevice", "dstDevice")):
                return True
        elif kind == "MEMSET":
            if finder.hits(int(_params.set_params(node).dst).to_bytes(8, "little")):
                return True
    return False


def _outputs_inside(extents: Sequence[Extent], outputs: Sequence[tuple[int, int, str]],
                    names: Sequence[str]) -> list[str]:
    reasons = []
    for lo, hi, out_name in outputs:
        for k, (_, in_lo, in_hi) in enumerate(extents):
            if lo < in_hi and in_lo < hi and hi > lo:
                reasons.append(f"{out_name} lies inside input {names[k]} (it would keep "
                               f"viewing the capture's buffer)")
    return reasons


def _shared_inputs(extents: Sequence[Extent], names: Sequence[str]) -> list[str]:
    reasons = []
    spans = sorted((lo, hi, k) for k, (_, lo, hi) in enumerate(extents) if hi > lo)
    for (_, hi_a, a), (lo_b, _, b) in zip(spans, spans[1:], strict=False):
        if lo_b < hi_a:
            reasons.append(f"inputs {names[a]} and {names[b]} share memory")
    return reasons


def build_plan(graph: Any, extents: Sequence[Extent], names: Sequence[str],
               outputs: Sequence[tuple[int, int, str]] = (), min_bytes: int = 0) -> RebindPlan:
    """The plan of ``graph`` (a ``CUgraph`` handle, int or cuda-bindings object) for inputs
    at ``extents``, named ``names`` in messages; ``outputs`` are the static outputs'
    ``(lo, hi, name)``. Inputs smaller than ``min_bytes`` get no site: they are copied
    (their addresses are still looked for, so that the checks above hold for them)."""
    plan = RebindPlan(len(extents))
    plan.small = [hi - lo < min_bytes for _, lo, hi in extents]
    plan.reasons += _shared_inputs(extents, names) + _outputs_inside(extents, outputs, names)
    if not isinstance(graph, int):
        graph_obj = graph
    else:
        graph_obj = driver_api().CUgraph(graph)
    finder = _Finder(extents)
    found: list[tuple[Any, str, Any, Any, tuple[str, ...], list[tuple[int, int, int]]]] = []
    for node, kind, _ in _nodes.walk(graph_obj, frozenset()):  # the top level: patched
        entry = _node_sites(node, kind, finder, names, plan.reasons, plan.written)
        if entry is not None:
            found.append((node, kind, *entry))
    if plan.reasons:
        return plan
    _lay_out(plan, [(*entry[:5], [site for site in entry[5] if not plan.small[site[1]]])
                    for entry in found])
    return plan


def _all(written: list[bool]) -> None:
    written[:] = [True] * len(written)


def _node_sites(node: Any, kind: str, finder: _Finder, names: Sequence[str],
                reasons: list[str], written: list[bool]):
    """(params, layout, fields, sites) of a node holding input addresses, or None; sites are
    (byte position in the setter's words, input, delta). Appends to ``reasons`` and marks
    the inputs the node may write in ``written`` (see :class:`RebindPlan`)."""
    if kind == "KERNEL":
        layout = _params.kernel_params(node)
        if layout.why_not:
            reasons.append(f"a kernel's parameters cannot be read ({layout.why_not})")
            _all(written)
            return None
        sites = []
        for offset, raw in zip(layout.offsets, layout.raw, strict=True):
            for pos, k, end in finder.hits(raw):
                written[k] = True  # a kernel's pointer may be read or written
                where = offset + pos
                if end:
                    reasons.append(f"a kernel parameter holds the address just past input "
                                   f"{names[k]} (an end pointer, or another buffer)")
                elif where % 8:
                    reasons.append(f"a kernel parameter holds input {names[k]}'s address "
                                   f"at an unaligned offset")
                else:
                    value = int.from_bytes(raw[pos:pos + 8], "little")
                    sites.append((where, k, value - finder.extents[k][0]))
        return (layout.params, layout, (), sites) if sites else None
    if kind in ("MEMCPY", "MEMSET"):
        params = _params.copy_params(node) if kind == "MEMCPY" else _params.set_params(node)
        if kind == "MEMCPY":
            if int(params.dstMemoryType) in _DEVICE_TYPES:
                for _, k, _ in finder.hits(int(params.dstDevice).to_bytes(8, "little")):
                    written[k] = True
            if int(params.srcMemoryType) == _HOST_TYPE:
                reasons.append("the graph copies from host memory (what it copies may hold "
                               "addresses)")
                return None
            candidates = [f for f, t in (("srcDevice", params.srcMemoryType),
                                         ("dstDevice", params.dstMemoryType))
                          if int(t) in _DEVICE_TYPES]
            flat = int(params.Height) <= 1 and int(params.Depth) <= 1
        else:
            candidates, flat = ["dst"], int(params.height) <= 1
            for _, k, _ in finder.hits(int(params.dst).to_bytes(8, "little")):
                written[k] = True
        fields: list[str] = []
        sites = []
        for field in candidates:
            value = int(getattr(params, field))
            for _, k, end in finder.hits(value.to_bytes(8, "little")):
                if end or not flat:
                    reasons.append(f"a {'2-D/3-D ' if not flat else ''}{kind.lower()} node "
                                   f"{'ends at' if end else 'uses'} input {names[k]}")
                    continue
                sites.append((8 * len(fields), k, value - finder.extents[k][0]))
                fields.append(field)
        return (params, None, tuple(fields), sites) if sites else None
    if kind in _nodes.NESTING:
        inner = _nodes.nested(node, kind)
        if inner is None or any(_referenced(g, finder) for g in inner):
            _all(written)  # which input a body writes is not read
            place = "a child graph" if kind == "GRAPH" else "a loop or branch body"
            reasons.append(f"an input's address is used inside {place}, which cannot be "
                           f"patched" if inner is not None else
                           f"the graph has {place} that cannot be read")
        return None
    if kind == "BATCH_MEM_OP":
        reasons.append("the graph holds batched memory operations, which are not patched")
        _all(written)
    return None


def _lay_out(plan: RebindPlan, found: list) -> None:
    site_word, site_input, site_delta = [], [], []
    start = 0
    found = [entry for entry in found if entry[5]]
    sizes = [_params.ExecSetter.words_for(kind, layout, fields)
             for _, kind, _, layout, fields, _ in found]
    plan.words = numpy.zeros(sum(sizes), dtype=numpy.uint64)
    for size, (node, kind, params, layout, fields, sites) in zip(sizes, found, strict=True):
        words = plan.words[start:start + size]
        plan.setters.append(_params.ExecSetter(node, kind, params, words, layout=layout,
                                               fields=fields))
        for pos, k, delta in sites:
            site_word.append(start + pos // 8)
            site_input.append(k)
            site_delta.append(delta)
            plan.sites_per_input[k] += 1
        start += size
    plan.site_word = numpy.array(site_word, dtype=numpy.intp)
    plan.site_input = numpy.array(site_input, dtype=numpy.intp)
    plan.site_delta = numpy.array(site_delta, dtype=numpy.int64)
