"""make_graphed_callables: forward and backward of torch callables as cugraphrt graphs.

The counterpart of ``torch.cuda.make_graphed_callables`` on cugraphrt graphs and pools:
forward graphs captured in call order, backward graphs in reverse, all in one memory pool,
and an autograd Function per callable that replays them. See docs/training.md.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch

import cugraphrt
from cugraphrt.adapter import tree as _tree
from cugraphrt.errors import CugraphrtError, OptionsError

from .._internals import tensors as _tensors
from ..capture._fence import on_capture_stream
from ..capture._output_check import FIX_CLONE, checkable, make_check
from ..capture.capture import graph as capture_graph
from ._autograd_guard import guard_for
from ._autograd_plan import ArgPlan, OutputPlan, check_module, describe, name_of, normalize
from ._autograd_runtime import GraphedCallable, autocast_state, graphed_forward

if TYPE_CHECKING:
    from ..capture._adopted import CapturedGraph
    from ._autograd_guard import AliasGuard

__all__ = ["make_graphed_callables", "GraphedCallable"]


def make_graphed_callables(
    callables: Callable | tuple[Callable, ...],
    sample_args: tuple,
    num_warmup_iters: int = 3,
    allow_unused_input: bool = False,
    pool: cugraphrt.MemPool | None = None,
    *,
    sample_kwargs: dict | tuple | None = None,
    strict_dtypes: bool = False,
    check_outputs: bool | None = None,
) -> Any:
    """Capture the forward and backward of callables and return drop-in graphed versions.

    Each graphed callable runs its forward as one graph replay inside one autograd node,
    whose backward is one replay of the backward graph. Modules come back as the same
    module with a new ``forward`` (graphs in the training mode of the capture, the original
    forward in the other mode); functions come back as :class:`GraphedCallable` objects.

    Parameters
    ----------
    callables : torch.nn.Module or function, or tuple of them
        What to graph. A tuple is captured into one shared pool, so its order must be the
        order the callables run in (forwards in order, backwards in reverse).
    sample_args : tuple, or tuple of tuples
        Arguments for one call: tensors, nested in tuples, lists and dicts as the callable
        takes them; other values are fixed at capture and checked on every call. One tuple
        per callable when ``callables`` is a tuple. Each tensor's ``requires_grad`` must be
        the one real inputs will have: gradients are captured only for those that require it.
    num_warmup_iters : int, default 3
        Eager forward and backward runs on a side stream before capture. Module buffers
        (BatchNorm statistics) are restored after them.
    allow_unused_input : bool, default False
        Allow tensors that require grad but do not affect the outputs (their gradient is
        None); by default they are an error.
    pool : cugraphrt.MemPool, optional
        Pool to capture into, shared with other graphs (``cugraphrt.graph_pool_handle()``
        or ``Graph.pool()``); by default a new private one.
    sample_kwargs : dict, or tuple of dicts (or None), optional
        Keyword arguments for one call, as ``sample_args``.
    strict_dtypes : bool, default False
        By default a floating-point tensor whose dtype differs from its sample's is converted
        as it is copied into the static input, as torch's ``make_graphed_callables`` does
        (under autocast, one graphed module's float16 output feeds the next one's float32
        sample); its gradient is converted back by autograd. ``True`` raises
        :class:`cugraphrt.ReplayError` for any dtype that differs from the sample's.
    check_outputs : bool, optional
        Reading a forward output after a later replay overwrote it raises a ``RuntimeError``
        naming the call that produced it (docs/reliability.md, "Reading an overwritten
        output"). None (the default) means on unless the environment variable
        ``CUGRAPHRT_CHECK_OUTPUTS=0``.

    Returns
    -------
    torch.nn.Module or GraphedCallable, or a tuple of them
        In the shape of ``callables``.

    Raises
    ------
    OptionsError
        For arguments that do not line up; a module with hooks, with buffers that require
        grad, or graphed already; sample tensors not on one CUDA device; autocast with its
        weight cache on; an unused input without ``allow_unused_input``; a callable whose
        outputs depend on tensors requiring grad that are neither arguments nor parameters.
    CaptureError
        When a callable does something capture forbids.
    CugraphrtError
        Without a CUDA build of torch and a GPU.

    Notes
    -----
    Calls check the number, nesting, shape, dtype (see ``strict_dtypes``) and device of tensor
    arguments and the value
    of the others (:class:`cugraphrt.ReplayError`), copy new tensors into the static inputs
    (no copy for a tensor at the static input's address) and return tensors whose values the
    next call overwrites. Gradients handed to autograd are never left aliasing a buffer a
    later replay writes: see docs/training.md, "Gradient accumulation".
    """
    entries, single = normalize(callables, sample_args, sample_kwargs)
    _check_options(num_warmup_iters, allow_unused_input, pool)
    if not isinstance(strict_dtypes, bool):
        raise OptionsError("strict_dtypes", strict_dtypes, "True or False")
    if check_outputs is not None and not isinstance(check_outputs, bool):
        raise OptionsError("check_outputs", check_outputs, "True, False or None (the default)")
    _check_autocast_cache()
    for i, (fn, _, _) in enumerate(entries):
        if isinstance(fn, torch.nn.Module):
            check_module(fn, "callables" if single else f"callables[{i}]")
    work = [_Work(fn, args, kwargs, strict_dtypes) for fn, args, kwargs in entries]
    device = _sample_device(work, single)
    _require_cuda()
    autocast = autocast_state()
    import cupy

    with torch.inference_mode(False), torch.enable_grad(), torch.cuda.device(device), \
            cupy.cuda.Device(device):
        if num_warmup_iters > 0:
            restore = _snapshot_buffers(work)
            try:
                _warm_up(work, num_warmup_iters, allow_unused_input)
            finally:
                restore()
        guard = _capture(work, pool, allow_unused_input)
    results: list[Any] = []
    for item in work:
        params, names = zip(*item.param_targets, strict=False) if item.param_targets else ((), ())
        # All or nothing: an output handed out as .data would share the static storage.
        check = make_check(check_outputs, f"graphed callable {item.name}", FIX_CLONE, guard) \
            if all(checkable(t) for t in item.outputs.statics) else None
        rt = GraphedCallable(
            name=item.name, fn=item.fn, args=item.plan, outputs=item.outputs,
            forward_graph=item.fwd_graph, backward_graph=item.bwd_graph, guard=guard,
            forward_seq=item.fwd_seq, backward_seq=item.bwd_seq, params=params,
            param_names=names, static_grad_outputs=item.grad_outputs,
            static_grad_inputs=item.grad_inputs, autocast=autocast, check=check)
        if isinstance(item.fn, torch.nn.Module):
            item.fn.forward = graphed_forward(rt, item.fn, item.fn.forward)
            results.append(item.fn)
        else:
            results.append(rt)
    return results[0] if single else tuple(results)


class _Work:
    """One callable on its way through warm-up and capture."""

    __slots__ = ("fn", "args", "kwargs", "name", "plan", "user_targets", "param_targets",
                 "outputs", "fwd_graph", "bwd_graph", "fwd_seq", "bwd_seq", "grad_outputs",
                 "grad_inputs", "_targets")

    # Set by _capture().
    outputs: OutputPlan
    fwd_graph: cugraphrt.Graph
    fwd_seq: int

    def __init__(self, fn: Callable, args: tuple, kwargs: dict, strict_dtypes: bool) -> None:
        self.fn, self.args, self.kwargs = fn, args, kwargs
        self.name = name_of(fn)
        self.plan = ArgPlan(args, kwargs, self.name, convert_dtypes=not strict_dtypes)
        self.user_targets = [(self.plan.statics[i], self.plan.paths[i])
                             for i in self.plan.grad_indices]
        self.param_targets: list = []
        self._targets: list | None = None
        self.bwd_graph: cugraphrt.Graph | None = None
        self.bwd_seq = -1
        self.grad_outputs: list = []
        self.grad_inputs: tuple = ()

    def targets(self) -> list:
        """(tensor, label) of everything a gradient is captured for: arguments, then
        parameters. Parameters are read after the first call (lazy modules create them
        there), once: a walk of a ResNet's modules per warm-up and capture was build time."""
        if self._targets is None:
            if isinstance(self.fn, torch.nn.Module):
                self.param_targets = [(p, n) for n, p in self.fn.named_parameters()
                                      if p.requires_grad]
            self._targets = self.user_targets + [(p, f"parameter {n!r}")
                                                 for p, n in self.param_targets]
        return self._targets

    def call(self) -> Any:
        return self.fn(*self.args, **self.kwargs)


def _check_options(num_warmup_iters: Any, allow_unused_input: Any, pool: Any) -> None:
    if isinstance(num_warmup_iters, bool) or not isinstance(num_warmup_iters, int) \
            or num_warmup_iters < 0:
        raise OptionsError("num_warmup_iters", num_warmup_iters, "an int >= 0")
    if not isinstance(allow_unused_input, bool):
        raise OptionsError("allow_unused_input", allow_unused_input, "True or False")
    if pool is not None and not isinstance(pool, cugraphrt.MemPool):
        raise OptionsError("pool", pool, "a cugraphrt.MemPool (cugraphrt.graph_pool_handle() "
                                         "or Graph.pool()) or None for a private pool")


def _check_autocast_cache() -> None:
    # With its cache on, autocast keeps the casts of weights made during the capture and
    # reuses them eagerly afterwards: tensors of the graph's pool escaping into eager code.
    if autocast_state()[0] and torch.is_autocast_cache_enabled():
        raise OptionsError(
            "torch.autocast(cache_enabled=...)", True,
            "cache_enabled=False around make_graphed_callables and the graphed calls: the "
            "weight-cast cache would hold tensors of the capture",
        )


def _sample_device(work: list[_Work], single: bool) -> int:
    device = None
    for i, item in enumerate(work):
        for index, leaf, *_ in item.plan.tensors:
            path = item.plan.paths[index]
            where = path if single else f"callable {i} {path}"
            if not leaf.is_cuda:
                raise OptionsError("sample_args", where, f"CUDA tensors (got {describe(leaf)} "
                                                         f"at {where}); move it with .cuda()")
            if device is None:
                device = leaf.get_device()
            elif leaf.get_device() != device:
                raise OptionsError("sample_args", where, f"tensors on one device (got "
                                                         f"cuda:{leaf.get_device()} at {where} "
                                                         f"and cuda:{device} before)")
    if device is None:
        device = torch.cuda.current_device() if torch.cuda.is_available() else 0
    return device


def _require_cuda() -> None:
    if not torch.cuda.is_available():
        raise CugraphrtError(
            f"make_graphed_callables needs a CUDA build of PyTorch and a visible GPU (got torch "
            f"{torch.__version__}, torch.cuda.is_available() = False); install a CUDA build "
            f"of torch and run on a machine with an NVIDIA GPU"
        )


def _snapshot_buffers(work: list[_Work]) -> Callable[[], None]:
    """Undo what warm-up does to module buffers (BatchNorm statistics and counters)."""
    # A few multi-tensor copies per dtype each way, not a clone and a copy_ per buffer: a
    # ResNet has three buffers per BatchNorm, and each launch is build time on the host.
    groups: dict[tuple, tuple[list, list]] = {}
    for item in work:
        if isinstance(item.fn, torch.nn.Module):
            for buffer in item.fn.buffers():
                held, copies = groups.setdefault((buffer.dtype, buffer.device), ([], []))
                held.append(buffer.detach())
                copies.append(torch.empty_like(buffer))
    with torch.no_grad():
        for held, copies in groups.values():
            _tensors.foreach_copy(copies, held)

    def restore() -> None:
        with torch.no_grad():
            for held, copies in groups.values():
                _tensors.foreach_copy(held, copies)

    return restore


def _tensors_requiring_grad(outputs: Any) -> list[torch.Tensor]:
    return [o for o in _tree.leaves_of(outputs) if isinstance(o, torch.Tensor) and o.requires_grad]


def _warm_up(work: list[_Work], iterations: int, allow_unused: bool) -> None:
    # Eager runs first, so lazy initialization (cuBLAS handles, cuDNN autotuning, lazy
    # modules) happens outside the capture; on the capture stream (see capture._fence), in
    # torch's own pool as torch's make_graphed_callables does: the backward runs on
    # autograd's device thread, which the capture's thread-keyed warm-up pool would not reach.
    with on_capture_stream(torch.cuda.current_device()):
        for item in work:
            for _ in range(iterations):
                outputs = _tensors_requiring_grad(item.call())
                targets = item.targets()
                if outputs and targets:
                    grads = torch.autograd.grad(
                        outputs, [t for t, _ in targets],
                        grad_outputs=[torch.empty_like(o) for o in outputs], allow_unused=True)
                    _check_unused(grads, targets, item.name, allow_unused)
                    del grads
                del outputs


def _capture(work: list[_Work], pool, allow_unused: bool):
    """Forward graphs in call order, then backward graphs in reverse, into one pool."""
    mem = pool
    guard: AliasGuard | None = None
    for item in work:
        graph = cugraphrt.Graph()
        with capture_graph(graph, pool=mem) as capture:
            outputs = item.call()
        mem = mem if mem is not None else graph.pool()
        guard = guard or guard_for(mem)
        item.fwd_graph, item.fwd_seq = graph, _captured(capture).seq
        item.outputs = OutputPlan(outputs, item.name)
        targets = item.targets()
        diff = [item.outputs.statics[k] for k in item.outputs.diff]
        _check_foreign(diff, targets, item.name)
    for item in reversed(work):
        targets = item.targets()
        diff = [item.outputs.statics[k] for k in item.outputs.diff]
        item.grad_outputs = [torch.empty_like(o) for o in diff]
        item.grad_inputs = (None,) * len(targets)
        if not (diff and targets):
            continue
        graph = cugraphrt.Graph()
        with capture_graph(graph, pool=mem) as capture:
            grads = torch.autograd.grad(diff, [t for t, _ in targets],
                                        grad_outputs=item.grad_outputs, allow_unused=True)
        item.bwd_graph, item.bwd_seq = graph, _captured(capture).seq
        _check_unused(grads, targets, item.name, allow_unused)
        item.grad_inputs = tuple(grads)
    return guard


def _captured(capture: capture_graph) -> CapturedGraph:
    # Its seq is the graph's number in the pool's order, which the guard (guard_for) keeps.
    captured = capture.captured
    assert captured is not None  # set by a successful capture
    return captured


def _check_unused(grads, targets, name: str, allow_unused: bool) -> None:
    if allow_unused:
        return
    unused = [label for g, (_, label) in zip(grads, targets, strict=False) if g is None]
    if unused:
        raise OptionsError(
            "allow_unused_input", False,
            f"every tensor that requires grad must affect the outputs of {name} (got no "
            f"gradient path from {', '.join(unused)}); pass allow_unused_input=True, or "
            f"requires_grad_(False) on them",
        )


def _check_foreign(outputs: list, targets: list, name: str) -> None:
    """Reject outputs that depend on tensors requiring grad that are not graph inputs.

    Their gradients would be silently lost: the backward graph computes gradients for the
    arguments and parameters only (a function reading a global nn.Parameter, say).
    """
    allowed = {id(t) for t, _ in targets}
    # The walk stops at the graph's inputs: a sample argument computed from other tensors
    # (not a leaf) ends the graph there, as it does for the captured backward.
    seen = {id(t.grad_fn): t.grad_fn for t, _ in targets if t.grad_fn is not None}
    foreign = []
    stack = [o.grad_fn if o.grad_fn is not None else o for o in outputs]
    while stack:
        node = stack.pop()
        if node is None or id(node) in seen:
            continue
        seen[id(node)] = node  # kept alive, so no id is reused during the walk
        leaf = node if isinstance(node, torch.Tensor) else getattr(node, "variable", None)
        if leaf is not None:
            if id(leaf) not in allowed:
                foreign.append(leaf)
            continue
        stack.extend(next_node for next_node, _ in node.next_functions)
    if foreign:
        raise OptionsError(
            f"callable {name}", f"{len(foreign)} tensor(s) outside its inputs",
            f"outputs that depend on tensors requiring grad only through the callable's "
            f"arguments and module parameters (got {describe(foreign[0])}"
            f"{' and more' if len(foreign) > 1 else ''}, read from elsewhere); their gradients "
            f"would be lost: pass them as arguments, or graph a Module that owns them",
        )
