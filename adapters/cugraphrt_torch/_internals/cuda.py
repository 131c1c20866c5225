"""torch's CUDA internals: the caching allocator's hooks, the cuBLAS workspace cache, raw
streams. Tested on torch 2.11 (CUDA 13) and, where a CPU build has the name, 2.11 to
2.14."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

__all__ = ["has_custom_allocator", "custom_allocator", "host_empty_cache",
           "clear_cublas_workspaces", "raw_stream_reader", "end_allocate_to_pool"]


def has_custom_allocator() -> bool:
    """Whether this build can take a pluggable allocator (``torch._C._cuda_customAllocator``:
    CUDA builds since torch 2.1; absent from CPU builds)."""
    return hasattr(torch._C, "_cuda_customAllocator")


def custom_allocator(alloc_ptr: int, free_ptr: int) -> Any:
    """A ``CUDAPluggableAllocator`` from two C function addresses (what
    ``torch.cuda.memory.CUDAPluggableAllocator`` builds from a shared library's symbols):
    ``torch._C._cuda_customAllocator(alloc, free)``, the same since torch 2.1."""
    return torch._C._cuda_customAllocator(alloc_ptr, free_ptr)


def host_empty_cache() -> None:
    """Let torch's pinned-host allocator drop what it caches (``torch._C._host_emptyCache``,
    since torch 2.5; nothing where it is missing). Raises what torch raises."""
    empty = getattr(torch._C, "_host_emptyCache", None)
    if empty is not None:
        empty()


def clear_cublas_workspaces() -> None:
    """Make torch forget its cached cuBLAS / cuBLASLt workspaces, of every handle and stream
    (``torch._C._cuda_clearCublasWorkspaces``, what ``torch.compile``'s CUDA graph trees
    call; the same since torch 2.1)."""
    torch._C._cuda_clearCublasWorkspaces()


def raw_stream_reader() -> Callable[[int], int] | None:
    """``torch._C._cuda_getCurrentRawStream(device) -> int``, the current stream's handle
    without a ``torch.cuda.Stream`` object (what Inductor's generated code calls; torch 2.0
    on), or None where missing."""
    return getattr(torch._C, "_cuda_getCurrentRawStream", None)


def end_allocate_to_pool(device: int, pool_id: tuple[int, int]) -> None:
    """Stop routing allocations to a graph pool (``torch._C._cuda_endAllocateToPool``, what
    ``CUDAGraph.capture_end`` does; since torch 2.1). Raises if it was not routing."""
    torch._C._cuda_endAllocateToPool(device, pool_id)
