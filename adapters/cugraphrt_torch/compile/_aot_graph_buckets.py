"""Shape buckets for the dynamo backend: a dynamic piece replays one graph per bucket.

Without buckets, a piece that dynamo compiled with a dynamic size (its ``s0``) holds one
recording per size it meets, up to ``max_graphs``, and runs further sizes eagerly. With
``options={"buckets": ...}`` an inference piece runs a call of size ``n`` on the graph of the
smallest bucket ``>= n`` instead. The machinery is the core's
(:class:`cugraphrt.adapter.Bucketed`: static buffers sized for the largest bucket, padding,
one pool, outputs cut back to ``n``); this module reads off the AOT graph what it needs, which
is exact where the other front ends must be told or guess:

* which copied input carries the size, and in which dimension;
* which int inputs are expressions of it (``s0``, ``2*s0``), recomputed for each bucket;
* which output dimension carries it, so only those are cut.

Padding is right only when rows do not interact, as in batched inference. Buckets are
therefore opt-in and serve inference pieces only; a piece they cannot serve keeps the
per-size recordings, and its report says why.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, cast

import torch

from cugraphrt import Graph, MemPool
from cugraphrt.adapter import Bucketed, CapturedBucket, order_for

from ..capture._output_check import FIX_COMPILE, make_check
from ..capture.capture import graph as _capture
from ..capture.framework import TORCH

__all__ = ["BucketPlan", "AotGraphBuckets", "plan_buckets"]

_Tensor = torch.Tensor


@dataclass(frozen=True)
class BucketPlan:
    """Where the dynamic size of a piece appears (indices are the piece's inputs)."""

    symbol: Any  # the sympy symbol of the size
    copied: tuple[int, ...]  # the copied tensor inputs, handed to Bucketed in this order
    dims: tuple[int | None, ...]  # per copied input: the dimension of the size (or None)
    sizes: tuple[tuple[int, Any], ...]  # int inputs that are expressions of the size
    output_dims: tuple[int | None, ...]  # per output: the dimension to cut (or None)


def plan_buckets(gm: torch.fx.GraphModule, inputs: Sequence[object], static: Sequence[int],
                 mutated: frozenset[int], kind: str, names: Sequence[str]) -> BucketPlan | str:
    """The plan to serve the AOT graph ``gm`` from buckets, or why it cannot be.

    ``inputs`` are the graph's example inputs (fake tensors with symbolic sizes, SymInts).
    """
    if kind != "inference":
        return (f"buckets serve inference pieces only (got a {kind} piece): padded rows "
                f"would reach the gradients")
    if mutated:
        written = ", ".join(f"'{names[i]}'" for i in sorted(mutated))
        return f"the piece writes to its inputs ({written}), which padded calls would corrupt"
    symbols: set = set()
    for value in inputs:
        symbols |= _free_symbols(value)
    if len(symbols) != 1:
        found = ", ".join(sorted(map(str, symbols))) or "none"
        return f"buckets serve pieces with one dynamic size (got {found})"
    (symbol,) = symbols
    static_set = set(static)
    copied: list[int] = []
    dims: list[int | None] = []
    sizes: list[tuple[int, Any]] = []
    for index, value in enumerate(inputs):
        if isinstance(value, torch.SymInt):
            sizes.append((index, value.node.expr))
        elif isinstance(value, _Tensor):
            if index in static_set:
                if _free_symbols(value):
                    return f"static input '{names[index]}' has the dynamic size {symbol}"
                continue
            dim = _dim_of(value, symbol)
            if isinstance(dim, str):
                return f"input '{names[index]}' {dim}"
            copied.append(index)
            dims.append(dim)
    if all(dim is None for dim in dims):
        return f"no copied input has the dynamic size {symbol} as a dimension"
    output_dims = _output_dims(gm, symbol)
    if isinstance(output_dims, str):
        return output_dims
    return BucketPlan(symbol, tuple(copied), tuple(dims), tuple(sizes), output_dims)


def _expr(size: object):
    return size.node.expr if isinstance(size, torch.SymInt) else None


def _free_symbols(value: object) -> set:
    if isinstance(value, torch.SymInt):
        return set(value.node.expr.free_symbols)
    if isinstance(value, _Tensor):
        found: set = set()
        for size in (*value.shape, *value.stride()):
            expr = _expr(size)
            if expr is not None:
                found |= expr.free_symbols
        return found
    return set()


def _dim_of(tensor: _Tensor, symbol) -> int | None | str:
    """The one dimension of ``tensor`` whose size is ``symbol``, None, or why not usable."""
    found = None
    for dim, size in enumerate(tensor.shape):
        expr = _expr(size)
        if expr is None or symbol not in expr.free_symbols:
            continue
        if expr != symbol:
            return f"has a dimension of size {expr}, derived from {symbol}"
        if found is not None:
            return f"has the dynamic size {symbol} in dimensions {found} and {dim}"
        found = dim
    return found


def _output_dims(gm: torch.fx.GraphModule, symbol) -> tuple[int | None, ...] | str:
    from torch.multiprocessing.reductions import StorageWeakRef

    inputs = {StorageWeakRef(v.untyped_storage()) for node in gm.graph.find_nodes(
        op="placeholder") if isinstance(v := node.meta.get("val"), _Tensor)}
    (output,) = gm.graph.find_nodes(op="output")
    values = output.args[0] if isinstance(output.args[0], (list, tuple)) else (output.args[0],)
    dims: list[int | None] = []
    for position, node in enumerate(values):
        value = node.meta.get("val") if isinstance(node, torch.fx.Node) else node
        if isinstance(value, _Tensor):
            if StorageWeakRef(value.untyped_storage()) in inputs:
                return f"output {position} is a view of an input"
            dim = _dim_of(value, symbol)
            if isinstance(dim, str):
                return f"output {position} {dim}"
            dims.append(dim)
        elif symbol in _free_symbols(value):
            return f"output {position} is the size {value}, which padding would change"
        else:
            dims.append(None)
    return tuple(dims)


class _Calls:
    """What the bucket callbacks read: the plan, the compiled code and the current call's
    arguments. Apart from :class:`AotGraphBuckets`, so that the core's callbacks do not hold
    the object that holds the core (a cycle would keep the graphs until a collection)."""

    __slots__ = ("plan", "compiled", "probe_index", "probe_dim", "args")

    def __init__(self, plan: BucketPlan, compiled, probe_index: int, probe_dim: int) -> None:
        self.plan = plan
        self.compiled = compiled
        self.probe_index = probe_index
        self.probe_dim = probe_dim
        self.args: list = []

    def eager(self, *_: Any) -> Any:
        return self.compiled(list(self.args))

    def capture(self, bucket_args: tuple, pool: MemPool, warm: bool = True) -> CapturedBucket:
        # Every size runs once first, whatever ``warm`` says: compiled code may launch other
        # kernels at another size, which must be loaded before a capture.
        plan = self.plan
        size = bucket_args[plan.copied.index(self.probe_index)].shape[self.probe_dim]
        inputs = list(self.args)
        for index, tensor in zip(plan.copied, bucket_args, strict=True):
            inputs[index] = tensor
        for index, expr in plan.sizes:
            inputs[index] = int(expr.xreplace({plan.symbol: size}))
        # A first run at this size loads whatever the compiled code launches differently
        # for it; it writes nothing but its outputs (the piece mutates no input).
        self.compiled(list(inputs))
        cuda_graph = Graph()
        session = _capture(cuda_graph, pool=pool, capture_error_mode="thread_local")
        with session:
            outputs = self.compiled(list(inputs))
        captured = session.captured
        assert captured is not None  # set by a successful capture
        # Bucket graphs replay in any order (see the buckets module): past the pool-order
        # checks.
        return CapturedBucket(captured.launch, list(outputs), cuda_graph.reset, captured.seq)


class AotGraphBuckets:
    """The bucket graphs of one piece; :class:`~cugraphrt_torch.compile._aot_graph.AotGraph`
    calls them.

    Built on the piece's first call that a bucket serves, from that call's tensors (the core
    samples the static buffers from them). Static inputs are read in place by every bucket's
    graph, as by the piece's own recordings.
    """

    def __init__(self, plan: BucketPlan, buckets: tuple[int, ...], compiled, *, name: str,
                 static: Sequence[int], strict: bool, copy_outputs: bool,
                 check_outputs: bool | None = None) -> None:
        self.plan = plan
        self.buckets = buckets
        self._name = name
        self._static = list(static)
        self._strict = strict
        self._copy_outputs = copy_outputs
        self._check_outputs = check_outputs
        probe = next(i for i, dim in enumerate(plan.dims) if dim is not None)
        self._probe_index = plan.copied[probe]
        self._probe_dim = cast(int, plan.dims[probe])  # the probe is a dynamic argument
        self._calls = _Calls(plan, compiled, self._probe_index, self._probe_dim)
        self._core: Bucketed | None = None
        self.static_ptrs: list = []

    def serves(self, args: list) -> bool:
        """Whether a bucket fits this call (sizes above the largest do not)."""
        return 0 < args[self._probe_index].shape[self._probe_dim] <= self.buckets[-1]

    def __call__(self, args: list, pool: MemPool) -> list:
        self._calls.args = args  # the capture and the eager fallback read statics and ints
        core = self._core
        if core is None:
            core = self._build(args, pool)
        return list(core(*[args[i] for i in self.plan.copied]))

    def rebind(self, args: list) -> None:
        """A static input moved: release every bucket's graph and read the new addresses."""
        self.release()
        self.static_ptrs = static_addresses(args, self._static)

    def release(self) -> None:
        """Release every bucket's graph (captured again on its next use)."""
        if self._core is not None:
            self._core.release()

    def captured(self) -> tuple[int, ...]:
        """The buckets whose graph is held."""
        if self._core is None:
            return ()
        return tuple(b.size for b in self._core.stats().buckets if b.captured)

    def _build(self, args: list, pool: MemPool) -> Bucketed:
        self.static_ptrs = static_addresses(args, self._static)
        check_outputs, name = self._check_outputs, self._name

        def make(pool: MemPool):
            return make_check(check_outputs, f"torch.compile piece '{name}', buckets",
                              FIX_COMPILE, order_for(pool))

        self._core = Bucketed(
            ops=TORCH, sample_args=tuple(args[i] for i in self.plan.copied),
            buckets=self.buckets, dynamic_dim=list(self.plan.dims), pad=0.0,
            memory_budget=None, strict=self._strict, pool=pool,
            copy_outputs=self._copy_outputs, capture=self._calls.capture,
            eager=self._calls.eager, name=self._name, output_dims=self.plan.output_dims,
            check=None if self._copy_outputs else make)
        return self._core


def static_addresses(args: list, static: list[int]) -> list:
    ptrs: list = [None] * len(args)
    for index in static:
        ptrs[index] = args[index].data_ptr()
    return ptrs
