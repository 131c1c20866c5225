"""Mixture-of-experts projections that read the experts' weights in place.

transformers' ``batched_mm`` experts copy each (token, expert) pair's weights out of the
stacked expert weights and run one strided batched matmul over the copies
(``_internals.experts``). :func:`gathered_matmul` computes the same product with
``cublasGemmBatchedEx`` over arrays of pointers into the stacked weights, built on the
device from the expert ids: no copy, and the pointers are device data, so a graph replays
the call over each step's routing.

Bits, not just values: the Generator must give ``generate``'s tokens, and ``generate``
decodes with ``batched_mm``. Whether cuBLAS's pointer-array GEMM rounds as torch's strided
one depends on the kernel it picks for the shape, so each shape is checked before it is
used: the first call of a shape outside a capture runs both on random data and compares
them bit for bit (torch's own handle: its stream, workspace and math mode). A shape whose
check failed, or was never run (a first call inside a capture), or a process with more than
one cuBLAS library mapped, computes ``batched_mm``'s way: the gather and ``torch.bmm``. So
the op always returns ``batched_mm``'s bits; the check decides only how fast.
"""

from __future__ import annotations

import threading

import torch

from cugraphrt.adapter import blas as _blas
from cugraphrt.errors import CugraphrtError

from .._internals import experts as _experts

__all__ = ["EXPERTS", "gathered_matmul", "checked_shapes", "register"]

#: The experts implementation :func:`register` registers with transformers.
EXPERTS = "cugraphrt_gathered_mm"

# cuBLAS's enums (cublas_api.h, library_types.h): what torch's bmm passes for these dtypes.
_OP_N, _OP_T = 0, 1
_DATA_TYPES = {torch.float16: 2, torch.bfloat16: 14, torch.float32: 0}
_COMPUTE_32F = 68
_DEFAULT_TENSOR_OP = 99

#: (device, dtype, experts, rows, columns, pairs, transposed) -> whether the pointer-array
#: GEMM gave torch.bmm's bits on random data of that shape.
_checked: dict[tuple, bool] = {}
_lock = threading.Lock()


@torch.library.custom_op("cugraphrt::gathered_matmul", mutates_args=())
def gathered_matmul(weights: torch.Tensor, ids: torch.Tensor, x: torch.Tensor,
                    transposed: bool) -> torch.Tensor:
    """Row ``s``: ``weights[ids[s]] @ x[s]`` (``x[s] @ weights[ids[s]]`` when
    ``transposed``), with ``batched_mm``'s bits (see the module)."""
    if _pointers_fit(weights, ids, x, transposed):
        return _pointer_gemm(weights, ids, x.contiguous(), transposed)
    return _experts.gathered_linear(weights, ids, x, transposed)


@gathered_matmul.register_fake
def _(weights: torch.Tensor, ids: torch.Tensor, x: torch.Tensor,
      transposed: bool) -> torch.Tensor:
    columns = weights.shape[2] if transposed else weights.shape[1]
    return x.new_empty((x.shape[0], columns))


def register() -> str:
    """Register :data:`EXPERTS` with transformers (``batched_mm``'s forward over
    :func:`gathered_matmul`); returns its name."""
    _experts.register_experts(EXPERTS, gathered_matmul)
    return EXPERTS


def checked_shapes() -> dict[tuple, bool]:
    """The shapes checked so far and whether each takes the pointer-array GEMM (see
    :data:`_checked` for the key)."""
    with _lock:
        return dict(_checked)


def _key(weights: torch.Tensor, x: torch.Tensor, transposed: bool) -> tuple:
    experts, rows, columns = weights.shape
    return (weights.device.index, weights.dtype, experts, rows, columns, x.shape[0],
            transposed)


def _pointers_fit(weights: torch.Tensor, ids: torch.Tensor, x: torch.Tensor,
                  transposed: bool) -> bool:
    if (weights.device.type != "cuda" or weights.dtype not in _DATA_TYPES
            or x.dtype != weights.dtype or weights.dim() != 3 or x.dim() != 2
            or not weights.is_contiguous() or x.shape[0] == 0):
        return False
    key = _key(weights, x, transposed)
    with _lock:
        known = _checked.get(key)
    if known is not None:
        return known
    if torch.cuda.is_current_stream_capturing():
        return False  # no check inside a capture (it synchronizes): batched_mm's way
    fits = len(_blas.mapped_libraries()) == 1 and _same_bits(weights, x, transposed)
    with _lock:
        _checked[key] = fits
    return fits


def _same_bits(weights: torch.Tensor, x: torch.Tensor, transposed: bool) -> bool:
    """Both ways over the weights themselves and random inputs and ids of the shape, compared
    bit for bit (it synchronizes)."""
    generator = torch.Generator(device=weights.device).manual_seed(0)
    inputs = torch.randn(x.shape, device=x.device, generator=generator).to(x.dtype)
    ids = torch.randint(0, weights.shape[0], (x.shape[0],), device=x.device,
                        generator=generator)
    want = _experts.gathered_linear(weights, ids, inputs, transposed)
    try:
        got = _pointer_gemm(weights, ids, inputs, transposed)
    except CugraphrtError:  # a status other than success (a layout cuBLAS refuses): the gather
        return False
    return bool(torch.equal(got, want))


def _pointer_gemm(weights: torch.Tensor, ids: torch.Tensor, x: torch.Tensor,
                  transposed: bool) -> torch.Tensor:
    """``cublasGemmBatchedEx`` over pointers into ``weights`` (row-major, seen by cuBLAS as
    the transposed column-major matrices), on torch's handle and current stream. ``ids``
    must lie in ``[0, len(weights))`` (the experts' forward clamps them): a pointer is not
    bounds-checked as an index is."""
    _, rows, columns = weights.shape
    pairs = x.shape[0]
    inner, outer = (rows, columns) if transposed else (columns, rows)
    out = x.new_empty((pairs, outer))
    size = weights.element_size()
    index = torch.arange(pairs, device=x.device, dtype=torch.int64)
    # The arrays live until the GEMM has read them: torch's allocator (or the graph's pool)
    # hands their memory to nothing before the stream has run past this call.
    a = weights.data_ptr() + ids.to(torch.int64) * (rows * columns * size)
    b = x.data_ptr() + index * (inner * size)
    c = out.data_ptr() + index * (outer * size)
    kind = _DATA_TYPES[weights.dtype]
    # Transposed: W is inner x outer row-major, which cuBLAS reads as the outer x inner
    # matrix itself (ld outer); else outer x inner row-major, read as its transpose (ld inner).
    op, lda = (_OP_N, outer) if transposed else (_OP_T, inner)
    handle = torch.cuda.current_blas_handle()  # bound by torch to the current stream
    _blas.gemm_batched_ex(handle, op, _OP_N, outer, 1, inner, a.data_ptr(), kind, lda,
                          b.data_ptr(), kind, inner, c.data_ptr(), kind, outer, pairs,
                          _COMPUTE_32F, _DEFAULT_TENSOR_OP)
    return out
