"""Pydantic models for cugraphrt's options and results.

Options are validated once, where they enter the library (``capture_begin``, ``graph()``,
``make_graphed``), never on replay. A bad value raises :class:`cugraphrt.OptionsError`, which
names the field, the value and the allowed values.
"""

from __future__ import annotations

import typing
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from cugraphrt.errors import OptionsError

__all__ = [
    "CaptureErrorMode",
    "CaptureOptions",
    "MakeGraphedOptions",
    "PoolStats",
    "DeviceStats",
    "GeneratorState",
    "BucketStat",
    "BucketStats",
    "validate_options",
]

#: How strictly CUDA polices potentially unsafe API calls while a capture is underway.
CaptureErrorMode = Literal["global", "thread_local", "relaxed"]


class Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", strict=True)


class CaptureOptions(Frozen):
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


class MakeGraphedOptions(Frozen):
    """Options of :func:`cugraphrt.make_graphed`.

    Attributes
    ----------
    num_warmup_iters : int
        Eager runs on a side stream before capture (compiles kernels, creates library
        handles and FFT plans, fills the allocator's cache). At least 0.
    copy_outputs : bool
        Return fresh copies of the outputs instead of the static output arrays.
    check_outputs : bool or None
        Without ``copy_outputs``: catch an output read (torch) or still referenced (CuPy)
        after a later replay overwrote it (docs/reliability.md, "Reading an overwritten
        output"). None: the front end's default, on for ``cugraphrt_torch`` unless
        ``CUGRAPHRT_CHECK_OUTPUTS=0``, off for :func:`cugraphrt.make_graphed`.
    """

    num_warmup_iters: int = Field(default=3, ge=0)
    copy_outputs: bool = False
    check_outputs: bool | None = None


class PoolStats(Frozen):
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


class DeviceStats(Frozen):
    """The graph memory pools of one device, summed (see :func:`cugraphrt.device_stats`).

    Attributes
    ----------
    device_id : int
        The device.
    pools : int
        Live pools allocating on it.
    reserved_bytes, active_bytes : int
        Sums of the pools' ``reserved_bytes`` and ``active_bytes``.
    segments, live_graphs, live_arrays : int
        Sums of the pools' counts.
    """

    device_id: int = Field(ge=0)
    pools: int = Field(ge=0)
    reserved_bytes: int = Field(ge=0)
    active_bytes: int = Field(ge=0)
    segments: int = Field(ge=0)
    live_graphs: int = Field(ge=0)
    live_arrays: int = Field(ge=0)


class GeneratorState(Frozen):
    """The state of a :class:`cugraphrt.random.Generator`: its seed and counter offset."""

    seed: int = Field(ge=0, lt=2**64)
    offset: int = Field(ge=0, lt=2**64)


class BucketStat(Frozen):
    """The counters of one shape bucket of a bucketed callable.

    Attributes
    ----------
    size : int
        The bucket: calls of size up to it (and above the next smaller bucket) replay its graph.
    captured : bool
        Whether the bucket's graph is captured now (False before first use or after eviction).
    calls : int
        Calls served by the bucket's graph.
    captures : int
        Times the bucket was captured (more than 1 after evictions).
    evictions : int
        Times its graph was released to honour ``memory_budget`` (or by ``release()``).
    padded_rows : int
        Rows of padding replayed in all: the sum of ``size - n`` over its calls.
    capture_seconds : float
        Wall time spent capturing it (warm-up included), all captures together.
    reserved_growth_bytes : int
        How much the shared pool's reserved bytes grew during its last capture: the bucket's
        *private* bytes, memory no bucket captured before it had reserved.
    shared_bytes : int
        The pool's reserved bytes its last capture found already there, which it could reuse:
        memory it shares with the buckets captured before it.
    exec_bytes : int or None
        Device memory its executable took, measured with ``cudaMemGetInfo`` around the
        instantiation (the driver allocates in pages: 0 or a multiple of 2 MiB); None before
        the first capture.
    warm_retries : int
        Captures of it without warm-ups that failed and were warmed up and captured again
        (only a family's first capture runs warm-ups: docs/shapes.md).
    """

    size: int = Field(ge=1)
    captured: bool
    calls: int = Field(ge=0)
    captures: int = Field(ge=0)
    evictions: int = Field(ge=0)
    padded_rows: int = Field(ge=0)
    capture_seconds: float = Field(ge=0)
    reserved_growth_bytes: int = Field(ge=0)
    shared_bytes: int = Field(default=0, ge=0)
    exec_bytes: int | None = Field(default=None, ge=0)
    warm_retries: int = Field(default=0, ge=0)


class BucketStats(Frozen):
    """A snapshot of a bucketed callable: per-bucket counters, fallbacks and the pool.

    Attributes
    ----------
    buckets : tuple of BucketStat
        One entry per bucket, smallest first.
    eager_calls : int
        Calls that ran eagerly because no bucket could serve them.
    fallbacks : dict of str to int
        Eager calls by reason: ``above`` (size above the largest bucket), ``empty``, ``dtype``,
        ``shape`` (a non-dynamic dimension changed), ``sizes`` (dynamic arguments disagree),
        ``type``, ``structure``, ``static``, ``constant``, ``budget``.
    memory_budget : int or None
        The budget the pool's reserved bytes are held under.
    pool : PoolStats
        The one pool all buckets share.
    predicted_reserved_bytes : int or None
        What :meth:`~cugraphrt.BucketedFunction.predict_reserved_bytes` said the family
        would reserve (None if it was not called); compare with ``pool.reserved_bytes``.
    shares_outputs : bool
        Whether the buckets' outputs share memory (a family with a pool of its own: outputs
        live in memory the next capture may reuse, valid until the next call of any bucket);
        False when the pool was given, or the framework cannot alias its arrays.
    exec_bytes : int
        Device memory the captured buckets' executables took, all together.
    """

    buckets: tuple[BucketStat, ...]
    eager_calls: int = Field(ge=0)
    fallbacks: dict[str, int]
    memory_budget: int | None
    pool: PoolStats
    predicted_reserved_bytes: int | None = None
    shares_outputs: bool = False
    exec_bytes: int = Field(default=0, ge=0)

    def __str__(self) -> str:
        from cugraphrt.errors import _fmt_bytes

        header = ("bucket", "captured", "calls", "captures", "evictions", "padded rows",
                  "capture ms", "private", "shared", "executable")
        rows = [header] + [(
            str(b.size), "yes" if b.captured else "no", str(b.calls), str(b.captures),
            str(b.evictions), str(b.padded_rows), f"{b.capture_seconds * 1e3:.1f}",
            _fmt_bytes(b.reserved_growth_bytes), _fmt_bytes(b.shared_bytes),
            "-" if b.exec_bytes is None else _fmt_bytes(b.exec_bytes)) for b in self.buckets]
        widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
        lines = ["  ".join(c.rjust(w) for c, w in zip(r, widths, strict=True)) for r in rows]
        reasons = ", ".join(f"{k} {v}" for k, v in sorted(self.fallbacks.items())) or "none"
        budget = "none" if self.memory_budget is None else _fmt_bytes(self.memory_budget)
        lines.append(f"eager calls: {self.eager_calls} ({reasons})")
        lines.append(f"pool {self.pool.pool_id}: reserved {_fmt_bytes(self.pool.reserved_bytes)}"
                     f", active {_fmt_bytes(self.pool.active_bytes)}, "
                     f"{self.pool.live_graphs} graphs, budget {budget}")
        predicted = ("not asked" if self.predicted_reserved_bytes is None
                     else _fmt_bytes(self.predicted_reserved_bytes))
        lines.append(f"predicted reservation {predicted}; executables "
                     f"{_fmt_bytes(self.exec_bytes)}; outputs "
                     f"{'shared' if self.shares_outputs else 'per bucket'}")
        return "\n".join(lines)


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
    # Every build validates its options: a frozen model of plain values (numbers, strings,
    # None: nothing it would keep alive) is kept, keyed by each value's type too (strict
    # models tell True from 1), and handed out again.
    key: tuple | None = None
    if model.model_config.get("frozen") and all(
            type(v) in _PLAIN for v in values.values()):
        key = (model, tuple((name, type(v), v) for name, v in values.items()))
        known = _validated.get(key)
        if known is not None:
            return typing.cast(_Model, known)
    try:
        validated = model(**values)
    except ValidationError as exc:
        error = exc.errors()[0]
        field = str(error["loc"][0]) if error["loc"] else model.__name__
        value = values.get(field, error.get("input"))
        raise OptionsError(field, value, _allowed(model, field, error)) from exc
    if key is not None:
        if len(_validated) >= _VALIDATED_LIMIT:
            _validated.clear()
        _validated[key] = validated
    return validated


#: (model, ((field, type, value), ...)) -> the frozen model validated from them.
_validated: dict[tuple, BaseModel] = {}
_VALIDATED_LIMIT = 256
_PLAIN = frozenset({bool, int, float, str, type(None)})


def _allowed(model: type[BaseModel], field: str, error: typing.Mapping[str, typing.Any]) -> str:
    info = model.model_fields.get(field)
    if info is None:
        return f"unknown option; allowed options are {', '.join(sorted(model.model_fields))}"
    choices = typing.get_args(info.annotation)
    if typing.get_origin(info.annotation) is Literal:
        return "allowed values are " + ", ".join(repr(c) for c in choices)
    bounds = [m for m in info.metadata if hasattr(m, "ge") or hasattr(m, "gt")]
    if info.annotation is bool:
        return "allowed values are True and False"
    if info.annotation == bool | None:
        return "allowed values are True, False and None (the default)"
    if bool in choices and all(c is bool or typing.get_origin(c) is Literal for c in choices):
        # A switch with named settings besides: bool | Literal["exact"].
        words = [repr(w) for c in choices if c is not bool for w in typing.get_args(c)]
        return "allowed values are True, False and " + ", ".join(words)
    if info.annotation is int and bounds:
        low = getattr(bounds[0], "ge", None)
        return f"allowed values are integers >= {low}"
    return error.get("msg", "invalid value")
