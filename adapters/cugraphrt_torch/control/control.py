"""cugraphrt_torch.while_loop and cond: device-side control flow over torch tensors.

The core (``cugraphrt.adapter.control``) builds the conditional nodes; this module lets torch take
part in capturing their bodies, inside :class:`cugraphrt_torch.graph`:

* torch's current stream is the body stream, so torch sees the body as capturing (its RNG and
  allocator take their capture paths);
* torch's allocations in a body go to a torch MemPool of its own, built on the capture's
  cugraphrt pool like the graph's (:func:`cugraphrt_torch.capture._alloc.body_pool`): torch routes a
  capture's allocations by its CUDA capture id, and a body is captured under another id;
* torch's CUDA RNG is refused in loop bodies: torch fixes each draw's philox offset when it
  captures the draw, so a loop body would draw the same numbers on every iteration. In a
  ``cond`` branch (run at most once per replay) it is fresh on every replay, as in any graph.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

import torch

from cugraphrt.adapter import Capture, ControlFrontend, control
from cugraphrt.errors import CaptureError

from .._internals import ops as _ops
from ..capture import _alloc, _errors, _torch
from ..capture.dlpack import from_cupy, to_cupy

__all__ = ["while_loop", "cond"]


def while_loop(cond_fn: Callable[[], torch.Tensor], body_fn: Callable[[], Any], *,
               max_iters: int | None = None) -> torch.Tensor:
    """Run ``body_fn()`` while ``cond_fn()`` is true, on the device inside a capture.

    The torch counterpart of :func:`cugraphrt.while_loop`: ``cond_fn`` returns a 0-d bool or
    integer CUDA tensor, ``body_fn`` updates tensors in place. Inside
    :class:`cugraphrt_torch.graph` the loop is one conditional node of the graph; outside a
    capture it runs eagerly.

    Returns
    -------
    torch.Tensor
        A 0-d int64 CUDA tensor: the number of iterations run (by the latest replay).

    Raises
    ------
    CaptureError
        As :func:`cugraphrt.while_loop`, and for torch's CUDA RNG inside the body (draw
        with :mod:`cugraphrt.random` on :func:`to_cupy` views instead), inside a
        ``torch.cuda.graph`` capture, or inside a CuPy-only ``cugraphrt.graph``.
    OptionsError
        For a non-callable function or a negative ``max_iters``.
    """
    limit = control.check_loop_args(cond_fn, body_fn, max_iters)
    capture = _active_capture("cugraphrt_torch.while_loop")
    if capture is None:
        count = control.run_eagerly(lambda: bool(_checked(cond_fn(), "cond_fn()")), body_fn,
                                    limit)
        return torch.tensor(count, dtype=torch.int64, device=_device())
    counter = control.capture_while(
        capture, lambda: _as_cupy(cond_fn(), "cond_fn()"), body_fn, limit, _FRONTEND)
    return from_cupy(counter)


def cond(pred: torch.Tensor, true_fn: Callable[[], Any],
         false_fn: Callable[[], Any] | None = None) -> None:
    """Run ``true_fn()`` if ``pred`` is nonzero, else ``false_fn()``; on the device inside a
    capture.

    The torch counterpart of :func:`cugraphrt.cond`, with ``pred`` a 0-d bool or integer
    CUDA tensor. torch's RNG may be used in the branches (fresh numbers on every replay).
    """
    control.check_branch_args(true_fn, false_fn)
    _checked(pred, "pred")
    capture = _active_capture("cugraphrt_torch.cond")
    if capture is None:
        if bool(pred):
            true_fn()
        elif false_fn is not None:
            false_fn()
        return
    control.capture_cond(capture, _as_cupy(pred, "pred"), true_fn, false_fn, _FRONTEND)


class _TorchFrontend(ControlFrontend):
    name = "cugraphrt_torch"

    def enter(self, capture: Capture, stream, body_id: int,
              kind: str) -> contextlib.AbstractContextManager[Any]:
        contexts = contextlib.ExitStack()
        device = capture.device_id
        contexts.enter_context(torch.cuda.stream(_torch.torch_stream_for(stream.ptr, device)))
        contexts.enter_context(_alloc.body_pool(capture, body_id))
        if kind == "while_loop":
            contexts.enter_context(_NoTorchRandom())
        return contexts

    def translate(self, exc: BaseException, capture: Capture) -> BaseException | None:
        return _errors.capture_error(exc, capture=capture)


_FRONTEND = _TorchFrontend()


class _NoTorchRandom(_ops.TorchDispatchMode):
    """Refuses torch's random draws in loop bodies.

    Operations that may draw carry the ``nondeterministic_seeded`` tag; those whose dropout
    is off (attention kernels with ``dropout_p=0``, dropout and RNNs outside training) draw
    nothing and pass.
    """

    @classmethod
    def ignore_compile_internals(cls) -> bool:
        # Without this, dynamo treats the mode as a user mode: a torch.compile'd body runs
        # eagerly inside the loop, and dynamo then skips that code for good, eager
        # everywhere. With it, the compiled code runs, and the mode still sees the ops
        # it dispatches at run time (Inductor draws its seeds with aten.randint).
        return True

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if torch.Tag.nondeterministic_seeded in func.tags and draws(func, args, kwargs):
            raise CaptureError(
                f"torch's CUDA RNG ({func}) inside a cugraphrt_torch.while_loop body would draw "
                f"the same numbers on every iteration (got a random operation; torch fixes a "
                f"captured draw's offset when it captures it); draw with cugraphrt.random on "
                f"cugraphrt_torch.to_cupy views (fresh on every iteration), or outside the loop")
        return func(*args, **kwargs)


_OFF_WHEN_FALSE = ("train", "training")
_DROPOUT = ("dropout_p", "dropout")


def draws(func, args: tuple, kwargs: dict) -> bool:
    """Whether a ``nondeterministic_seeded`` operation draws random numbers with these
    arguments (its schema's defaults filled in)."""
    values = {}
    for index, argument in enumerate(_ops.schema_of(func).arguments):
        if index < len(args) and not argument.kwarg_only:
            values[argument.name] = args[index]
        elif argument.name in kwargs:
            values[argument.name] = kwargs[argument.name]
        elif argument.has_default_value():
            values[argument.name] = argument.default_value
    if any(name in values and not values[name] for name in _OFF_WHEN_FALSE):
        return False
    for name in _DROPOUT:
        if name in values:
            return float(values[name]) > 0
    if "dropout" in func.__name__ and "p" in values:  # native_dropout, alpha_dropout, ...
        return float(values["p"]) > 0
    return True


def _active_capture(what: str) -> Capture | None:
    capture = control.active_capture(what)
    if capture is None:
        if torch.cuda.is_current_stream_capturing():
            raise CaptureError(
                f"{what} inside a capture that cugraphrt did not begin (got torch's current "
                f"stream capturing, e.g. under torch.cuda.graph); capture with "
                f"cugraphrt_torch.graph(), or call it outside the capture to run it eagerly")
        return None
    if not _alloc.is_torch_capture(capture):
        raise CaptureError(
            f"{what} inside cugraphrt.graph() (got a capture torch does not know about, so "
            f"torch could not allocate in the bodies); capture torch work with "
            f"cugraphrt_torch.graph()")
    return capture


def _checked(value, what: str) -> torch.Tensor:
    if not isinstance(value, torch.Tensor) or value.device.type != "cuda" or value.dim() != 0 \
            or value.is_floating_point() or value.is_complex():
        got = (f"a {value.device.type} tensor of shape {tuple(value.shape)} and dtype "
               f"{value.dtype}" if isinstance(value, torch.Tensor) else type(value).__name__)
        raise CaptureError(
            f"{what} must be a 0-d bool or integer CUDA tensor (got {got}); compute it on "
            f"the device, e.g. residual.norm() > tol or (tokens == eos).all(): a host value "
            f"cannot change between replays")
    return value


def _as_cupy(value, what: str):
    tensor = _checked(value, what).detach()
    if tensor.dtype == torch.bool:
        tensor = tensor.view(torch.uint8)  # the condition kernel reads bytes
    return to_cupy(tensor)


def _device() -> torch.device:
    return torch.device("cuda", torch.cuda.current_device())
