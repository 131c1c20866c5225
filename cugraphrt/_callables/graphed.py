"""make_graphed: turn a plain CuPy function into a replayed graph (or one per shape bucket)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import cupy

from cugraphrt import _tree
from cugraphrt._callables.bucket_table import CapturedBucket, instantiate_measured
from cugraphrt._callables.buckets import Bucketed
from cugraphrt._callables.call_path import CallPath, CopyIn, HandOut, Mismatch
from cugraphrt._callables.checked_views import FIX
from cugraphrt._callables.cupy_framework import CUPY
from cugraphrt._callables.rebind import (
    check_inputs_mode,
    plan_for,
    rebind_step,
    with_write_back,
)
from cugraphrt._capture import graphs as _graphs
from cugraphrt._capture.graph_context import graph
from cugraphrt._capture.graphs import Graph
from cugraphrt._cuda import runtime as _cuda
from cugraphrt._flags import FLAGS
from cugraphrt._memory.backing import _on_device
from cugraphrt._memory.overwrites import OutputCheck, OverwriteOrder, order_for
from cugraphrt._memory.pool import MemPool
from cugraphrt.errors import OptionsError, ReplayError
from cugraphrt.options import MakeGraphedOptions, validate_options

__all__ = ["make_graphed", "GraphedFunction", "BucketedFunction"]

_ndarray = cupy.ndarray
_current_stream = cupy.cuda.get_current_stream
_launch = _cuda.graph_launch


def make_graphed(
    fn: Callable[..., Any],
    sample_args: tuple,
    *,
    num_warmup_iters: int = 3,
    pool: MemPool | None = None,
    copy_outputs: bool = False,
    buckets: Any = None,
    dynamic_dim: int | tuple[int | None, ...] = 0,
    pad: Any = 0,
    memory_budget: int | None = None,
    strict: bool = False,
    check_outputs: bool | None = None,
    inputs: str = "copy",
) -> GraphedFunction | BucketedFunction:
    """Capture ``fn(*sample_args)`` once and return a callable that replays it.

    The sample arrays become the graph's static inputs. Each call copies new inputs into
    them (no copy when the caller passes a static input itself), replays the graph and
    returns the static outputs.

    With ``buckets``, one callable serves every size of a dynamic dimension: a call whose
    dynamic size is ``n`` replays the graph of the smallest bucket ``>= n`` (captured on
    first use, or all at once by :meth:`BucketedFunction.capture_all`), its inputs copied
    into that bucket's static buffers with the rows past ``n`` padded, and outputs that carry
    the bucket's size in the dynamic dimension come back as views of their first ``n`` rows.
    Padding is correct for functions whose rows are independent of each other (most
    inference: per-sample layers, row-wise matmuls); see ``docs/shapes.md`` for the others.

    Parameters
    ----------
    fn : callable
        A function of CuPy arrays that issues its work on the current stream.
    sample_args : tuple
        Arguments to capture with: CuPy arrays, nested in tuples, lists and dicts as the
        function expects; other values are fixed at capture and must be passed equal.
    num_warmup_iters : int, default 3
        Eager runs on a side stream before capture.
    pool : MemPool, optional
        Pool for the capture (see :meth:`Graph.capture_begin`).
    copy_outputs : bool, default False
        Return copies of the outputs. By default the static outputs are returned, and the
        next call overwrites them.
    check_outputs : bool, optional
        The checked mode, off by default (None or False). Without ``copy_outputs``, each
        call returns fresh arrays over the static outputs, and a replay that would overwrite
        an output of an earlier call still referenced (the array, or a view of it) raises
        :class:`OverwrittenOutputError` instead, naming the output and the call; arguments of
        the call itself are exempt (``x = f(x)``). Drop outputs before the next call (``del``)
        in checked code. See docs/reliability.md, "Reading an overwritten output".
    inputs : {"copy", "rebind"}, default "copy"
        How a call's arrays reach the graph. ``"copy"`` copies each into its static input.
        ``"rebind"`` points the graph at the call's own arrays instead (no copy: one
        ``cuGraphExec*SetParams`` per node that reads an input, only when an address
        changed), where the capture's rebinding plan covers every place an input's address
        appears; otherwise it copies and warns once, naming why. Arrays must then have the
        captured strides too (else they are copied). See docs/rebinding.md.
    buckets : "pow2" or sequence of int, optional
        Sizes of the dynamic dimension to capture a graph for: a strictly increasing list,
        or ``"pow2"`` for 1, 2, 4, ... up to the sample's size (and the sample's size).
    dynamic_dim : int or tuple of (int or None), default 0
        The dynamic dimension of every array argument that has it, or one entry per
        argument (None: not dynamic). Outputs are cut along the first dynamic argument's.
    pad : number or callable, default 0
        Value of the rows past ``n``, or ``pad(rows, path)`` filling the view ``rows`` of the
        argument at ``path`` (e.g. ``"args[1]"``) in place, called on every padded call.
    memory_budget : int, optional
        Bytes the shared pool may reserve: after a capture, least-recently-used buckets'
        graphs are released until the measured reserved bytes fit (captured again on use).
    strict : bool, default False
        Raise :class:`ReplayError` for a call no bucket serves (size above the largest
        bucket, another dtype or non-dynamic shape) instead of running ``fn`` eagerly with
        a warning naming the reason (once per reason). With ``inputs="rebind"``: raise
        :class:`CaptureError` when the rebinding plan cannot patch every input, instead of
        copying them in (and back out where the graph writes them).

    Returns
    -------
    GraphedFunction, or BucketedFunction with ``buckets``

    Raises
    ------
    OptionsError
        For bad options.
    CaptureError
        If ``fn`` does something capture forbids.
    """
    options = validate_options(MakeGraphedOptions, num_warmup_iters=num_warmup_iters,
                               copy_outputs=copy_outputs, check_outputs=check_outputs)
    checked = bool(options.check_outputs) and not options.copy_outputs
    check_inputs_mode(inputs)
    if not isinstance(strict, bool):
        raise OptionsError("strict", strict, "allowed values are True and False")
    label = f"make_graphed({getattr(fn, '__name__', type(fn).__name__)})"
    if not callable(fn):
        raise OptionsError("fn", fn, "a callable")
    if not isinstance(sample_args, (tuple, list)):
        sample_args = (sample_args,)
    sample_args = tuple(sample_args)
    if buckets is not None:
        if pool is not None and not isinstance(pool, MemPool):
            raise OptionsError("pool", pool, "a cugraphrt.MemPool or None")
        return BucketedFunction(fn, sample_args, options.num_warmup_iters, pool=pool,
                                copy_outputs=options.copy_outputs, buckets=buckets,
                                dynamic_dim=dynamic_dim, pad=pad,
                                memory_budget=memory_budget, strict=strict, inputs=inputs,
                                check=(lambda pool: OutputCheck(
                                    label + ", buckets", FIX, order_for(pool), CUPY))
                                if checked else None)
    _check_devices(sample_args)
    _warm_up(fn, sample_args, options.num_warmup_iters)
    cuda_graph = Graph(keep_graph=inputs == "rebind")  # the plan reads the graph's nodes
    with graph(cuda_graph, pool=pool):
        outputs = fn(*sample_args)
    if inputs == "rebind":
        cuda_graph.instantiate()  # now, as without keep_graph: errors here, not at a call
    order = order_for(cuda_graph.pool())
    seq = order.next_seq()  # before any other capture into the pool
    check = OutputCheck(label, FIX, order, CUPY) if checked else None
    return GraphedFunction(cuda_graph, fn, sample_args, outputs, options.copy_outputs,
                           order=order, seq=seq, check=check, inputs=inputs, label=label,
                           strict=strict)


def _check_devices(sample_args: tuple) -> None:
    leaves, _, paths = _tree.flatten(sample_args, "args")
    device_id = _cuda.get_device()
    for leaf, path in zip(leaves, paths, strict=True):
        if isinstance(leaf, _ndarray) and leaf.data.device_id != device_id:
            raise OptionsError("sample_args", path, f"arrays on the current device "
                               f"{device_id} (got {path} on device {leaf.data.device_id})")


def _warm_up(fn: Callable, args: tuple, iterations: int) -> None:
    if iterations == 0:
        return
    side = cupy.cuda.Stream(non_blocking=True)
    side.wait_event(cupy.cuda.get_current_stream().record())
    with side:
        for _ in range(iterations):
            fn(*args)
    side.synchronize()


class GraphedFunction:
    """A captured function: call it like the original.

    Each call runs the one call path (:mod:`cugraphrt._callables.call_path`) on CuPy's
    framework: copy in, settle, replay, hand out.

    Attributes
    ----------
    graph : Graph
        The underlying graph.
    static_inputs : tuple
        The arguments captured with (the sample arguments).
    static_outputs : Any
        The outputs the graph writes on every replay.
    rebinding : RebindPlan or None
        With ``inputs="rebind"``: where the inputs' addresses appear in the graph, or why
        they cannot all be patched (``rebinding.complete``; ``rebinding.explain(names)``
        says it in words); None with ``inputs="copy"``.
    """

    def __init__(self, cuda_graph: Graph, fn: Callable, sample_args: tuple, outputs: Any,
                 copy_outputs: bool, *, order: OverwriteOrder | None = None, seq: int = 0,
                 check: OutputCheck | None = None, inputs: str = "copy",
                 label: str = "", strict: bool = False) -> None:
        self.graph = cuda_graph
        self.__wrapped__ = fn
        self.static_inputs = sample_args
        self.static_outputs = outputs
        leaves, self._spec, paths = _tree.flatten(sample_args, "args")
        self._flat = self._spec.is_flat_tuple
        self._num_leaves = len(leaves)
        self.rebinding = None if check_inputs_mode(inputs) == "copy" else plan_for(
            CUPY, leaves, paths, cuda_graph, _tree.flatten(outputs, "output")[0])
        load = (CopyIn(CUPY, leaves, paths) if self.rebinding is None
                else rebind_step(CUPY, leaves, paths, cuda_graph, self.rebinding, label,
                                 strict=strict))
        self._path = CallPath(load,
                              order if order is not None else OverwriteOrder(), seq,
                              with_write_back(CUPY, load, cuda_graph.replay),
                              HandOut(outputs, CUPY, copy=copy_outputs, check=check, seq=seq))
        self._device = cuda_graph._device

    def __call__(self, *args: Any) -> Any:
        if FLAGS.multi_device and _cuda.current_device() != self._device:
            # Copies and replay on the graph's device, ordered on its current stream.
            with _on_device(self._device):
                return self(*args)
        if self._flat and len(args) == self._num_leaves:
            leaves: Sequence[Any] = args
        else:
            leaves = self._structured_leaves(args)
        try:
            return self._path(leaves)
        except Mismatch as exc:
            raise _mismatch(exc) from None

    def _structured_leaves(self, args: tuple) -> list:
        leaves, spec, _ = _tree.flatten(args, "args")
        if spec != self._spec:
            raise ReplayError(
                f"arguments do not match the capture (expected structure "
                f"{self._spec.describe()} with {self._num_leaves} leaves, got "
                f"{spec.describe()}); pass arguments shaped like sample_args"
            )
        return leaves

    def __repr__(self) -> str:
        name = getattr(self.__wrapped__, "__name__", repr(self.__wrapped__))
        return f"<cugraphrt.GraphedFunction of {name} ({self._num_leaves} inputs)>"


def _mismatch(exc: Mismatch) -> ReplayError:
    if not isinstance(exc.static, _ndarray):
        return ReplayError(
            f"argument {exc.path} differs from the capture (expected {exc.static!r}, got "
            f"{exc.value!r}); non-array arguments are baked into the graph: pass the captured "
            f"value or graph the function again"
        )
    return ReplayError(
        f"argument {exc.path} does not match the capture (expected "
        f"{CUPY.describe(exc.static)}, got {CUPY.describe(exc.value)}); pass a CuPy array of "
        f"the captured shape, dtype and device, or graph the function again for the new shape"
    )


class BucketedFunction(Bucketed):
    """A CuPy function graphed once per shape bucket: call it like the original.

    Made by :func:`make_graphed` with ``buckets``. All buckets share one pool
    (:attr:`pool`); outputs are valid until the next call.

    Attributes
    ----------
    buckets : tuple of int
        The bucket sizes, smallest first.
    pool : MemPool
        The pool every bucket's graph allocates from.
    """

    def __init__(self, fn: Callable, sample_args: tuple, num_warmup_iters: int, *,
                 pool: MemPool | None, copy_outputs: bool, buckets: Any,
                 dynamic_dim: Any, pad: Any, memory_budget: int | None, strict: bool,
                 check: Callable[[MemPool], OutputCheck] | None = None,
                 inputs: str = "copy") -> None:
        _check_devices(sample_args)
        self.__wrapped__ = fn
        name = getattr(fn, "__name__", type(fn).__name__)
        # Buckets are captured on first use: on the samples' device, whatever is current.
        self._device = device = _cuda.get_device()
        _graphs._note_devices()

        def capture(args: tuple, pool: MemPool, warm: bool) -> CapturedBucket:
            with _on_device(device):  # capture_all() may run under another device
                if warm:
                    _warm_up(fn, args, num_warmup_iters)
                # Kept, to instantiate it apart and measure the executable (BucketStat).
                cuda_graph = Graph(keep_graph=True)
                with graph(cuda_graph, pool=pool):
                    outputs = fn(*args)
                exec_bytes = instantiate_measured(cuda_graph)
            seq = order_for(pool).next_seq()  # before any other capture
            # The bucket graphs of one pool may replay in any order (see
            # cugraphrt._callables.buckets):
            # launch directly, past the pool-order checks.
            exec_handle = cuda_graph.raw_graph_exec
            return CapturedBucket(
                lambda: _launch(exec_handle, _current_stream().ptr), outputs, cuda_graph.reset,
                seq, graph=cuda_graph if inputs == "rebind" else None, memory=pool,
                exec_bytes=exec_bytes)

        super().__init__(ops=CUPY, sample_args=sample_args, buckets=buckets,
                         dynamic_dim=dynamic_dim, pad=pad, memory_budget=memory_budget,
                         strict=strict, pool=pool, copy_outputs=copy_outputs, capture=capture,
                         eager=fn, name=name, check=check, inputs=inputs)

    def __call__(self, *args: Any) -> Any:
        if FLAGS.multi_device and _cuda.current_device() != self._device:
            with _on_device(self._device):
                return super().__call__(*args)
        return super().__call__(*args)
