"""cuFFT plans created during a capture belong to that capture's graph.

CuPy creates a cuFFT plan on the first transform of each shape and keeps it in a per-thread
cache (``cupy.fft.config.get_plan_cache()``). A plan created inside a capture gets its work
area from the capture's allocator, so from the graph's pool, and the graph's FFT kernels read
and write that work area on every replay. Were it left in CuPy's cache, eager FFTs of the same
shape would run in the graph's work area, and the cache could evict and destroy the plan while
the graph still replays into it. So a plan created during a capture is

* created with the thread's capture mode relaxed: ``cufftMakePlan*`` allocates and uploads its
  own tables, calls a global-mode capture refuses, and nothing of it touches the capture
  stream;
* taken out of CuPy's cache when the capture ends (CuPy inserts it right after creating it;
  until the end, another transform of the same shape in the capture reuses it: same graph);
* kept alive by the graph and destroyed with it, returning its work area to the pool; after a
  failed capture, destroyed once no capture is underway.

The eager plans the cache holds while the capture creates plans are kept alive until the
capture ends, so that an eviction to make room destroys none of them (freeing device memory)
during the capture. Multi-GPU plans stay refused. Only CuPy's public cache interface is used:
iteration over ``(key, node)`` pairs, ``node.plan`` and ``del cache[key]``.
"""

from __future__ import annotations

import weakref
from typing import Any

from cugraphrt._capture import diagnose as _diagnose
from cugraphrt._capture.stream_capture import Capture
from cugraphrt._cuda import runtime as _cuda
from cugraphrt._cuda.status_errors import LibraryCaptureError, also_library_error
from cugraphrt._memory.backing import capture_activity

__all__ = ["create_in_capture"]


class _Owned:
    """The plans a capture created, the caches they went into, and eager plans held meanwhile."""

    __slots__ = ("plans", "caches", "held")

    def __init__(self) -> None:
        self.plans: list[Any] = []
        self.caches: list[Any] = []
        self.held: list[Any] = []


_owned: weakref.WeakKeyDictionary[Capture, _Owned] = weakref.WeakKeyDictionary()


def create_in_capture(plan_class: type, args: tuple, kwargs: dict, capture: Capture) -> Any:
    """Create a cuFFT plan inside ``capture``, owned by the graph the capture makes.

    Parameters
    ----------
    plan_class : type
        ``cupy.cuda.cufft.Plan1d`` or ``PlanNd``.
    args, kwargs
        The constructor's arguments, as CuPy passes them.
    capture : cugraphrt._capture.stream_capture.Capture
        The capture underway on the current stream.

    Raises
    ------
    LibraryCaptureError
        For a multi-GPU plan (``devices=``), whose work areas span several devices' pools.
    """
    if kwargs.get("devices"):
        raise LibraryCaptureError(
            f"a multi-GPU cuFFT plan ({plan_class.__name__}) would be created during capture "
            f"(got devices={kwargs['devices']!r}); its work areas would span several devices' "
            f"pools. Run the same FFT once before capturing (warm-up) so the plan is cached"
        )
    owned = _owned.get(capture)
    if owned is None:
        owned = _owned[capture] = _Owned()
        capture.finish_hooks.append(_finish)
    cache = _current_cache()
    if cache is not None:
        if all(known is not cache for known in owned.caches):
            owned.caches.append(cache)
        owned.held.extend(node.plan for _, node in cache)
    with _cuda.relaxed_capture_mode():
        try:
            plan = plan_class(*args, **kwargs)
        except Exception as exc:
            if type(exc).__name__ != "CuFFTError":
                raise
            raise also_library_error(exc, _plan_failed(plan_class, args, exc)) from exc
    owned.plans.append(plan)
    return plan


def _plan_failed(plan_class: type, args: tuple, exc: BaseException) -> str:
    # Measured (H100, CUDA 13, CuPy 14.2): plans for lengths with a large prime factor
    # (1999, 3001, 4099, 12289) fail with CUFFT_INTERNAL_ERROR while any capture is underway,
    # in every capture mode and even from a thread that is not capturing; CuPy's own
    # begin_capture() fails the same way. Lengths such as 100, 1024, 2997 or 3000 work.
    shape = args[0] if args else "?"
    where = _diagnose.where_called_from() or "an FFT"
    return (f"{where} needs a new cuFFT plan ({plan_class.__name__}, shape {shape}), which "
            f"cuFFT could not create while a capture is underway (got {type(exc).__name__}: "
            f"{exc}); cuFFT fails so for some lengths, those with a large prime factor among "
            f"them, in CuPy's own captures too. Run the same FFT once before capturing "
            f"(warm-up), so that its plan is cached and the capture only records it")


def _current_cache():
    """This thread's cuFFT plan cache of the current device, or None without cupy.fft."""
    try:
        from cupy.fft.config import get_plan_cache
    except ImportError:  # pragma: no cover - part of every CuPy with cuFFT
        return None
    return get_plan_cache()


def _finish(capture: Capture) -> None:
    """Capture finish hook: out of the caches, into the graph (or released); never raises."""
    owned = _owned.pop(capture, None)
    if owned is None:
        return
    for cache in owned.caches:
        forget(cache, owned.plans)
    if capture.aborted_by is None:
        capture.keepalive.extend(owned.plans)  # moved to the graph by Graph._end
    # The capture that is ending still counts as underway here: destructors run after it.
    capture_activity.defer_or_run(_Release(owned))


def forget(cache, plans: list) -> None:
    """Remove ``plans`` from a CuPy plan cache (``del cache[key]`` for each); never raises."""
    wanted = {id(plan) for plan in plans}
    try:
        keys = [key for key, node in cache if id(node.plan) in wanted]
        for key in keys:
            del cache[key]
    except Exception:  # noqa: BLE001 - a cache cleared meanwhile: nothing left to remove
        pass


class _Release:
    """Drop the capture's references to plans (a callable for ``defer_or_run``)."""

    __slots__ = ("owned",)

    def __init__(self, owned: _Owned) -> None:
        self.owned = owned

    def __call__(self) -> None:
        owned, self.owned = self.owned, _Owned()
        owned.plans.clear()
        owned.held.clear()
        owned.caches.clear()
