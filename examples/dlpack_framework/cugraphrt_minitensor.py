"""The minitensor adapter for cugraphrt: a new framework in one page.

Written against the public interface only (``cugraphrt``, ``cugraphrt.adapter``,
``cugraphrt.errors``; ``tests/unit/test_layers.py`` checks it): a :class:`MiniFramework`
implementing :class:`cugraphrt.adapter.Framework`, then ``make_graphed`` and
``make_bucketed`` as configurations of the core's call path and shape buckets. Everything
else (capture, pools, the overwrite order, padding, eviction) is the core's.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Sequence
from operator import attrgetter
from typing import Any

import minitensor as mt

import cugraphrt
from cugraphrt.adapter import (
    CUPY,
    Bucketed,
    CallPath,
    CapturedBucket,
    CopyIn,
    HandOut,
    Mismatch,
    OutputCheck,
    order_for,
)
from cugraphrt.errors import OverwrittenOutputError, ReplayError

__all__ = ["MINI", "MiniFramework", "make_bucketed", "make_graphed"]


class MiniFramework:
    """minitensor's arrays, outputs, streams and capture (see cugraphrt.adapter.Framework)."""

    name = "minitensor"
    array_type = mt.Tensor
    signature = staticmethod(attrgetter("shape", "dtype", "device_index"))
    address = staticmethod(mt.Tensor.data_ptr)
    same_layout = staticmethod(lambda value, static: value.strides == static.strides)
    copy = staticmethod(lambda dst, src: dst.copy_(src))
    fill = staticmethod(lambda rows, value: rows.fill_(value))
    empty = staticmethod(lambda like, shape: mt.empty(shape, like.dtype))
    clone = staticmethod(lambda array: array.clone())
    is_contiguous = staticmethod(lambda array: array.is_contiguous())
    describe = staticmethod(lambda value: repr(value))

    # Outputs: each call hands out a fresh Tensor over the static memory (DLPack, no copy);
    # minitensor cannot mark a tensor, so a replay that would overwrite a live one refuses.
    hand_out = staticmethod(lambda static: _alias(static))

    @staticmethod
    def expire(held: Any, message: str, arguments: Sequence[Any]) -> None:
        if not any(held is value for value in arguments):  # x = f(x) reads it first: fine
            raise OverwrittenOutputError(message)

    @staticmethod
    def message(what: str, fix: str) -> str:
        return f"{what} is still referenced when a replay is about to overwrite it: {fix}"

    # Streams and capture: minitensor's kernels run on CuPy's current stream, so the core's
    # own capture serves it, and CuPy's streams are its streams.
    current_stream = staticmethod(CUPY.current_stream)
    use_stream = staticmethod(CUPY.use_stream)
    capture = staticmethod(lambda cuda_graph, pool=None: cugraphrt.graph(cuda_graph, pool=pool))


def _alias(static: mt.Tensor) -> tuple[mt.Tensor, Any]:
    alias = mt.from_dlpack(static)
    return alias, weakref.ref(alias)


MINI = MiniFramework()


def _capture(fn: Callable, args: tuple, pool: Any, warmup: int) -> tuple[Any, Any, int]:
    for _ in range(warmup):  # kernels are compiled and loaded before the capture
        fn(*args)
    cuda_graph = cugraphrt.Graph()
    with MINI.capture(cuda_graph, pool):
        outputs = fn(*args)
    return cuda_graph, outputs, order_for(cuda_graph.pool()).next_seq()


def make_graphed(fn: Callable, sample_args: tuple, *, warmup: int = 2, pool: Any = None,
                 check_outputs: bool = False) -> Callable:
    """``fn(*sample_args)`` captured once; each call copies its tensors in and replays."""
    cuda_graph, outputs, seq = _capture(fn, sample_args, pool, warmup)
    order = order_for(cuda_graph.pool())
    check = OutputCheck(f"minitensor {fn.__name__}", "drop it first", order, MINI) \
        if check_outputs else None
    path = CallPath(CopyIn(MINI, sample_args, [f"args[{i}]" for i in range(len(sample_args))]),
                    order, seq, cuda_graph.replay,
                    HandOut(outputs, MINI, copy=False, check=check, seq=seq))

    def graphed(*args: mt.Tensor) -> Any:
        try:
            return path(args)
        except Mismatch as exc:
            raise ReplayError(f"argument {exc.path} does not match the capture (expected "
                              f"{exc.static!r}, got {exc.value!r})") from None

    graphed.graph = cuda_graph  # type: ignore[attr-defined]
    return graphed


def make_bucketed(fn: Callable, sample_args: tuple, buckets: Any, *, dynamic_dim: Any = 0,
                  warmup: int = 2, pool: Any = None) -> Bucketed:
    """One graph per size of a dynamic dimension (``dynamic_dim``: per argument, or one for
    all), the core's shape buckets on minitensor."""
    def capture(args: tuple, bucket_pool: Any, warm: bool) -> CapturedBucket:
        # warm: the core asks for warm-ups on the family's first capture only (and to retry
        # a later one that failed); a two-argument capture(args, pool) warms up every time.
        cuda_graph, outputs, seq = _capture(fn, args, bucket_pool, warmup if warm else 0)
        return CapturedBucket(cuda_graph.replay, outputs, cuda_graph.reset, seq)

    return Bucketed(ops=MINI, sample_args=sample_args, buckets=buckets,
                    dynamic_dim=dynamic_dim, pad=0, memory_budget=None, strict=False, pool=pool,
                    copy_outputs=False, capture=capture, eager=fn, name=fn.__name__)
