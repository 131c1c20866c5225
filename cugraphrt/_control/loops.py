"""Device-side control flow: loops and branches that run inside one graph launch.

:func:`while_loop` and :func:`cond` work both ways. Inside a cugraphrt capture, the loop or
branch becomes a CUDA conditional node (see :mod:`cugraphrt._cuda.conditional`): its bodies are
captured from the functions given, and a one-thread kernel sets the node's condition from the
0-d device array the predicate is, so every replay decides on the device how many iterations
run, with no host round trip. Outside a capture the same call runs eagerly and reads the
predicate on the host, so one function serves both and the two can be compared.

Bodies work on state in place (graph memory is static: an array a body allocates lives at one
address across iterations and replays); allocations in bodies come from the capture's pool.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import cupy
import numpy as np

from cugraphrt._capture import diagnose as _diagnose
from cugraphrt._capture import stream_capture as _capture
from cugraphrt._control import bodies as _bodies
from cugraphrt._cuda import conditional as _conditional
from cugraphrt._cuda import runtime as _cuda
from cugraphrt.errors import CaptureError, OptionsError

__all__ = ["while_loop", "cond"]

_NO_LIMIT = np.iinfo(np.int64).max
_COND_LABELS = ("cond body", "cond else body")
_HOST_ADVICE = ("a body is replayed by the device, which never returns to the host: compute "
                "conditions as device arrays in cond_fn, and read results after replay()")


class Frontend:
    """How a framework takes part in capturing bodies (the torch adapter overrides it).

    ``enter`` makes the body stream current for the framework (CuPy's current stream is
    already set); ``translate`` turns an exception raised in a body into the error the
    caller sees (a CaptureError when the capture caused it, else None: re-raised as is).
    """

    name = "cugraphrt"

    def enter(self, capture: _capture.Capture, stream: cupy.cuda.Stream, body_id: int,
              kind: str) -> contextlib.AbstractContextManager[Any]:
        return contextlib.nullcontext()

    def translate(self, exc: BaseException, capture: _capture.Capture) -> BaseException | None:
        return _diagnose.capture_error_from(exc, capture)


CUPY = Frontend()


def while_loop(cond_fn: Callable[[], Any], body_fn: Callable[[], Any], *,
               max_iters: int | None = None) -> cupy.ndarray:
    """Run ``body_fn()`` while ``cond_fn()`` is true, on the device when captured.

    Parameters
    ----------
    cond_fn : callable
        Takes no argument and returns a 0-d bool or integer CuPy array computed from the
        loop's state (e.g. ``lambda: cupy.sqrt(rr) > tol``); nonzero continues the loop. In
        a capture it is captured twice: before the loop and at the end of the body.
    body_fn : callable
        Takes no argument and updates the loop's state arrays in place; its return value is
        ignored.
    max_iters : int, optional
        Stop after this many iterations even if ``cond_fn()`` is still true (a device-side
        counter in a capture).

    Returns
    -------
    cupy.ndarray
        A 0-d int64 array: the number of iterations run (by the latest replay, once
        captured).

    Raises
    ------
    CaptureError
        When ``cond_fn()`` returns something other than a 0-d bool or integer device array,
        when a body does what capture forbids (a host synchronization such as ``.get()``),
        inside a capture cugraphrt did not begin, or with a CUDA driver or runtime older
        than 12.4 (no conditional nodes). A failed body rolls the whole capture back.
    OptionsError
        For a non-callable function or a negative ``max_iters``.

    Examples
    --------
    >>> with cugraphrt.graph(g):
    ...     n = cugraphrt.while_loop(lambda: r_norm > tol, step)   # one launch per solve

    .. seealso:: ``cudaGraphConditionalHandleCreate``, ``cudaGraphSetConditional``,
       conditional nodes of type ``cudaGraphCondTypeWhile``
    """
    limit = check_loop_args(cond_fn, body_fn, max_iters)
    capture = active_capture("cugraphrt.while_loop")
    if capture is None:
        count = run_eagerly(lambda: _read(cond_fn(), "cond_fn()"), body_fn, limit)
        return cupy.asarray(count, dtype=cupy.int64)
    return capture_while(capture, cond_fn, body_fn, limit, CUPY)


def cond(pred: cupy.ndarray, true_fn: Callable[[], Any],
         false_fn: Callable[[], Any] | None = None) -> None:
    """Run ``true_fn()`` if ``pred`` is nonzero, else ``false_fn()``, on the device when captured.

    Parameters
    ----------
    pred : cupy.ndarray
        A 0-d bool or integer device array. In a capture, its value at replay time decides.
    true_fn, false_fn : callable
        Take no argument and update state arrays in place (outputs a branch allocates are
        only written when that branch runs). ``false_fn`` may be omitted.

    Raises
    ------
    CaptureError
        As for :func:`while_loop`.
    OptionsError
        For a non-callable branch.

    .. seealso:: conditional nodes of type ``cudaGraphCondTypeIf`` (with an else body from
       CUDA 12.8; before, a second IF node on the negated condition)
    """
    check_branch_args(true_fn, false_fn)
    _predicate(pred, "pred", None)
    capture = active_capture("cugraphrt.cond")
    if capture is None:
        if _read(pred, "pred"):
            true_fn()
        elif false_fn is not None:
            false_fn()
        return
    capture_cond(capture, _predicate(pred, "pred", capture), true_fn, false_fn, CUPY)


# -- shared with adapters --------------------------------------------------------------------


def check_loop_args(cond_fn, body_fn, max_iters) -> int:
    """Validate while_loop's arguments; returns the iteration limit (int64 max if none)."""
    for name, fn in (("cond_fn", cond_fn), ("body_fn", body_fn)):
        if not callable(fn):
            raise OptionsError(name, fn, "a callable taking no argument")
    if max_iters is None:
        return int(_NO_LIMIT)
    if isinstance(max_iters, bool) or not isinstance(max_iters, (int, np.integer)) \
            or not 0 <= int(max_iters) <= _NO_LIMIT:
        raise OptionsError("max_iters", max_iters, "None or an integer >= 0")
    return int(max_iters)


def check_branch_args(true_fn, false_fn) -> None:
    """Validate cond's branch functions."""
    if not callable(true_fn):
        raise OptionsError("true_fn", true_fn, "a callable taking no argument")
    if false_fn is not None and not callable(false_fn):
        raise OptionsError("false_fn", false_fn, "a callable taking no argument, or None")


def active_capture(what: str) -> _capture.Capture | None:
    """The cugraphrt capture underway on the current stream, None when running eagerly.

    Raises CaptureError for a capture cugraphrt did not begin (its graph has no pool for the
    bodies and no way to add nodes we could roll back).
    """
    capture = _capture.current_capture()
    if capture is None and _capture.is_current_stream_capturing():
        stream = cupy.cuda.get_current_stream().ptr
        raise CaptureError(
            f"{what} inside a capture that cugraphrt did not begin (got stream 0x{stream:x} "
            f"capturing); capture with cugraphrt.graph() (or cugraphrt_torch.graph() for "
            f"torch work), or call it outside the capture to run it eagerly")
    return capture


def run_eagerly(read_cond: Callable[[], bool], body_fn: Callable[[], Any], limit: int) -> int:
    """The eager loop: the condition read on the host before each iteration; returns the
    number of iterations run."""
    count = 0
    while count < limit and read_cond():
        body_fn()
        count += 1
    return count


def capture_while(capture: _capture.Capture, cond_fn, body_fn, limit: int,
                  frontend: Frontend) -> cupy.ndarray:
    """Capture a while loop as a WHILE node; returns its device iteration counter."""
    _conditional.require(f"{frontend.name}.while_loop")
    stream_ptr = cupy.cuda.get_current_stream().ptr
    with _rollback_on_error(capture, frontend, "while_loop"):
        count = cupy.empty((), dtype=cupy.int64)  # from the capture's pool, like every array
        pred = _predicate(cond_fn(), "cond_fn()", capture)
        (handle,) = _conditional.create_handles(stream_ptr, 1)
        _conditional.set_condition((handle, None), pred, count, limit, start=True)
        (body,) = _conditional.add_node(stream_ptr, handle, "while", 1)
        with _body(capture, body, frontend, "while_loop", "while_loop body") as opened:
            body_fn()
            pred = _predicate(cond_fn(), "cond_fn()", capture)
            # A body with collectives can be stopped (see bodies: the watchdog ends it).
            _conditional.set_condition((handle, None), pred, count, limit, start=False,
                                       stoppable=opened.collectives > 0)
    return count


def capture_cond(capture: _capture.Capture, pred: cupy.ndarray, true_fn, false_fn,
                 frontend: Frontend) -> None:
    """Capture a branch as an IF node (with an else body, or a second IF on the negation)."""
    _conditional.require(f"{frontend.name}.cond")
    stream_ptr = cupy.cuda.get_current_stream().ptr
    with _rollback_on_error(capture, frontend, "cond"):
        if false_fn is None or _conditional.if_else_supported():
            (handle,) = _conditional.create_handles(stream_ptr, 1)
            _conditional.set_condition((handle, None), pred, None, 0, start=False)
            bodies = _conditional.add_node(stream_ptr, handle, "if",
                                           1 if false_fn is None else 2)
            for body, fn, label in zip(bodies, (true_fn, false_fn), _COND_LABELS, strict=False):
                with _body(capture, body, frontend, "cond", label):
                    fn()
            return
        # Both handles are set by one kernel, before either branch runs: the true branch
        # may change what pred reads.
        handles = _conditional.create_handles(stream_ptr, 2)
        _conditional.set_condition((handles[0], handles[1]), pred, None, 0, start=False)
        for handle, fn, label in zip(handles, (true_fn, false_fn), _COND_LABELS, strict=True):
            (body,) = _conditional.add_node(stream_ptr, handle, "if", 1)
            with _body(capture, body, frontend, "cond", label):
                fn()


# -- internals -------------------------------------------------------------------------------


def _read(value, what: str) -> bool:
    """The host value of a predicate (eager path): the same checks as in a capture."""
    return bool(_predicate(value, what, None))


def _predicate(value, what: str, capture: _capture.Capture | None) -> cupy.ndarray:
    if not isinstance(value, cupy.ndarray) or value.ndim != 0 or value.dtype.kind not in "biu":
        raise CaptureError(
            f"{what} must be a 0-d bool or integer device array (got {_describe(value)}); "
            f"compute it on the device, e.g. cupy.linalg.norm(r) > tol or (x != 0).any(): a "
            f"host value cannot change between replays")
    if capture is not None and value.device.id != capture.device_id:
        raise CaptureError(
            f"{what} lives on device {value.device.id} (got a capture on device "
            f"{capture.device_id}); compute the predicate on the capture's device")
    return value


def _describe(value) -> str:
    if isinstance(value, cupy.ndarray):
        return f"a cupy array of shape {value.shape} and dtype {value.dtype}"
    shape = getattr(value, "shape", None)
    kind = type(value).__module__.split(".")[0] + "." + type(value).__qualname__
    return f"{kind}" + (f" of shape {tuple(shape)}" if shape is not None else "")


@contextlib.contextmanager
def _body(capture: _capture.Capture, graph, frontend: Frontend, kind: str,
          label: str) -> Iterator[_bodies.Body]:
    """Capture the block into a conditional node's body graph, on a body stream; then take
    out what a collective added that a body cannot hold (see :mod:`.bodies`)."""
    stack = _bodies.open_bodies()
    stream = _conditional.body_stream(capture.device_id, len(stack))
    ptr = stream.ptr
    body_id = _conditional.begin_body(ptr, graph, capture.mode)
    _capture.attach_body(capture, ptr, body_id)
    body = _bodies.Body(capture, ptr, graph, label)
    stack.append(body)
    try:
        with stream, frontend.enter(capture, stream, body_id, kind):
            yield body
        _conditional.end_body(ptr)
        _bodies.finish(body)
    except BaseException:
        if _conditional.abandon_body(ptr):
            capture.keep_graph_on_abort = True
        raise
    finally:
        stack.pop()
        _capture.detach_body(capture, ptr, body_id)


@contextlib.contextmanager
def _rollback_on_error(capture: _capture.Capture, frontend: Frontend,
                       kind: str) -> Iterator[None]:
    """Roll the whole capture back on any exception: its graph holds a half-built node.

    Every body this thread still captures is ended first, innermost first: they capture into
    graphs that belong to the capture being rolled back.
    """
    try:
        yield
    except BaseException as exc:
        error = _body_error(exc, capture, frontend, kind)
        for body in reversed(_bodies.open_bodies()):
            if _conditional.abandon_body(body.stream_ptr):
                capture.keep_graph_on_abort = True
        _capture.abort(capture, error)
        if error is exc:
            raise
        raise error from exc


def _body_error(exc: BaseException, capture, frontend: Frontend, kind: str) -> BaseException:
    if getattr(exc, "_cugraphrt_body", False):
        return exc  # an inner body's error, already explained
    translated = frontend.translate(exc, capture)
    if translated is None:
        return exc
    note = f". Note: {_HOST_ADVICE}" if _cuda.SYNC_HINT in str(translated) else ""
    error = CaptureError(f"in {frontend.name}.{kind}: {translated}{note}")
    error._cugraphrt_body = True  # type: ignore[attr-defined]
    return error
