"""A graphed callable at call time: copy in, replay forward, and backward through autograd.

Everything a call needs is decided at capture; the call path below does no pytree work for
positional tensors, no ``torch.no_grad()`` context (2 us each in CPython), and allocates only
what autograd needs (one fresh tensor per output and per gradient handed out) plus one weak
reference per gradient for the alias guard and, with the overwritten-output check, one per
output (each output then has a storage of its own: see ``_output_check``). It replays through
the adapter's replay object on torch's current stream (torch's CUDAGraph replay, which
advances the RNG).
"""

from __future__ import annotations

import contextlib
import inspect
import weakref
from collections.abc import Callable, Sequence
from typing import Any, cast

import torch
from torch.autograd.function import once_differentiable

from cugraphrt import adapter as core
from cugraphrt.adapter import CallPath, OutputCheck
from cugraphrt.errors import ReplayError

from .._internals import autograd as _autograd_internals
from ._autograd_guard import AliasGuard, GradBuffers
from ._autograd_plan import ArgPlan, OutputPlan

__all__ = ["GraphedCallable", "graphed_forward"]

_grad_enabled = _autograd_internals.grad_enabled
_set_grad_enabled = _autograd_internals.set_grad_enabled
_any_autocast = _autograd_internals.any_autocast
_functorch_active = _autograd_internals.functorch_active
_Tensor = torch.Tensor
_ref = weakref.ref
# Function.apply is a Python classmethod over the C one; its extra work (setup_context
# binding, unwrapping dead functorch wrappers) only matters under functorch transforms, and
# costs about 2 us per call. Call the C one directly outside them.
_c_apply = _autograd_internals.function_apply()


def autocast_state() -> tuple[bool, Any]:
    """CUDA autocast as it affects a capture: (enabled, dtype or None)."""
    try:
        enabled = torch.is_autocast_enabled("cuda")
        return (True, torch.get_autocast_dtype("cuda")) if enabled else (False, None)
    except (TypeError, AttributeError):  # torch < 2.4: the CUDA-only forms
        enabled = torch.is_autocast_enabled()
        return (True, torch.get_autocast_gpu_dtype()) if enabled else (False, None)


class GraphedCallable:
    """A callable captured by :func:`cugraphrt_torch.make_graphed_callables`.

    Call it like the original. Each call checks its arguments against the capture, copies
    new tensors into the static inputs, replays the forward graph and returns fresh tensors
    over the static outputs (the next call overwrites their values, and with ``check``,
    reading them after that raises); backward replays the backward graph.

    Attributes
    ----------
    static_inputs : tuple
        The flattened sample arguments (positional, then keyword in sample order). Passing
        these very tensors skips the copy.
    static_outputs : tuple of Tensor
        The tensors the forward graph writes.
    forward_graph, backward_graph : cugraphrt.Graph
        The graphs (``backward_graph`` is None when nothing needs a gradient).
    """

    def __init__(self, *, name: str, fn: Callable, args: ArgPlan, outputs: OutputPlan,
                 forward_graph, backward_graph, guard: AliasGuard, forward_seq: int,
                 backward_seq: int, params: Sequence, param_names: Sequence[str],
                 static_grad_outputs: Sequence, static_grad_inputs: Sequence,
                 autocast: tuple = (False, None), check: OutputCheck | None = None) -> None:
        self.name = name
        # A graphed module holds its new forward, which holds this object: the module is
        # reached weakly (a cycle would keep the graphs alive until a garbage collection).
        self._wrapped = _ref(fn) if isinstance(fn, torch.nn.Module) else (lambda: fn)
        self.forward_graph = forward_graph
        self.backward_graph = backward_graph
        self._args = args
        self._outputs = outputs
        self._flat = args.is_flat
        self._nargs = args.num_args
        self._direct = outputs.is_direct
        self._bwd_replay = _replayer(backward_graph) if backward_graph is not None else None
        self._params = tuple(params)
        self._grad_indices = args.grad_indices
        check = check if outputs.statics else None
        if check is not None:
            check.names = [outputs.paths[p] for p in outputs.positions]
        self._lazy_grads = len(outputs.statics) > 1 or bool(outputs.nondiff)
        self._nondiff = outputs.nondiff
        # The core's call path (cugraphrt.adapter.CallPath), forward and backward: copy in,
        # settle the pool's order, replay on torch's current stream, hand out. Its steps
        # reach none of this object (the Function reaches it weakly, see _function_for).
        self._steps = _ForwardSteps(name, args, outputs, autocast, check, forward_seq)
        self._forward = CallPath(self._steps.load, guard, forward_seq, _replayer(forward_graph),
                                 self._steps.hand_out)
        back = self._back = _BackwardSteps(
            name, self._steps, args, outputs, self._params, param_names, static_grad_outputs,
            static_grad_inputs, guard, backward_seq)
        self._keep_leaves = back.keep_leaves
        self._backward_path = None
        if self._bwd_replay is not None:
            self._backward_path = CallPath(back.load, guard, backward_seq, self._bwd_replay,
                                           back.hand_out)
        function = _function_for(self)
        self._slow_apply = function.apply
        self._apply = _c_apply.__get__(None, function) if _c_apply is not None else function.apply

    # -- call path -------------------------------------------------------------------------

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        leaves: tuple | list
        if self._flat and not kwargs and len(args) == self._nargs:
            leaves = args
        else:
            leaves = self._args.leaves_of(args, kwargs)
        if self._bwd_replay is not None and _grad_enabled():
            apply = self._apply if not _functorch_active() else self._slow_apply
            if self._grad_indices:
                out = apply(leaves, *[leaves[i] for i in self._grad_indices], *self._params)
            else:
                out = apply(leaves, *self._params)
        elif _grad_enabled():
            # No gradient can flow: skip autograd, but copy inputs with grad mode off.
            _set_grad_enabled(False)
            try:
                out = self._forward(leaves)
            finally:
                _set_grad_enabled(True)
        else:
            out = self._forward(leaves)
        return out if self._direct else self._outputs.assemble(out)

    def _backward(self, ctx, grads: tuple) -> tuple:
        # backward runs only for a callable with a backward graph (see __call__)
        path = self._backward_path
        assert path is not None  # an internal invariant: a bytecode test, no call
        return path((ctx, grads))

    @property
    def _gen(self) -> int:
        """Forward replays so far; a backward must belong to the latest."""
        return self._steps.gen

    # -- introspection ---------------------------------------------------------------------

    @property
    def __wrapped__(self) -> Callable | None:
        """The callable that was graphed (None once a graphed module is gone)."""
        return self._wrapped()

    @property
    def static_inputs(self) -> tuple:
        return self._args.statics

    @property
    def static_outputs(self) -> tuple:
        return self._outputs.statics

    def __deepcopy__(self, memo) -> GraphedCallable:
        # Like torch's graphed callables (closures): a deep copy of a graphed module shares
        # the graphs, which read the original parameters.
        return self

    def __repr__(self) -> str:
        kind = "forward+backward" if self.backward_graph is not None else "forward"
        return f"<cugraphrt_torch graphed {self.name} ({kind}, {len(self._args.tensors)} inputs)>"


class _ForwardSteps:
    """The forward's load and hand-out steps: copy the arguments in (converting floating
    dtypes, as torch does), check autocast, count the call; hand out fresh tensors."""

    __slots__ = ("name", "args", "outputs", "autocast", "check", "seq", "gen")

    def __init__(self, name: str, args: ArgPlan, outputs: OutputPlan, autocast: tuple,
                 check: OutputCheck | None, seq: int) -> None:
        self.name = name
        self.args = args
        self.outputs = outputs
        self.autocast = autocast
        self.check = check
        self.seq = seq
        self.gen = 0

    def load(self, leaves) -> None:
        self.args.load(leaves)
        if self.autocast[0] or _any_autocast():
            self._check_autocast()
        self.gen += 1

    def hand_out(self, _token: None) -> Any:
        check = self.check
        outputs = self.outputs
        if check is None:
            return outputs.hand_out()
        if outputs.is_single:
            return check.hand_out_one(self.seq, outputs.statics[0])
        return tuple(check.hand_out(self.seq, outputs.statics, range(len(outputs.statics))))

    def _check_autocast(self) -> None:
        now = autocast_state()
        if now != self.autocast:
            raise ReplayError(
                f"graphed callable {self.name} was captured with CUDA autocast "
                f"{_autocast_text(self.autocast)} (got a call with autocast "
                f"{_autocast_text(now)}); the casts are part of the graph: call it under the "
                f"autocast state of the capture, or graph it again"
            )


class _BackwardSteps:
    """The backward's load and hand-out steps, on ``(ctx, grads)``: check that the call is
    the latest forward's, copy the incoming gradients in; hand the gradients out (guarded
    against the next overwrite, see _autograd_guard). Built from the capture's plan, with
    everything a backward call reads."""

    __slots__ = ("name", "forward", "grad_outs", "n_result", "grads", "guard", "seq",
                 "keep_leaves", "slot_args")

    def __init__(self, name: str, forward: _ForwardSteps, args: ArgPlan, outputs: OutputPlan,
                 params: tuple, param_names: Sequence[str], static_grad_outputs: Sequence,
                 static_grad_inputs: Sequence, guard: AliasGuard, seq: int) -> None:
        self.name = name
        self.forward = forward
        self.guard = guard
        self.seq = seq
        #: (output index, static gradient buffer, its address, its strides) per
        #: differentiable output: where an incoming gradient is copied.
        self.grad_outs = tuple(
            (k, buf, buf.data_ptr(), buf.stride())
            for k, buf in zip(outputs.diff, static_grad_outputs, strict=False))
        # backward returns (None for the leaves argument, one gradient per tensor input).
        grad_indices = args.grad_indices
        self.n_result = 1 + len(grad_indices) + len(params)
        owners = [None] * len(grad_indices) + list(params)
        labels = [args.paths[i] for i in grad_indices]
        labels += [f"parameter {n!r}" for n in param_names]
        slots: list = []
        #: Per handed-out gradient: the argument index whose leaf may adopt it, or None (a
        #: parameter's).
        self.slot_args: list[int | None] = []
        for k, grad in enumerate(static_grad_inputs):
            if grad is not None:
                slots.append((1 + k, grad, owners[k], labels[k]))
                self.slot_args.append(grad_indices[k] if owners[k] is None else None)
        held = list(args.statics) + list(outputs.statics) + list(static_grad_outputs)
        held += [g for g in static_grad_inputs if g is not None]
        self.grads = GradBuffers(slots, [t for t in held if isinstance(t, _Tensor)], name)
        #: Whether a forward keeps its leaf arguments (their .grad may adopt a gradient).
        self.keep_leaves = any(a is not None for a in self.slot_args)

    def load(self, call: tuple) -> Any:
        ctx, grads = call
        gen = self.forward.gen
        if ctx.gen != gen:
            raise ReplayError(
                f"backward of graphed callable {self.name} for its call #{ctx.gen}, but its "
                f"forward graph has been replayed since (got call #{gen} as the latest); "
                f"the graph keeps the activations of the latest call only: run each call's "
                f"backward before calling the callable again, or graph one copy per use"
            )
        for k, static, ptr, stride in self.grad_outs:
            grad = grads[k]
            if grad is None:  # an output nothing used: its gradient is zero
                static.zero_()
            elif grad.data_ptr() != ptr:
                static.copy_(grad)
            elif grad.stride() != stride:  # the buffer itself, laid out differently
                static.copy_(grad.clone())
        return ctx

    def hand_out(self, ctx) -> tuple:
        result = [None] * self.n_result
        handed = self.grads.hand_out(result)
        leaves = self._leaf_refs(ctx.leaves) if self.keep_leaves else ()
        self.guard.record(self.seq, self.grads.watch, handed, leaves)
        return tuple(result)

    def _leaf_refs(self, leaves) -> tuple:
        # The leaf argument tensors gradients went to: their .grad may adopt the gradient.
        refs = []
        for index in self.slot_args:
            value = None if index is None else leaves[index]
            leaf = isinstance(value, _Tensor) and value.is_leaf
            refs.append(_ref(value) if leaf else None)
        return tuple(refs)


def _replayer(cuda_graph) -> Callable[[], None]:
    """The graph's replay on torch's current stream, where autograd runs the Function.

    The adapter's ``Graph.replay()`` defaults to CuPy's current stream, which in a torch
    training loop is not torch's (a loop under ``torch.cuda.stream(s)``); the graph's route
    (the adapter's replay object) offers the torch-stream form that ``graph_module`` uses
    too. The callable holds the graph (``forward_graph``, ``backward_graph``), so the route
    lives as long as it.
    """
    return getattr(core.route_of(cuda_graph), "on_torch_stream", cuda_graph.replay)


def _autocast_text(state: tuple) -> str:
    return f"on ({state[1]})" if state[0] else "off"


def _function_for(rt: GraphedCallable) -> type[torch.autograd.Function]:
    """The autograd Function of one graphed callable (forward and backward replays).

    The Function reaches the callable weakly: the callable holds the Function, and a cycle
    would keep its graphs alive until a garbage collection. Each call's autograd node holds
    the callable (``ctx.runtime``), so a backward still to run keeps the graphs it replays.
    """
    runtime = _ref(rt)
    # Named after the callable, so autograd's node reads "Graphed_LinearBackward".
    name = "Graphed_" + "".join(c if c.isalnum() else "_" for c in rt.name)
    del rt

    def backward_once(ctx, *grads):
        return ctx.runtime._backward(ctx, grads)

    # create_graph=True runs backward with grad mode on: then behave like torch's graphed
    # callables (first-order gradients, an error on differentiating them again).
    slow_backward = once_differentiable(backward_once)

    def forward(ctx, leaves, *tensors):
        rt = runtime()  # alive: its __call__ is running
        out = rt._forward(leaves)
        ctx.runtime = rt
        ctx.gen = rt._gen
        if rt._keep_leaves:
            ctx.leaves = leaves
        if rt._lazy_grads:
            ctx.set_materialize_grads(False)
        if rt._nondiff:
            ctx.mark_non_differentiable(
                *((out,) if isinstance(out, _Tensor) else [out[k] for k in rt._nondiff]))
        return out

    def backward(ctx, *grads):
        if _grad_enabled():
            return slow_backward(ctx, *grads)
        return ctx.runtime._backward(ctx, grads)

    return cast("type[torch.autograd.Function]",
                type(name, (torch.autograd.Function,),
                     {"forward": staticmethod(forward), "backward": staticmethod(backward)}))


def graphed_forward(rt: GraphedCallable, module: torch.nn.Module, original: Callable
                    ) -> Callable:
    """A module's new ``forward``: the graphs in the training mode of the capture, the
    original forward in the other mode.

    It lives in the module's ``__dict__``, so it reaches the module weakly (and the module's
    own forward as a plain function): a cycle would keep the graphs alive until a garbage
    collection once the module is dropped.
    """
    training = module.training
    module_ref = _ref(module)
    if getattr(original, "__self__", None) is module:
        function = original.__func__  # type: ignore[attr-defined]

        def run_original(*args: Any, **kwargs: Any) -> Any:
            return function(module_ref(), *args, **kwargs)
    else:
        function = run_original = original

    def forward(*args: Any, **kwargs: Any) -> Any:
        owner = module_ref()  # None only for a forward kept without its module
        if owner is None or owner.training == training:
            return rt(*args, **kwargs)
        return run_original(*args, **kwargs)

    attrs: Any = forward  # function attributes, for inspection
    attrs.graphed = rt
    attrs.__wrapped__ = function
    with contextlib.suppress(TypeError, ValueError):  # the signature of the call, no self
        attrs.__signature__ = inspect.signature(original)
    return forward
