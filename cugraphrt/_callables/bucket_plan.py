"""Planning a bucketed callable: bucket sizes, dynamic arguments, static buffers and views.

The arithmetic half of :mod:`cugraphrt._callables.buckets`, front-end neutral and GPU-free: which
dimension of which argument is dynamic, which bucket serves which size, and the static
buffers (one per dynamic argument, sized for the largest bucket) with the views the call path
indexes by size, so that a call allocates nothing.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from cugraphrt import _tree
from cugraphrt.errors import OptionsError

if TYPE_CHECKING:
    from cugraphrt._callables.framework import Framework as ArrayOps

__all__ = ["Slot", "bucket_sizes", "check_budget", "check_pad", "checked_sizes", "doubling",
           "leaf_dims", "make_slot", "resolve_buckets", "rows", "sample_size", "stepping"]


def resolve_buckets(buckets: Any, sample_size: int) -> tuple[int, ...]:
    """The sorted bucket sizes for ``buckets`` (a sequence of sizes or ``"pow2"``).

    ``"pow2"`` means 1, 2, 4, ... up to ``sample_size``, and ``sample_size`` itself when it
    is not a power of two, so the size the callable was sampled with is always a bucket.

    Raises
    ------
    OptionsError
        For anything but ``"pow2"`` or a strictly increasing sequence of positive ints.
    """
    if isinstance(buckets, str):
        if buckets != "pow2":
            raise OptionsError("buckets", buckets, "'pow2' or a sorted list of positive sizes")
        if sample_size < 1:
            raise OptionsError("sample_args", f"dynamic size {sample_size}",
                               "a sample whose dynamic dimension is at least 1 for 'pow2'")
        return doubling(1, sample_size)
    return checked_sizes("buckets", buckets, "'pow2' or ")


def checked_sizes(name: str, sizes: Any, alternatives: str = "") -> tuple[int, ...]:
    """``sizes`` as a tuple, if it is a non-empty, strictly increasing sequence of positive
    ints: the one rule for every list of bucket sizes (``make_graphed``'s, ``graph_module``'s,
    the torch ``Generator``'s). Lists are never sorted for the caller: an unsorted one is more
    likely a mistake than an order that does not matter.

    Raises
    ------
    OptionsError
        Naming the option ``name``; ``alternatives`` ("'pow2' or ") says what else it takes.
    """
    if not isinstance(sizes, (list, tuple)) or not sizes:
        raise OptionsError(name, sizes, f"{alternatives}a non-empty sorted list of positive "
                           f"sizes")
    for size in sizes:
        if type(size) is not int or size < 1:
            raise OptionsError(name, sizes, f"positive ints (got {size!r})")
    if any(a >= b for a, b in zip(sizes, sizes[1:])):  # noqa: B905 - pairwise
        raise OptionsError(name, sizes, "a strictly increasing list of sizes (sorted, no "
                           "repeats)")
    return tuple(sizes)


def doubling(smallest: int, largest: int) -> tuple[int, ...]:
    """``smallest``, twice that, four times, ... below ``largest``, then ``largest``: the
    buckets of ``"pow2"`` (from 1) and the torch Generator's prompt buckets (from 16)."""
    sizes, size = [], smallest
    while size < largest:
        sizes.append(size)
        size *= 2
    sizes.append(largest)
    return tuple(sizes)


def stepping(step: int, largest: int) -> tuple[int, ...]:
    """``step``, 2 ``step``, 3 ``step``, ... below ``largest``, then ``largest`` (the torch
    Generator's cache buckets: as many 64-key blocks as eager's growing cache has)."""
    return (*range(step, largest, step), largest)


def bucket_sizes(buckets: tuple[int, ...]) -> list[int]:
    """For every n from 0 to the largest bucket, the smallest bucket ``>= n`` (0 for n = 0)."""
    size_of = [0] * (buckets[-1] + 1)
    for size in reversed(buckets):
        size_of[1:size + 1] = [size] * size
    return size_of


class Slot:
    """The static buffer of one dynamic argument and the views the call path uses.

    Each bucket reads a view of one buffer sized for the largest bucket, or a buffer of its
    own where that view would be strided. Each buffer has a *dirty* count (a one-item list
    shared by the buckets that view it): the leading rows that may hold data other than the
    pad value. Rows past it are known to be padded, so a call pads only what a larger earlier
    call wrote there.
    """

    __slots__ = ("index", "dim", "path", "dtype", "buffer", "per_bucket", "shapes",
                 "copy_views", "pad_views", "dirty")

    def __init__(self, index: int, dim: int, path: str, buffer: Any) -> None:
        self.index = index
        self.dim = dim
        self.path = path
        self.dtype = buffer.dtype
        self.buffer = buffer
        self.per_bucket: dict[int, Any] = {}  # bucket -> its static view (or own buffer)
        self.shapes: list[tuple[int, ...] | None] = []  # n -> the shape a call must have
        self.copy_views: list[Any] = []  # n -> rows [0, n) of n's bucket
        self.pad_views: list[Any] = []  # n -> rows [n, bucket) of n's bucket (None if empty)
        self.dirty: list[list[int]] = []  # n -> the dirty count of n's buffer


def make_slot(ops: ArrayOps, index: int, sample: Any, dim: int, path: str, sample_size: int,
              buckets: tuple[int, ...], pad: Callable[[Any, str], None]) -> Slot:
    """The static buffer of dynamic argument ``path`` and its per-size views."""
    largest = buckets[-1]
    size_of = bucket_sizes(buckets)
    shape = tuple(sample.shape)
    buffer = ops.empty(sample, shape[:dim] + (largest,) + shape[dim + 1:])
    slot = Slot(index, dim, path, buffer)
    filled = min(sample_size, largest)
    ops.copy(rows(buffer, dim, 0, filled), rows(sample, dim, 0, filled))
    if filled < largest:
        pad(rows(buffer, dim, filled, largest), path)
    shared = [filled]
    counts: dict[int, list[int]] = {}
    for size in buckets:
        view = rows(buffer, dim, 0, size)
        counts[size] = shared
        if not ops.is_contiguous(view):
            # A prefix along an inner dimension is strided: give the bucket a contiguous
            # buffer of its own, so the captured kernels see what an eager call would.
            own = ops.empty(sample, tuple(view.shape))
            ops.copy(own, view)
            view = own
            counts[size] = [min(filled, size)]
        slot.per_bucket[size] = view
    last = largest + 1
    slot.shapes, slot.copy_views = [None] * last, [None] * last
    slot.pad_views, slot.dirty = [None] * last, [shared] * last
    for n in range(1, last):
        size = size_of[n]
        view = slot.per_bucket[size]
        slot.shapes[n] = shape[:dim] + (n,) + shape[dim + 1:]
        slot.copy_views[n] = rows(view, dim, 0, n)
        if n < size:
            slot.pad_views[n] = rows(view, dim, n, size)
        slot.dirty[n] = counts[size]
    return slot


def rows(array: Any, dim: int, start: int, stop: int) -> Any:
    """Rows ``[start, stop)`` of ``array`` along ``dim``, as a view (CuPy and torch alike)."""
    return array[(slice(None),) * dim + (slice(start, stop),)]


def check_budget(memory_budget: Any) -> int | None:
    if memory_budget is None:
        return None
    if type(memory_budget) is not int or memory_budget < 1:
        raise OptionsError("memory_budget", memory_budget, "a positive number of bytes, or None")
    return memory_budget


def check_pad(pad: Any) -> tuple[float, Callable[[Any, str], None] | None]:
    if callable(pad):
        return 0.0, pad
    if isinstance(pad, bool) or not isinstance(pad, (int, float)):
        raise OptionsError("pad", pad, "a number (the pad value) or a callable pad(rows, path) "
                           "that fills the pad rows in place")
    return pad, None


def leaf_dims(sample_args: tuple, dynamic_dim: Any, array_type: type[Any]) -> list[int | None]:
    """The dynamic dimension of every leaf of ``sample_args`` (None: not dynamic)."""
    if isinstance(dynamic_dim, (list, tuple)):
        if len(dynamic_dim) != len(sample_args):
            raise OptionsError("dynamic_dim", dynamic_dim, f"an int, or one entry (int or None) "
                               f"per argument ({len(sample_args)} arguments)")
        per_arg = list(dynamic_dim)
    else:
        per_arg = [dynamic_dim] * len(sample_args)
    for dim in per_arg:
        if dim is not None and (type(dim) is not int or dim < 0):
            raise OptionsError("dynamic_dim", dynamic_dim, "non-negative ints (or None per "
                               "argument for arguments that are not dynamic)")
    dims: list[int | None] = []
    for arg, dim in zip(sample_args, per_arg, strict=True):
        for leaf in _tree.leaves_of(arg):
            dynamic = dim is not None and isinstance(leaf, array_type) and len(leaf.shape) > dim
            dims.append(dim if dynamic else None)
    return dims


def sample_size(leaves: list, dims: list[int | None], paths: list[str],
                 dynamic_dim: Any) -> int:
    sizes = {paths[i]: leaf.shape[dim] for i, (leaf, dim) in enumerate(zip(leaves, dims,
                                                                           strict=True))
             if dim is not None}
    if not sizes:
        raise OptionsError("dynamic_dim", dynamic_dim, "a dimension that at least one array "
                           "argument has (got no array argument with it)")
    if len(set(sizes.values())) > 1:
        found = ", ".join(f"{path}: {size}" for path, size in sizes.items())
        raise OptionsError("sample_args", found, "the same size in the dynamic dimension for "
                           "every dynamic argument; mark the others not dynamic with a per-"
                           "argument dynamic_dim such as (0, None)")
    return next(iter(sizes.values()))
