"""PyTorch's implementation of :class:`cugraphrt.adapter.Framework`.

Every graphed callable of this adapter (``graph_module``, its buckets, the compile backend's
pieces, ``make_graphed_callables``) runs the core's one call path on it; CuPy's
implementation is the core's own (``cugraphrt.adapter.CUPY``). The pieces it gathers live in
the adapter's modules that own them: streams in :mod:`._torch`, the overwritten-output
operations in :mod:`._output_check`, the capture in :mod:`.capture`.
"""

from __future__ import annotations

import functools
from contextlib import AbstractContextManager
from operator import attrgetter
from typing import Any

import torch

from cugraphrt.adapter import byte_extent

from . import _output_check, _torch, dlpack
from .capture import graph

__all__ = ["TORCH", "TorchFramework"]

_Tensor = torch.Tensor


class TorchFramework:
    """Torch tensors on torch's current stream, captured by :class:`cugraphrt_torch.graph`."""

    name = "torch"
    array_type = _Tensor

    # C-level lookups, no Python frame per argument on the call path. ``device`` compares a
    # torch.device (type and index); a value without these attributes never matches.
    signature = staticmethod(attrgetter("shape", "dtype", "device"))
    address = staticmethod(_Tensor.data_ptr)
    strides = staticmethod(_Tensor.stride)  # what rebinding compares besides signature

    @staticmethod
    def extent(array: torch.Tensor) -> tuple[int, int]:
        size = array.element_size()
        return byte_extent(array.data_ptr(), tuple(array.shape),
                           [s * size for s in array.stride()], size)

    @staticmethod
    def same_layout(value: torch.Tensor, static: torch.Tensor) -> bool:
        return value.stride() == static.stride()

    copy = staticmethod(_Tensor.copy_)  # copy(dst, src): C-level, on the current stream

    @staticmethod
    def fill(rows: torch.Tensor, value: float) -> None:
        rows.fill_(value)

    @staticmethod
    def empty(like: torch.Tensor, shape: tuple[int, ...]) -> torch.Tensor:
        return torch.empty(shape, dtype=like.dtype, device=like.device)

    @staticmethod
    def clone(array: torch.Tensor) -> torch.Tensor:
        return array.clone()

    #: For shape buckets: outputs that let the next capture reuse their memory.
    unowned = staticmethod(dlpack.unowned)

    @staticmethod
    def is_contiguous(array: torch.Tensor) -> bool:
        return array.is_contiguous()

    @staticmethod
    def describe(value: Any) -> str:
        if isinstance(value, _Tensor):
            return f"shape {tuple(value.shape)} {value.dtype} on {value.device}"
        return f"{type(value).__name__} {value!r}"

    # -- outputs: the check marks tensors read after an overwrite (see _output_check) --------

    @functools.cached_property
    def _outputs(self) -> _output_check.TorchOutputs:
        # Which marking this torch build offers is read once, on the first hand-out.
        return _output_check.TorchOutputs(by_storage=_output_check.available() == "storage")

    def hand_out(self, static: torch.Tensor) -> tuple[torch.Tensor, Any]:
        return self._outputs.hand_out(static)

    def expire(self, held: Any, message: str, arguments: Any) -> None:
        self._outputs.expire(held, message, arguments)

    @staticmethod
    def message(what: str, fix: str) -> str:
        return _output_check.TorchOutputs.message(what, fix)

    # -- streams and capture -----------------------------------------------------------------

    @staticmethod
    def current_stream(device: int) -> int:
        return _torch.current_torch_stream_ptr(device)

    @staticmethod
    def use_stream(ptr: int, device: int) -> AbstractContextManager[Any]:
        return torch.cuda.stream(_torch.torch_stream_for(ptr, device))

    @staticmethod
    def capture(cuda_graph: Any, pool: Any = None) -> AbstractContextManager[Any]:
        return graph(cuda_graph, pool=pool)


#: The one instance.
TORCH = TorchFramework()
