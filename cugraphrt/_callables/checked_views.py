"""CuPy's side of the overwritten-output check: ``make_graphed(..., check_outputs=True)``.

Torch can mark a storage so that reading it raises; CuPy has no such hook, and no public way
to move an existing array to other memory. What public API does allow: each call returns
fresh arrays over the static outputs, each backed by a memory object of its own
(:class:`cupy.cuda.UnownedMemory` that owns nothing but keeps the static output alive).
Every view of such an array holds that memory object, so a weak reference to it says whether
anything over one call's outputs is still referenced. Before a replay that can overwrite
them, a live one raises :class:`cugraphrt.OverwrittenOutputError` naming the output and the
call, unless it is an argument of the call being made (``x = f(x)``: its value is copied in
before the replay). The check is on the *reference*, not the read: an output still held but
never read again raises too, hence opt-in (see docs/reliability.md).
"""

from __future__ import annotations

import weakref
from collections.abc import Sequence
from typing import Any

import cupy

from cugraphrt.errors import OverwrittenOutputError

__all__ = ["FIX", "CupyViews"]

_MemoryPointer = cupy.cuda.MemoryPointer
_ndarray = cupy.ndarray
_ref = weakref.ref


class _CallMemory(cupy.cuda.UnownedMemory):
    """The memory of one call's output: like its base, but weakly referenceable."""

    __slots__ = ("__weakref__",)


class CupyViews:
    """:class:`cugraphrt._memory.overwrites.OutputOps` for CuPy arrays."""

    array_type = _ndarray

    @staticmethod
    def hand_out(static: cupy.ndarray) -> tuple[cupy.ndarray, Any]:
        data = static.data
        # The device is given: UnownedMemory would otherwise ask the driver for it.
        memory = _CallMemory(data.ptr, static.nbytes, static, data.device_id)
        alias = _ndarray(static.shape, static.dtype, _MemoryPointer(memory, 0), static.strides)
        return alias, _ref(memory)

    @staticmethod
    def expire(held: Any, message: str, arguments: Sequence[Any]) -> None:
        for value in arguments:
            if isinstance(value, _ndarray) and value.data.mem is held:
                return  # copied in before the replay: reading it now is fine
        raise OverwrittenOutputError(message)

    @staticmethod
    def message(what: str, fix: str) -> str:
        return (f"{what} is still referenced when a replay is about to overwrite it (got a "
                f"live array or view over its memory); CuPy cannot intercept reads, so "
                f"check_outputs=True refuses the replay: {fix}")


#: What to do instead (the end of the message).
FIX = ("drop outputs you are done with before calling again (del), .copy() the ones you keep, "
       "or pass copy_outputs=True")
