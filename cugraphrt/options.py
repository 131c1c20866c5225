"""Pydantic models for cugraphrt's options and results.

Options are validated once, where they enter the library (``capture_begin``, ``graph()``,
``make_graphed``), never on replay. A bad value raises :class:`cugraphrt.OptionsError`, which
names the field, the value and the allowed values.
"""

from __future__ import annotations

import typing
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from .errors import OptionsError

__all__ = [
    "CaptureErrorMode",
    "CaptureOptions",
    "MakeGraphedOptions",
    "PoolStats",
    "GeneratorState",
    "validate_options",
]

#: How strictly CUDA polices potentially unsafe API calls while a capture is underway.
CaptureErrorMode = Literal["global", "thread_local", "relaxed"]


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", strict=True)


class CaptureOptions(_Frozen):
    """Options of one capture.

    Attributes
    ----------
    capture_error_mode : {"global", "thread_local", "relaxed"}
        Maps to ``cudaStreamCaptureModeGlobal``, ``...ThreadLocal`` and ``...Relaxed``.
        ``"global"`` (the default, as in PyTorch) makes CUDA reject unsafe calls such as
        ``cudaMalloc`` or a synchronization from *any* thread while the capture runs, so a
        mistake surfaces as an error instead of a graph that silently misses work.
        ``"thread_local"`` polices only the capturing thread, for programs where other
        threads keep allocating and computing eagerly; ``"relaxed"`` polices nothing.
    """

    capture_error_mode: CaptureErrorMode = "global"


class MakeGraphedOptions(_Frozen):
    """Options of :func:`cugraphrt.make_graphed`.

    Attributes
    ----------
    num_warmup_iters : int
        Eager runs on a side stream before capture (compiles kernels, creates library
        handles and FFT plans, fills the allocator's cache). At least 0.
    copy_outputs : bool
        Return fresh copies of the outputs instead of the static output arrays.
    """

    num_warmup_iters: int = Field(default=3, ge=0)
    copy_outputs: bool = False


class PoolStats(_Frozen):
    """A snapshot of one graph memory pool.

    Attributes
    ----------
    pool_id : int
        The pool's identity (``MemPool.id``).
    device_id : int
        The device the pool allocates on.
    reserved_bytes : int
        Bytes the pool holds from the device (all its segments).
    active_bytes : int
        Bytes in blocks that are currently handed out (live arrays, blocks of a capture).
    peak_active_bytes : int
        The largest ``active_bytes`` seen since the pool was created.
    segments : int
        Number of device allocations backing the pool.
    live_graphs : int
        Graphs captured into the pool that have not been reset or destroyed.
    live_arrays : int
        Blocks currently handed out (each backs one array and its views).
    """

    pool_id: int
    device_id: int
    reserved_bytes: int = Field(ge=0)
    active_bytes: int = Field(ge=0)
    peak_active_bytes: int = Field(ge=0)
    segments: int = Field(ge=0)
    live_graphs: int = Field(ge=0)
    live_arrays: int = Field(ge=0)


class GeneratorState(_Frozen):
    """The state of a :class:`cugraphrt.random.Generator`: its seed and counter offset."""

    seed: int = Field(ge=0, lt=2**64)
    offset: int = Field(ge=0, lt=2**64)


_Model = typing.TypeVar("_Model", bound=BaseModel)


def validate_options(model: type[_Model], **values: object) -> _Model:
    """Build ``model`` from ``values``, turning a validation failure into OptionsError.

    Parameters
    ----------
    model : type
        A pydantic model class from this module.
    **values
        Field values.

    Returns
    -------
    The validated model instance.

    Raises
    ------
    OptionsError
        Naming the first offending field, the value given and the allowed values.
    """
    try:
        return model(**values)
    except ValidationError as exc:
        error = exc.errors()[0]
        field = str(error["loc"][0]) if error["loc"] else model.__name__
        value = values.get(field, error.get("input"))
        raise OptionsError(field, value, _allowed(model, field, error)) from exc


def _allowed(model: type[BaseModel], field: str, error: dict) -> str:
    info = model.model_fields.get(field)
    if info is None:
        return f"unknown option; allowed options are {', '.join(sorted(model.model_fields))}"
    choices = typing.get_args(info.annotation)
    if typing.get_origin(info.annotation) is Literal:
        return "allowed values are " + ", ".join(repr(c) for c in choices)
    bounds = [m for m in info.metadata if hasattr(m, "ge") or hasattr(m, "gt")]
    if info.annotation is bool:
        return "allowed values are True and False"
    if info.annotation is int and bounds:
        low = getattr(bounds[0], "ge", None)
        return f"allowed values are integers >= {low}"
    return error.get("msg", "invalid value")
