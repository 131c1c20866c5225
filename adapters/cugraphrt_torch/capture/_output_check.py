"""Reading an overwritten output raises: the torch side of the overwritten-output check.

Each call of a checked graphed callable returns, per static output, a fresh tensor with a
storage of its own over the same memory (no copy), and keeps a weak reference to that
storage. Before a replay that can overwrite it, a storage still alive (the returned tensor,
a view of it, something autograd saved) is marked with torch's storage-access error, the
mechanism torch's CUDA graph trees use: any later read of it raises a ``RuntimeError`` that
names the call that produced it and the fix. Storages nobody holds any more cost nothing.

The marker is a private torch entry point of CUDA builds, looked up once:

* ``torch._C._set_storage_data_ptr_access_error_msg`` (a storage): every tensor over this
  call's storage raises, views included. Used when present, and when weak references to
  storages follow the storage's life on this build (checked once, on a CPU tensor);
* else ``torch._C._set_storage_access_error_msg`` (one tensor): the returned tensor raises,
  views taken of it do not;
* else (CPU builds) the check is unavailable and calls return the static outputs as before.

Why DLPack for the fresh storage: measured on the CPU (torch 2.13, a 64x128 float tensor, per
alias), ``torch._C._from_dlpack(torch._C._to_dlpack(t))`` takes 0.5 us, ``torch.from_dlpack``
4.0 us (its stream handshake in Python), and ``torch._C._construct_storage_from_data_pointer``
plus ``Tensor.set_`` 2.2 us; ``t.detach()`` 0.3 us but shares ``t``'s storage, which must not
be marked. The DLPack storage also keeps the static output alive (its deleter holds it), so
an alias outliving its graphed callable never reads freed memory.
"""

from __future__ import annotations

import weakref
from collections.abc import Sequence
from typing import Any

import torch

from cugraphrt.adapter import OutputCheck, OverwriteOrder, resolve_check_outputs

from .._internals import tensors as _tensors

__all__ = ["FIX_CLONE", "FIX_COMPILE", "FIX_COPY", "available", "checkable", "make_check",
           "TorchOutputs"]

#: What to do instead, per front end (the end of the message a stale read raises).
FIX_CLONE = ".clone() an output you keep before calling again"
FIX_COPY = FIX_CLONE + ", or pass copy_outputs=True"
FIX_COMPILE = FIX_CLONE + ", or keep the backend's copy_outputs option on (its default)"

_to_dlpack, _from_dlpack = _tensors.dlpack_pair()
# Module globals, read when a check is made and when an output is expired: the CPU tests
# replace them with recording fakes.
_mark_storage, _mark_tensor = _tensors.access_marks()
_ref = weakref.ref


def _storage_refs_follow_storages() -> bool:
    """Whether a weak reference to a tensor's storage object lives exactly as long as the
    storage (torch keeps a storage's Python object while C++ holds the storage)."""
    try:
        base = torch.ones(4)
        alias = _from_dlpack(_to_dlpack(base))
        ref = _ref(alias.untyped_storage())
        view = alias[1:]
        del alias
        alive_through_view = ref() is not None
        del view
        return alive_through_view and ref() is None
    except Exception:  # noqa: BLE001 - any failure means: do not rely on it
        return False


_BY_STORAGE = _storage_refs_follow_storages()


def available() -> str | None:
    """How outputs are marked on this torch build: ``"storage"``, ``"tensor"`` or None."""
    if _mark_storage is not None and _BY_STORAGE:
        return "storage"
    if _mark_tensor is not None:
        return "tensor"
    return None


class TorchOutputs:
    """:class:`cugraphrt.adapter.OutputOps` for torch tensors."""

    array_type = torch.Tensor

    def __init__(self, by_storage: bool) -> None:
        self.by_storage = by_storage

    def hand_out(self, static: torch.Tensor) -> tuple[torch.Tensor, Any]:
        alias = _from_dlpack(_to_dlpack(static))
        return alias, _ref(alias.untyped_storage()) if self.by_storage else _ref(alias)

    def expire(self, held: Any, message: str, arguments: Sequence[Any]) -> None:
        if self.by_storage:
            _mark_storage(_tensors.storage_key(held), message)  # held: the storage object
        else:
            _mark_tensor(held, message)  # held: the returned tensor

    @staticmethod
    def message(what: str, fix: str) -> str:
        return (f"cugraphrt: this tensor is {what}, and a later replay has overwritten its "
                f"memory (got an access after that replay); a graphed callable returns its "
                f"static outputs, valid until its next call: {fix}")


def checkable(tensor: Any) -> bool:
    """Whether ``tensor`` can be handed out as a fresh alias (a plain strided tensor DLPack
    exports exactly: not a subclass, not lazily conjugated or negated)."""
    if type(tensor) not in (torch.Tensor, torch.nn.Parameter):
        return False
    if tensor.layout is not torch.strided or tensor.is_conj() or tensor.is_neg():
        return False
    try:
        alias = _from_dlpack(_to_dlpack(tensor))  # as calls will (gradients do not travel)
    except Exception:  # noqa: BLE001 - whatever DLPack refuses is handed out as before
        return False
    return (alias.data_ptr() == tensor.data_ptr() and alias.shape == tensor.shape
            and alias.stride() == tensor.stride() and alias.dtype == tensor.dtype
            and alias.device == tensor.device)


def make_check(check_outputs: bool | None, label: str, fix: str,
               order: OverwriteOrder) -> OutputCheck | None:
    """The check of one graphed callable, or None when it is off or unavailable.

    Parameters
    ----------
    check_outputs : bool or None
        As the user passed it; None reads ``CUGRAPHRT_CHECK_OUTPUTS`` (default on).
    label, fix : str
        For messages (see :class:`cugraphrt.adapter.OutputCheck`).
    order : OverwriteOrder
        The order of the pool the callable's graphs are captured into.
    """
    if not resolve_check_outputs(check_outputs):
        return None
    how = available()
    if how is None:
        return None
    return OutputCheck(label, fix, order, TorchOutputs(by_storage=how == "storage"))
