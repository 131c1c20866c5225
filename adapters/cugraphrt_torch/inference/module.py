"""graph_module: a torch module's inference forward as a replayed CUDA graph."""

from __future__ import annotations

import contextlib
import warnings
from typing import Any

import cupy
import torch

from cugraphrt import Graph, MemPool
from cugraphrt.adapter import (
    CallPath,
    CopyIn,
    HandOut,
    Mismatch,
    OutputCheck,
    OverwriteOrder,
    check_inputs_mode,
    order_for,
    plan_for,
    rebind_step,
    with_write_back,
)
from cugraphrt.adapter import tree as _tree
from cugraphrt.errors import OptionsError, ReplayError
from cugraphrt.options import MakeGraphedOptions, validate_options

from .._internals import tensors as _tensors
from ..capture import _torch
from ..capture._adopted import CapturedGraph
from ..capture._output_check import FIX_COPY, checkable, make_check
from ..capture.framework import TORCH
from ._warm_up import capture_module
from .bucketed import BucketedModule
from .pieces import PiecewiseModule

__all__ = ["graph_module", "GraphedModule"]

_Tensor = torch.Tensor


def graph_module(module: torch.nn.Module, sample_args, *, pool: MemPool | None = None,
                 num_warmup_iters: int = 3, copy_outputs: bool = False,
                 strict: bool = False, buckets: Any = None,
                 dynamic_dim: int | tuple[int | None, ...] = 0, pad: Any = 0,
                 memory_budget: int | None = None,
                 check_outputs: bool | None = None, inputs: str = "copy",
                 pieces: bool = False) -> GraphedModule | BucketedModule | PiecewiseModule:
    """Capture ``module(*sample_args)`` without autograd and return a callable replaying it.

    The sample tensors become the graph's static inputs (a copy of one that overlaps an
    earlier one, such as ``(ids, ids[:, :8])``, so that each argument is copied into memory of
    its own). Each call copies its tensors into them (no copy for a tensor that already is
    the static input, by ``data_ptr``), replays
    the graph with torch's own ``CUDAGraph.replay()`` on torch's current stream, and returns
    the static outputs.

    Parameters
    ----------
    module : torch.nn.Module
        On a CUDA device. Its ``training`` flag at capture time is part of the graph.
    sample_args : torch.Tensor or tuple of torch.Tensor
        CUDA tensors on one device, shaped like every later call's arguments.
    pool : cugraphrt.MemPool, optional
        Pool for the capture; a private one if omitted.
    num_warmup_iters : int, default 3
        Eager runs, under ``torch.no_grad()``, on the capture stream right before capture
        (kernel selection, library handles and workspaces for that stream). Their memory
        comes from the graph's pool, which the capture then reuses: nothing of theirs stays
        cached in torch's allocator, and the cuBLAS workspace the graph uses is its own.
    copy_outputs : bool, default False
        Return clones of the outputs. By default each call returns tensors over the static
        outputs, which the next call overwrites.
    strict : bool, default False
        Raise :class:`cugraphrt.ReplayError` for a call that does not match the capture
        (argument count, shape, dtype or device, or a changed ``training`` flag) instead of
        running it eagerly with a one-time warning naming the reason. With
        ``inputs="rebind"``, also raise :class:`cugraphrt.CaptureError` when the rebinding
        plan cannot patch every input, instead of copying them in (and back out where the
        forward writes them).
    buckets, dynamic_dim, pad, memory_budget
        Serve every size of a dynamic dimension with one graph per bucket, exactly as
        :func:`cugraphrt.make_graphed` does for CuPy functions (same machinery): a call of
        size ``n`` replays the smallest bucket ``>= n`` with its inputs padded, and outputs
        carrying the bucket's size come back as views of their first ``n`` rows.
    check_outputs : bool, optional
        Without ``copy_outputs``: each call returns fresh tensors over the static outputs,
        and reading one after a later replay overwrote it raises a ``RuntimeError`` naming
        the call that produced it (docs/reliability.md, "Reading an overwritten output").
        None (the default) means on unless the environment variable
        ``CUGRAPHRT_CHECK_OUTPUTS=0``; unavailable on torch builds without CUDA.
    inputs : {"copy", "rebind"}, default "copy"
        ``"rebind"``: point the graph at each call's own tensors instead of copying them in,
        where the capture's rebinding plan covers every place an input's address appears
        (otherwise copy, with a one-time warning naming why); tensors must have the captured
        strides too (else they are copied). Wherever an input is copied in, the inputs the
        forward writes in place (their version counters moved during the capture) are
        copied back to the caller's tensors after the replay. See docs/rebinding.md.

    pieces : bool, default False
        Graph the module in pieces around the statements that need the host (a value read
        on the host, a shape made from data: detection's non-maximum suppression), through
        the compile backend with eager's kernels: every piece between them is captured on
        the sample call and replayed, the statements between run eagerly, and the calls
        equal eager's (:class:`PiecewiseModule`; docs/torch.md, "In pieces"). Only
        ``num_warmup_iters`` applies with it.

    Returns
    -------
    GraphedModule, BucketedModule with ``buckets``, or PiecewiseModule with ``pieces``

    Raises
    ------
    OptionsError
        For a bad argument.
    CaptureError
        If the forward does something capture forbids (host syncs, data-dependent shapes);
        the message suggests ``pieces=True``.
    """
    options = validate_options(MakeGraphedOptions, num_warmup_iters=num_warmup_iters,
                               copy_outputs=copy_outputs, check_outputs=check_outputs)
    if not isinstance(strict, bool):
        raise OptionsError("strict", strict, "allowed values are True and False")
    if not isinstance(module, torch.nn.Module):
        raise OptionsError("module", type(module).__name__, "a torch.nn.Module")
    check_inputs_mode(inputs)
    args = _sample_tuple(sample_args)
    device = _sample_device(module, args)
    _torch.require_cuda("cugraphrt_torch.graph_module()")
    if not isinstance(pieces, bool):
        raise OptionsError("pieces", pieces, "True or False")
    if pieces:
        if buckets is not None or inputs != "copy":
            raise OptionsError("pieces", pieces, "pieces=True without buckets or "
                               "inputs='rebind' (the compile backend has its own buckets: "
                               "docs/compile.md)")
        return PiecewiseModule(module, args, num_warmup_iters=options.num_warmup_iters)
    if buckets is not None:
        if pool is not None and not isinstance(pool, MemPool):
            raise OptionsError("pool", pool, "a cugraphrt.MemPool or None")
        with torch.inference_mode(False):
            own = _static_inputs(args)
        return BucketedModule(
            module, own, device,
            num_warmup_iters=options.num_warmup_iters,
            pool=pool, copy_outputs=options.copy_outputs, buckets=buckets,
            dynamic_dim=dynamic_dim, pad=pad, memory_budget=memory_budget, strict=strict,
            check_outputs=options.check_outputs, inputs=inputs)
    # inference_mode(False) only where it is on: entering it costs every build a few
    # microseconds of host time for nothing otherwise.
    with (torch.inference_mode(False) if torch.is_inference_mode_enabled()
          else contextlib.nullcontext()), torch.no_grad(), torch.cuda.device(device), \
            cupy.cuda.Device(device):
        static = _static_inputs(args)
        versions = _tensors.versions(static)  # what rebinding copies back (inputs="rebind")
        capture, outputs = capture_module(Graph, pool, module, static, options.num_warmup_iters)
        written = _tensors.moved(static, versions) if inputs == "rebind" else None
    captured = capture.captured
    assert captured is not None  # set by a successful capture
    order = order_for(captured.graph.pool())
    check = None if options.copy_outputs else make_check(
        options.check_outputs, f"graph_module({type(module).__name__})", FIX_COPY, order)
    return GraphedModule(module, captured, static, outputs, options.copy_outputs, strict,
                         order=order, check=check, inputs=inputs, written=written)


def _sample_tuple(sample_args) -> tuple:
    args = (sample_args,) if isinstance(sample_args, _Tensor) else sample_args
    if not isinstance(args, (tuple, list)) or not args:
        raise OptionsError("sample_args", type(sample_args).__name__,
                           "a CUDA tensor or a non-empty tuple of CUDA tensors")
    for index, value in enumerate(args):
        if not isinstance(value, _Tensor):
            raise OptionsError("sample_args", f"args[{index}] of type {type(value).__name__}",
                               "CUDA tensors only; bind other arguments with "
                               "functools.partial or a wrapper module")
    return tuple(args)


def _static_inputs(args: tuple) -> tuple:
    """The graph's static inputs: the sample tensors themselves, but a copy of one that is an
    inference tensor (those cannot be written outside inference mode) or that overlaps an
    earlier one (``(ids, ids[:, :8])``: copying a call's second argument in would overwrite
    part of its first). Call under ``torch.inference_mode(False)``."""
    if len(args) == 1:  # nothing to overlap: no spans to read (this runs on every build)
        only = args[0]
        return (only.clone() if only.is_inference() else only,)
    static: list[_Tensor] = []
    spans: list[tuple[int, int, int]] = []
    for a in args:
        span = _span(a)
        overlaps = span is not None and any(
            span[0] == s[0] and span[1] < s[2] and s[1] < span[2] for s in spans)
        static.append(a.clone() if a.is_inference() or overlaps else a)
        if span is not None:
            spans.append(span)
    return tuple(static)


def _span(tensor: _Tensor) -> tuple[int, int, int] | None:
    """(storage address, first byte, one past the last byte) of what ``tensor`` can reach;
    None when it is empty."""
    if tensor.numel() == 0:
        return None
    extent = sum((size - 1) * stride
                 for size, stride in zip(tensor.shape, tensor.stride(), strict=True))
    start = tensor.data_ptr()
    return (tensor.untyped_storage().data_ptr(), start,
            start + (extent + 1) * tensor.element_size())


def _sample_device(module: torch.nn.Module, args: tuple) -> int:
    devices = {a.device for a in args}
    if len(devices) != 1 or next(iter(devices)).type != "cuda":
        raise OptionsError("sample_args", ", ".join(sorted(str(d) for d in devices)),
                           "tensors on one CUDA device; move them with .cuda()")
    device = next(iter(devices))
    # Part of every capture's time: one walk over the modules, names only for the error
    # (named_parameters() builds a dotted name and a dedup set entry per tensor: about a
    # millisecond for ResNet-50, 5% of its capture). A plain stack rather than modules(),
    # whose nested generators build a dotted prefix per module, and device indices rather
    # than torch.device objects: a third less host time.
    index = device.index
    seen: set[int] = set()
    stack: list[torch.nn.Module | None] = [module]
    while stack:
        sub = stack.pop()
        if sub is None or id(sub) in seen:
            continue
        seen.add(id(sub))
        for tensors in (sub._parameters, sub._buffers):
            for tensor in tensors.values():
                if tensor is not None and (not tensor.is_cuda or tensor.get_device() != index):
                    _wrong_device(module, device)
        stack.extend(sub._modules.values())
    return device.index


def _wrong_device(module: torch.nn.Module, device: torch.device) -> None:
    for name, tensor in list(module.named_parameters()) + list(module.named_buffers()):
        if tensor.device != device:
            raise OptionsError("module", f"{name} on {tensor.device}",
                               f"a module on {device}, like sample_args; call "
                               f"module.to('{device}') first")


class GraphedModule:
    """A module's forward captured as a CUDA graph: call it like the module.

    Attributes
    ----------
    module : torch.nn.Module
        The module (run eagerly for calls that do not match the capture).
    graph : cugraphrt.Graph
        The graph; ``graph.pool().stats()`` shows its memory.
    torch_graph : torch.cuda.CUDAGraph or None
        Torch's graph that owns the capture (None once ``graph`` was reset): read through
        a weak reference, as ``cugraphrt_torch.graph.torch_graph`` is.
    static_inputs : tuple of torch.Tensor
        The input buffers the graph reads.
    static_outputs : Any
        What the module returned during capture; every replay overwrites it. Calls return
        fresh tensors over it (see ``check_outputs``), never these.
    """

    def __init__(self, module, captured: CapturedGraph, static_inputs: tuple, outputs: Any,
                 copy_outputs: bool, strict: bool, *, order: OverwriteOrder | None = None,
                 check: OutputCheck | None = None, inputs: str = "copy",
                 written: list[bool] | None = None) -> None:
        self.module = module
        cuda_graph = self.graph = captured.graph
        # torch_graph reads through the capture's weak reference. Its replay object does
        # reach torch's graph, but the owner disarms it before letting the graph go.
        self._captured = captured
        seq = captured.seq
        self.static_inputs = static_inputs
        self.static_outputs = outputs
        self._training = module.training
        self._strict = strict
        self._warned: set = set()
        self._num_inputs = len(static_inputs)
        # Copying into a static input must not record autograd history: detached buffers.
        statics = [t.detach() for t in static_inputs]
        which = None
        if check is not None:
            leaves, _, _ = _tree.flatten(outputs, "output")
            which = [i for i, leaf in enumerate(leaves) if checkable(leaf)]
        # The core's call path (cugraphrt.adapter.CallPath): copy in, settle, replay on
        # torch's current stream, hand out.
        paths = [f"args[{i}]" for i in range(len(statics))]
        #: With inputs="rebind": the rebinding plan (``complete``, ``explain``); else None.
        self.rebinding = None if inputs == "copy" else plan_for(
            TORCH, statics, paths, cuda_graph, _tree.flatten(outputs, "output")[0],
            written=written)
        load = (CopyIn(TORCH, statics, paths) if self.rebinding is None else rebind_step(
            TORCH, statics, paths, cuda_graph, self.rebinding,
            f"graph_module({type(module).__name__})", strict=strict))
        self._path = CallPath(
            load,
            order if order is not None else OverwriteOrder(), seq,
            with_write_back(TORCH, load, captured.on_torch_stream),
            HandOut(outputs, TORCH, copy=copy_outputs, check=check, seq=seq, which=which))

    @property
    def torch_graph(self):
        return self._captured.torch_graph

    def __call__(self, *args):
        if self.module.training != self._training:
            return self._mismatch(("training",), args)
        if len(args) != self._num_inputs:
            return self._mismatch(("count",), args)
        try:
            return self._path(args)
        except Mismatch as exc:
            return self._mismatch(("input", exc.index, exc.static, exc.value), args)

    def _mismatch(self, reason: tuple, args: tuple):
        key, message = self._describe(reason, args)
        if self._strict:
            raise ReplayError(message + "; pass inputs like sample_args, or call "
                              "graph_module() again for the new case (strict=True)")
        if key not in self._warned:
            self._warned.add(key)
            warnings.warn(message + "; running the module eagerly (this warning is shown once "
                          "per reason)", UserWarning, stacklevel=3)
        with torch.no_grad():
            return self.module(*args)

    def _describe(self, reason: tuple, args: tuple) -> tuple[tuple, str]:
        kind = reason[0]
        if kind == "training":
            return ("training",), (
                f"the module's training flag changed since capture (expected "
                f"training={self._training}, got training={self.module.training})")
        if kind == "count":
            return ("count",), (f"the graph was captured with {self._num_inputs} inputs (got "
                                f"{len(args)})")
        _, index, static, value = reason
        if not isinstance(value, _Tensor):
            return ("type", index), (f"argument {index} is not a tensor (expected a tensor "
                                     f"like {_fmt(static)}, got {type(value).__name__})")
        for what, expected, got in (("shape", tuple(static.shape), tuple(value.shape)),
                                    ("dtype", static.dtype, value.dtype),
                                    ("device", static.device, value.device)):
            if expected != got:
                return (what, index), (f"argument {index} has a different {what} than at "
                                       f"capture (expected {_fmt(static)}, got {_fmt(value)})")
        return ("input", index), f"argument {index} does not match the capture"

    def __repr__(self) -> str:
        name = type(self.module).__name__
        return f"<cugraphrt_torch.GraphedModule of {name} ({self._num_inputs} inputs)>"


def _fmt(tensor: torch.Tensor) -> str:
    return f"shape {tuple(tensor.shape)} {tensor.dtype} on {tensor.device}"
