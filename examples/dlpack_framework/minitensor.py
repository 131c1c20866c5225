"""minitensor: a deliberately tiny array framework, to show what a cugraphrt adapter needs.

A :class:`Tensor` is device memory with a shape, a dtype and strides, exchanged with other
libraries through DLPack only (``__dlpack__`` / ``from_dlpack``). Its handful of operations
run on CuPy's kernels, on CuPy's current stream: minitensor stands for any framework built
on a kernel library (as Chainer was built on CuPy). It knows nothing of cugraphrt;
``cugraphrt_minitensor.py`` beside it is the adapter.
"""

from __future__ import annotations

from typing import Any

import cupy

__all__ = ["Tensor", "from_dlpack", "tensor", "empty", "matmul", "relu", "softmax"]


class Tensor:
    """An n-dimensional array on a CUDA device (DLPack in and out)."""

    __slots__ = ("_a", "__weakref__")

    def __init__(self, array: cupy.ndarray) -> None:
        self._a = array  # the memory, as the kernel library sees it

    # -- what the framework exposes ------------------------------------------------------------
    @property
    def shape(self) -> tuple[int, ...]:
        return self._a.shape

    @property
    def dtype(self) -> Any:
        return self._a.dtype

    @property
    def strides(self) -> tuple[int, ...]:
        return self._a.strides

    @property
    def device_index(self) -> int:
        return self._a.data.device_id

    def data_ptr(self) -> int:
        return self._a.data.ptr

    def is_contiguous(self) -> bool:
        return bool(self._a.flags.c_contiguous)

    def __dlpack__(self, stream: Any = None) -> Any:
        return self._a.__dlpack__(stream=stream)

    def __dlpack_device__(self) -> tuple[int, int]:
        return self._a.__dlpack_device__()

    def numpy(self) -> Any:
        return cupy.asnumpy(self._a)

    def __getitem__(self, index: Any) -> Tensor:
        return Tensor(self._a[index])

    # -- operations, on the current stream ------------------------------------------------------
    def __add__(self, other: Tensor | float) -> Tensor:
        return Tensor(self._a + _raw(other))

    def __mul__(self, other: Tensor | float) -> Tensor:
        return Tensor(self._a * _raw(other))

    def sum(self, axis: int) -> Tensor:
        return Tensor(self._a.sum(axis=axis))

    def copy_(self, source: Tensor) -> Tensor:
        cupy.copyto(self._a, source._a)
        return self

    def fill_(self, value: float) -> Tensor:
        self._a.fill(value)
        return self

    def clone(self) -> Tensor:
        return Tensor(self._a.copy())

    def __repr__(self) -> str:
        return f"minitensor.Tensor(shape={self.shape}, dtype={self.dtype})"


def _raw(value: Tensor | float) -> Any:
    return value._a if isinstance(value, Tensor) else value


def from_dlpack(obj: Any) -> Tensor:
    """A Tensor over another library's memory (zero copy)."""
    return Tensor(cupy.from_dlpack(obj))


def tensor(data: Any, dtype: Any = "float32") -> Tensor:
    """A Tensor holding a copy of host ``data``."""
    return Tensor(cupy.asarray(data, dtype=dtype))


def empty(shape: tuple[int, ...], dtype: Any = "float32") -> Tensor:
    return Tensor(cupy.empty(shape, dtype=dtype))


def matmul(a: Tensor, b: Tensor) -> Tensor:
    return Tensor(a._a @ b._a)


def relu(x: Tensor) -> Tensor:
    return Tensor(cupy.maximum(x._a, 0))


def softmax(x: Tensor, axis: int = -1) -> Tensor:
    shifted = x._a - x._a.max(axis=axis, keepdims=True)
    e = cupy.exp(shifted)
    return Tensor(e / e.sum(axis=axis, keepdims=True))
