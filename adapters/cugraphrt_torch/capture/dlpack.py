"""Zero-copy conversion between torch tensors and CuPy arrays, safe during capture.

Both directions go through DLPack and share the memory: same pointer, shape, strides and
dtype. The DLPack protocol lets the consumer pass its stream so the producer can order its
work before the consumer's (``__dlpack__(stream=...)``); during a capture that event record
and wait between two streams would fork the capture onto the other stream, or break it. So
the producer is always asked not to synchronize, and the ordering is done here, only when it
is needed and allowed: the two libraries' current streams differ and neither is capturing.
Inside :func:`cugraphrt_torch.graph` both libraries use the same stream, so no ordering is
needed at all. Nothing here synchronizes with the host.
"""

from __future__ import annotations

import importlib.util

import cupy
import torch

from cugraphrt.adapter import byte_extent
from cugraphrt.adapter import cuda as _cuda
from cugraphrt.errors import OptionsError

from . import _torch

__all__ = ["to_cupy", "from_cupy", "cupy_dtype_name", "torch_dtype_for", "unowned"]

_TORCH_TO_CUPY = {
    torch.bool: "bool",
    torch.uint8: "uint8",
    torch.int8: "int8",
    torch.int16: "int16",
    torch.int32: "int32",
    torch.int64: "int64",
    torch.float16: "float16",
    torch.float32: "float32",
    torch.float64: "float64",
    torch.complex64: "complex64",
    torch.complex128: "complex128",
    torch.bfloat16: "bfloat16",
}
for _name in ("uint16", "uint32", "uint64"):  # torch >= 2.3
    if hasattr(torch, _name):
        _TORCH_TO_CUPY[getattr(torch, _name)] = _name
_CUPY_TO_TORCH = {name: dtype for dtype, name in _TORCH_TO_CUPY.items()}
_SUPPORTED = ", ".join(sorted(_TORCH_TO_CUPY.values()))
# Legacy DLPack values for the default streams: never queried for their capture status
# (querying the legacy stream while a global-mode capture runs would invalidate it).
_DEFAULT_STREAMS = (0, 1, 2)


def cupy_dtype_name(dtype) -> str:
    """The CuPy dtype name for a torch dtype.

    Raises
    ------
    OptionsError
        For a dtype CuPy has no counterpart of (float8, quantized, complex32, ...).
    """
    name = _TORCH_TO_CUPY.get(dtype)
    if name is None:
        raise OptionsError(
            "tensor", f"a tensor of dtype {dtype}",
            f"a tensor of a dtype CuPy can represent ({_SUPPORTED}); convert it first, e.g. "
            f"tensor.float()",
        )
    return name


def torch_dtype_for(dtype) -> torch.dtype:
    """The torch dtype for a CuPy (NumPy) dtype.

    Raises
    ------
    OptionsError
        For a dtype torch has no counterpart of (strings, structured dtypes, ...).
    """
    name = getattr(dtype, "name", str(dtype))
    torch_dtype = _CUPY_TO_TORCH.get(name)
    if torch_dtype is None:
        raise OptionsError(
            "array", f"an array of dtype {name}",
            f"an array of a dtype torch can represent ({_SUPPORTED}); convert it first, e.g. "
            f"array.astype(cupy.float32)",
        )
    return torch_dtype


def to_cupy(tensor: torch.Tensor) -> cupy.ndarray:
    """View a CUDA tensor as a CuPy array, without copying.

    Parameters
    ----------
    tensor : torch.Tensor
        A strided CUDA tensor that does not require grad (call ``.detach()`` first).

    Returns
    -------
    cupy.ndarray
        Same memory (``array.data.ptr == tensor.data_ptr()``), shape, strides, dtype and
        device. Ready to use on CuPy's current stream.

    Raises
    ------
    OptionsError
        For a CPU tensor, a dtype CuPy cannot represent (bfloat16 needs the ``ml_dtypes``
        package), or a tensor DLPack cannot export (requires grad, conjugate bit, sparse).

    Notes
    -----
    Safe inside a capture: it records no event and never waits for the device.
    """
    if not isinstance(tensor, torch.Tensor):
        raise OptionsError("tensor", type(tensor).__name__, "a torch.Tensor on a CUDA device")
    if tensor.device.type != "cuda":
        raise OptionsError(
            "tensor", f"a tensor on {tensor.device}",
            "a CUDA tensor; move it with tensor.cuda() outside any capture, or use "
            "tensor.numpy() for host data",
        )
    name = cupy_dtype_name(tensor.dtype)
    if name == "bfloat16" and importlib.util.find_spec("ml_dtypes") is None:
        raise OptionsError(
            "tensor", "a bfloat16 tensor",
            "CuPy represents bfloat16 through the ml_dtypes package, which is not installed: "
            "pip install ml-dtypes, or convert with tensor.float() first",
        )
    device = tensor.device.index
    _order(producer=_torch.current_torch_stream_ptr(device),
           consumer=cupy.cuda.get_current_stream().ptr)
    try:
        with torch.cuda.device(device):
            # stream=-1: "do not synchronize" in the DLPack protocol and in every torch
            # version (None means "the default stream" in newer ones).
            capsule = tensor.__dlpack__(stream=-1)
    except (BufferError, RuntimeError, TypeError) as exc:
        raise OptionsError(
            "tensor", f"a {name} tensor of shape {tuple(tensor.shape)}",
            f"a tensor DLPack can export ({exc}); call tensor.detach(), "
            f"tensor.resolve_conj() or tensor.to_dense() first",
        ) from exc
    try:
        with cupy.cuda.Device(device):
            return cupy.from_dlpack(capsule)
    except (BufferError, TypeError, ValueError, RuntimeError) as exc:
        raise OptionsError(
            "tensor", f"a {name} tensor", f"a dtype this CuPy {cupy.__version__} can import "
            f"({exc}); convert the tensor first, e.g. tensor.float()",
        ) from exc


def from_cupy(array: cupy.ndarray) -> torch.Tensor:
    """View a CuPy array as a torch tensor, without copying.

    Parameters
    ----------
    array : cupy.ndarray

    Returns
    -------
    torch.Tensor
        Same memory (``tensor.data_ptr() == array.data.ptr``), shape, strides, dtype and
        device; it keeps the array's memory alive. Ready to use on torch's current stream.

    Raises
    ------
    OptionsError
        For something other than a CuPy array, or a dtype torch cannot represent.

    Notes
    -----
    Safe inside a capture: it records no event and never waits for the device.
    """
    if not isinstance(array, cupy.ndarray):
        raise OptionsError("array", type(array).__name__, "a cupy.ndarray")
    torch_dtype_for(array.dtype)
    device = array.device.id
    producer = cupy.cuda.get_current_stream().ptr
    _order(producer=producer, consumer=_torch.current_torch_stream_ptr(device))
    with cupy.cuda.Device(device):
        try:
            # Passing CuPy its own current stream asks it for no synchronization.
            capsule = array.__dlpack__(stream=producer or 1)
        except TypeError:  # a CuPy without the keyword-only protocol
            capsule = array.toDlpack()
    return torch.from_dlpack(capsule)


def unowned(tensor: torch.Tensor, keep: object) -> torch.Tensor:
    """An alias of ``tensor``'s memory that does not own it, and keeps ``keep`` alive.

    Once ``tensor`` (and every other owner) is gone, torch's allocator counts the memory as
    free and may give it to another tensor; the alias still reads it. Shape buckets use it so
    the next capture can reuse a bucket's outputs' memory (:class:`cugraphrt.adapter.
    CapturedBucket`), with ``keep`` the torch MemPool whose segments torch keeps while it
    lives. Any dtype, bfloat16 included: the memory goes through DLPack as bytes (a CuPy
    ``UnownedMemory``, public CuPy API) and takes ``tensor``'s dtype and strides in torch.
    """
    if tensor.numel() == 0 or not tensor.is_cuda:
        return tensor  # no device memory to share
    size = tensor.element_size()
    low, high = byte_extent(tensor.data_ptr(), tuple(tensor.shape),
                            [s * size for s in tensor.stride()], size)
    device = tensor.device.index
    memory = cupy.cuda.UnownedMemory(low, high - low, keep, device)
    raw = cupy.ndarray((high - low,), cupy.uint8, cupy.cuda.MemoryPointer(memory, 0))
    base = from_cupy(raw).view(tensor.dtype)
    return base.as_strided(tensor.shape, tensor.stride(), (tensor.data_ptr() - low) // size)


def _order(producer: int, consumer: int) -> None:
    """Make ``consumer`` wait for work queued on ``producer``, when that is needed and legal."""
    if producer == consumer or _capturing(producer) or _capturing(consumer):
        # Same stream: ordered already. A capture: a cross-stream wait would pull the other
        # stream into it; the caller orders its streams (cugraphrt_torch.graph shares one).
        return
    event = cupy.cuda.Event(block=False, disable_timing=True, interprocess=False)
    _cuda.event_record(event.ptr, producer)
    _cuda.stream_wait_event(consumer, event.ptr)


def _capturing(ptr: int) -> bool:
    if ptr in _DEFAULT_STREAMS:
        return False
    status, _ = _cuda.capture_info(ptr)
    return status != _cuda.STATUS_NONE
