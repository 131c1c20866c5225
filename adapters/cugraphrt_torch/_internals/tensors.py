"""torch's tensor and storage internals. Tested on torch 2.11 (CUDA) and 2.11 to 2.14
(CPU)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

__all__ = ["versions", "moved", "storage_key", "storage_use_count", "dlpack_pair", "access_marks",
           "data_ptrs_equal", "foreach_copy", "foreach_zero"]


def versions(tensors: Sequence[torch.Tensor]) -> list[int]:
    """Each tensor's version counter (``Tensor._version``: torch bumps it at every in-place
    write, through any view; the same since torch 1.x)."""
    return [t._version for t in tensors]


def moved(tensors: Sequence[torch.Tensor], before: list[int]) -> list[bool]:
    """Per tensor, whether something wrote it in place since ``before`` (:func:`versions`):
    a capture's torch ops do so as they record, though nothing runs."""
    return [t._version != v for t, v in zip(tensors, before, strict=True)]


def storage_key(storage: Any) -> int:
    """The address of a storage's C object (``UntypedStorage._cdata``): one key per storage
    whatever the tensor or view over it, what :func:`storage_use_count` and the access marks
    take."""
    return storage._cdata


def storage_use_count() -> Callable[[int], int] | None:
    """``torch._C._storage_Use_Count(storage._cdata)``, the references to a storage's C
    object (torch 2.1 on), or None where missing."""
    return getattr(torch._C, "_storage_Use_Count", None)


def dlpack_pair() -> tuple[Callable[[torch.Tensor], Any], Callable[[Any], torch.Tensor]]:
    """(to, from) DLPack capsule functions without the stream handshake:
    ``torch._C._to_dlpack`` / ``_from_dlpack`` (0.5 us a round trip on an H100 with torch
    2.11), else the public ``torch.utils.dlpack`` ones (4 us)."""
    to = getattr(torch._C, "_to_dlpack", None) or torch.utils.dlpack.to_dlpack
    back = getattr(torch._C, "_from_dlpack", None) or torch.utils.dlpack.from_dlpack
    return to, back


def access_marks() -> tuple[Any, Any]:
    """(by storage, by tensor): torch's hooks that make a later access of a storage raise a
    message of the caller's, ``torch._C._set_storage_data_ptr_access_error_msg`` (torch
    2.5 on) and ``_set_storage_access_error_msg`` (2.3 on); None for a missing one."""
    return (getattr(torch._C, "_set_storage_data_ptr_access_error_msg", None),
            getattr(torch._C, "_set_storage_access_error_msg", None))


def data_ptrs_equal(fallback: Callable[..., bool]) -> Callable[..., bool]:
    """``torch._C._tensors_data_ptrs_at_indices_equal(tensors, ptrs, indices)`` (what
    torch.compile's graph trees check static inputs with; torch 2.2 on), else ``fallback``
    with the same signature."""
    return getattr(torch._C, "_tensors_data_ptrs_at_indices_equal", fallback)


#: ``torch._foreach_copy_(dst, src)``: one launch for many copies (torch 2.1 on). The
#: function itself, not a wrapper: it runs on replay paths.
foreach_copy: Callable[..., Any] = torch._foreach_copy_
#: ``torch._foreach_zero_(tensors)`` (torch 1.x on).
foreach_zero: Callable[..., Any] = torch._foreach_zero_
