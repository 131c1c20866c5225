"""CuPy's implementation of :class:`cugraphrt.adapter.Framework`.

The core's own front end (:func:`cugraphrt.make_graphed`, its shape buckets) runs on it, as
``cugraphrt_torch`` runs on its torch implementation.
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from operator import attrgetter
from typing import Any

import cupy

from cugraphrt._callables.checked_views import CupyViews
from cugraphrt._callables.rebind_plan import byte_extent
from cugraphrt._capture.graph_context import graph

__all__ = ["CUPY", "CupyFramework"]

_ndarray = cupy.ndarray
_copyto = cupy.copyto
_current_stream = cupy.cuda.get_current_stream
#: Unsigned integers of each element size: copy_changed compares elements bit for bit.
_BITS = {1: cupy.uint8, 2: cupy.uint16, 4: cupy.uint32, 8: cupy.uint64}
_changed: list[Any] = []  # the kernel, compiled on first use


def _write_changed() -> Any:
    if not _changed:
        _changed.append(cupy.ElementwiseKernel("T src", "T dst", "if (dst != src) dst = src;",
                                               "cugraphrt_copy_changed"))
    return _changed[0]


class CupyFramework(CupyViews):
    """CuPy arrays, CuPy's current stream, the core's own capture (:func:`cugraphrt.graph`).

    The overwritten-output operations are :class:`~cugraphrt._callables.checked_views.
    CupyViews`'.
    """

    name = "cupy"
    array_type = _ndarray

    # C-level lookups: no Python frame per argument on the call path. A NumPy array has
    # no ``data.device_id`` (AttributeError): it never matches.
    signature = staticmethod(attrgetter("shape", "dtype", "data.device_id"))
    address = staticmethod(attrgetter("data.ptr"))
    strides = staticmethod(attrgetter("strides"))  # what rebinding compares besides signature

    @staticmethod
    def extent(array: cupy.ndarray) -> tuple[int, int]:
        return byte_extent(array.data.ptr, array.shape, array.strides, array.itemsize)

    @staticmethod
    def same_layout(value: cupy.ndarray, static: cupy.ndarray) -> bool:
        return bool(value.strides == static.strides)

    @staticmethod
    def copy(dst: cupy.ndarray, src: cupy.ndarray) -> None:
        if dst._c_contiguous and src._c_contiguous:
            dst.data.copy_from_device_async(src.data, src.nbytes)  # one memcpy, no kernel
        else:
            _copyto(dst, src)

    @staticmethod
    def copy_changed(dst: cupy.ndarray, src: cupy.ndarray) -> None:
        """Write into ``dst`` the elements of ``src`` that differ from it, bit for bit, and no
        other: what an ``inputs="rebind"`` graph copied in and wrote goes back to the
        caller's array, and an input it only read costs a read (docs/rebinding.md)."""
        bits = _BITS.get(dst.dtype.itemsize)
        if bits is None or dst.dtype != src.dtype:
            _copyto(dst, src)  # complex128 and the like: a whole copy writes equal values
            return
        _write_changed()(src.view(bits), dst.view(bits))

    @staticmethod
    def fill(rows: cupy.ndarray, value: float) -> None:
        if value == 0 and rows._c_contiguous:
            rows.data.memset_async(0, rows.nbytes)  # no kernel launch
        else:
            rows.fill(value)

    @staticmethod
    def empty(like: cupy.ndarray, shape: tuple[int, ...]) -> cupy.ndarray:
        return cupy.empty(shape, dtype=like.dtype)

    @staticmethod
    def clone(array: cupy.ndarray) -> cupy.ndarray:
        return array.copy()

    @staticmethod
    def unowned(array: cupy.ndarray, keep: Any) -> cupy.ndarray:
        """For shape buckets: an alias of a captured output in ``keep`` (the capture's
        MemPool) that lets its block go back to the pool for the next capture, while a hold
        keeps the block's segment on the device as long as the alias lives. An array whose
        memory is not the pool's comes back as it is (nothing to share)."""
        memory = array.data.mem
        pool = getattr(memory, "pool", None)  # set on the pool's own leases
        if array.size == 0 or pool is None or pool is not keep:
            return array
        low, high = byte_extent(array.data.ptr, array.shape, array.strides, array.itemsize)
        alias = cupy.cuda.UnownedMemory(low, high - low, pool._hold(memory),
                                        array.data.device_id)
        return _ndarray(array.shape, array.dtype,
                        cupy.cuda.MemoryPointer(alias, array.data.ptr - low), array.strides)

    @staticmethod
    def is_contiguous(array: cupy.ndarray) -> bool:
        return bool(array._c_contiguous)

    @staticmethod
    def describe(value: Any) -> str:
        if isinstance(value, _ndarray):
            return f"shape {value.shape} {value.dtype} on device {value.data.device_id}"
        if hasattr(value, "shape") and hasattr(value, "dtype"):
            return f"{type(value).__module__}.{type(value).__name__} of shape {value.shape}"
        return f"{type(value).__name__} {value!r}"

    @staticmethod
    def current_stream(device: int) -> int:
        return int(_current_stream(device).ptr)

    @staticmethod
    def use_stream(ptr: int, device: int) -> AbstractContextManager[Any]:
        return cupy.cuda.ExternalStream(ptr, device)

    @staticmethod
    def capture(cuda_graph: Any, pool: Any = None) -> AbstractContextManager[Any]:
        return graph(cuda_graph, pool=pool)


#: The one instance.
CUPY = CupyFramework()
