"""Host constants staged by a capture (``cugraphrt_torch.graph(..., stage_host_constants=True)``,
and ``graph_module``'s second try when its capture copies host data to the device).

A forward often makes a small constant on the host and copies it to the device on every call:
``torch.tensor(0.0, device=x.device)`` (Bloom's and gpt-oss's masks), ``torch.as_tensor(
self.image_mean, device=...)`` (torchvision's detection transform), a grid built with host
operations and moved with ``.to(device)`` (RAFT), an index list (``qkv[..., [-2], :]``,
Falcon). Capture refuses each: a copy from pageable host memory is not capturable. Under this
mode, such a constant is made on the host as eager makes it, copied once into pinned memory
the graph keeps (:func:`cugraphrt.adapter.pinned_constant`), and copied to the device from
there by a captured memcpy: every replay copies the same bytes, as every eager call would.

What is a constant, and what is not:

* staged (read once, at capture): Python values and lists given to ``torch.tensor``,
  ``torch.as_tensor`` or ``torch.asarray`` with a CUDA device, NumPy arrays given to them (a
  UserWarning says once per capture that later changes are not seen), index lists and tuples
  of Python ints or bools, and CPU tensors made inside the captured code (by any torch
  function) then moved or copied to the device;
* read at every replay: a pinned CPU tensor made before the capture (its copy is captured
  from its own memory, as ``torch.cuda.graph`` does);
* refused: a pageable CPU tensor made before the capture and copied to the device inside it.
  Its values may change between calls, and the graph would replay the capture's; the error
  names it and says to pin it or keep it on the device.
"""

from __future__ import annotations

import warnings
import weakref
from collections.abc import Callable
from typing import Any

import numpy
import torch
from torch.overrides import TorchFunctionMode

from cugraphrt.adapter import Capture, pinned_constant
from cugraphrt.errors import CaptureError

__all__ = ["HostConstants"]

_Tensor = torch.Tensor
_FACTORIES = (torch.tensor, torch.as_tensor, torch.asarray)
_MOVES = (_Tensor.to, _Tensor.cuda)
_INDEXING = (_Tensor.__getitem__, _Tensor.__setitem__)


class HostConstants(TorchFunctionMode):
    """While a capture runs: host data copied to the device becomes a constant of the graph
    (see the module docstring). ``staged`` counts the constants staged so far."""

    def __init__(self, capture: Capture, device: int) -> None:
        super().__init__()
        self._capture = capture
        self._device = torch.device("cuda", device)
        #: CPU tensors made inside the captured code, by id (a WeakSet would compare
        #: tensors with ==, which is elementwise): constants when moved to the device.
        self._made: dict[int, weakref.ref] = {}
        self._warned = False  # about a NumPy array (once per capture)
        self.staged = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in _FACTORIES and _on_cuda(kwargs.get("device")):
            return self._factory(func, args, kwargs)
        if func in _MOVES and _is_cpu(args[0]) and _moves_to_cuda(func, args, kwargs):
            return func(self._to_device(args[0], "moved to the device"), *args[1:], **kwargs)
        if func is _Tensor.copy_ and len(args) > 1 and _is_cpu(args[1]) \
                and isinstance(args[0], _Tensor) and args[0].is_cuda:
            return args[0].copy_(self._to_device(args[1], "copied into a CUDA tensor"))
        if func in _INDEXING and isinstance(args[0], _Tensor) and args[0].is_cuda:
            args = self._indexing(func, args)
        result = func(*args, **kwargs)
        self._note(result)
        return result

    # -- what is staged --------------------------------------------------------------------
    def _factory(self, func, args: tuple, kwargs: dict) -> _Tensor:
        data = args[0] if args else kwargs.get("data", kwargs.get("obj"))
        if isinstance(data, _Tensor):
            if data.is_cuda:
                return func(*args, **kwargs)
            moved = self._to_device(data, f"given to {func.__name__}()")
            return func(moved, *args[1:], **{k: v for k, v in kwargs.items()
                                              if k not in ("data", "obj")})
        if isinstance(data, numpy.ndarray) and not self._warned:
            self._warned = True
            warnings.warn(
                f"torch.{func.__name__}() of a NumPy array ({data.dtype}, shape {data.shape}) "
                f"during a capture with stage_host_constants: its values were copied now, and "
                f"every replay copies these (the graph does not see later changes to the "
                f"array); for host data that changes, copy it into a pinned tensor made "
                f"before the capture (read at every replay)", UserWarning, stacklevel=3)
        grad = bool(kwargs.get("requires_grad", False))  # as_tensor has no such argument
        host = {k: v for k, v in kwargs.items()
                if k not in ("device", "pin_memory", "requires_grad")}
        out = self._stage(func(*args, device="cpu", **host))
        return out.requires_grad_(True) if grad else out

    def _to_device(self, cpu: _Tensor, how: str) -> _Tensor:
        """``cpu`` on the device: staged if made inside the capture, read at replay if pinned
        from before, refused if pageable from before."""
        made = self._made.get(id(cpu))
        if made is not None and made() is cpu:
            return self._stage(cpu)
        if cpu.is_pinned():
            return cpu.to(self._device, non_blocking=True)
        raise CaptureError(
            f"a pageable CPU tensor made before the capture ({_describe(cpu)}) is {how} "
            f"inside it (got a host-to-device copy of memory the graph does not own): its "
            f"values may change between calls, and the graph would replay the capture's. "
            f"Pin it (tensor.pin_memory(): each replay then copies its current values), keep "
            f"it on the device, or make it inside the captured code (then it is a constant "
            f"the graph keeps)")

    def _indexing(self, func, args: tuple) -> tuple:
        index = args[1]
        if isinstance(index, tuple):
            index = tuple(self._index(part) for part in index)
        else:
            index = self._index(index)
        if func is _Tensor.__setitem__ and len(args) > 2:
            value = args[2]
            if isinstance(value, (list, tuple)):
                value = self._stage(torch.tensor(value, dtype=args[0].dtype))
            elif _is_cpu(value) and value.dim() > 0:
                value = self._to_device(value, "assigned into a CUDA tensor")
            return (args[0], index, value, *args[3:])
        return (args[0], index, *args[2:])

    def _index(self, part: Any) -> Any:
        if isinstance(part, list) and _index_list(part):
            return self._stage(torch.tensor(part))
        if _is_cpu(part) and part.dim() > 0:
            return self._to_device(part, "used as an index of a CUDA tensor")
        return part

    def _stage(self, cpu: _Tensor) -> _Tensor:
        """A CUDA tensor filled at every replay from a pinned copy of ``cpu``'s bytes made
        now, which the graph keeps."""
        cpu = cpu.detach().contiguous()
        if cpu.numel() == 0:
            return torch.empty(cpu.shape, dtype=cpu.dtype, device=self._device)
        raw = cpu.reshape(-1).view(torch.uint8).numpy()
        pinned = torch.from_numpy(pinned_constant(self._capture, raw))
        host = pinned.view(cpu.dtype).reshape(cpu.shape)
        out = torch.empty(cpu.shape, dtype=cpu.dtype, device=self._device)
        out.copy_(host, non_blocking=True)
        self.staged += 1
        return out

    def _note(self, result: Any) -> None:
        for item in (result,) if isinstance(result, _Tensor) else \
                result if isinstance(result, (tuple, list)) else ():
            if isinstance(item, _Tensor) and item.device.type == "cpu":
                self._made[id(item)] = weakref.ref(item, self._forget(id(item)))

    def _forget(self, key: int) -> Callable[[Any], None]:
        made = self._made

        def forget(_: Any) -> None:  # the tensor died: its id may be reused
            made.pop(key, None)

        return forget


def _is_cpu(value: Any) -> bool:
    return isinstance(value, _Tensor) and value.device.type == "cpu"


def _on_cuda(device: Any) -> bool:
    if device is None:
        return False
    if isinstance(device, int):
        return True
    return torch.device(device).type == "cuda"


def _moves_to_cuda(func, args: tuple, kwargs: dict) -> bool:
    if func is _Tensor.cuda:
        return True
    targets = [kwargs.get("device")] + list(args[1:])
    for target in targets:
        if isinstance(target, _Tensor):
            return target.is_cuda
        if isinstance(target, int) and not isinstance(target, bool):
            return True  # a device index
        if isinstance(target, (str, torch.device)) and not isinstance(target, bool):
            try:
                return torch.device(target).type == "cuda"
            except RuntimeError:  # a string that is not a device
                continue
    return False


def _index_list(values: list) -> bool:
    """Whether ``values`` is an advanced index of Python ints or bools (nested lists too)."""
    return bool(values) and all(
        _index_list(v) if isinstance(v, list) else isinstance(v, (int, bool))
        for v in values)


def _describe(tensor: _Tensor) -> str:
    return f"a {tensor.dtype} tensor of shape {tuple(tensor.shape)}"
