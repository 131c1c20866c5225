"""Small helpers around torch's CUDA runtime: availability, streams shared with CuPy.

Everything here is looked up lazily, so the package imports on a CPU-only build of torch and
fails with a clear message only when a CUDA feature is used.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable

import cupy
import torch

from cugraphrt.errors import CugraphrtError

from .._internals import cuda as _cuda_internals

__all__ = [
    "require_cuda",
    "torch_stream_for",
    "cupy_stream_for",
    "current_torch_stream_ptr",
    "current_torch_stream",
    "stream_handle",
    "stream_pair",
    "drop_blas_workspaces",
    "blas_workspaces_for",
    "give_back_dropped_workspaces",
    "Switched",
]

_lock = threading.Lock()
_checked = False
# ExternalStream wrappers are cheap but not free to build; the same few streams come back
# on every replay, so keep them. Keyed by (handle, device); bounded because a handle value
# can be reused by a new stream after the old one is destroyed (the wrapper stays valid:
# it is only the handle).
_torch_streams: dict[tuple[int, int], object] = {}
_cupy_streams: dict[tuple[int, int], cupy.cuda.Stream] = {}
_CACHE_LIMIT = 64
_raw_stream = _cuda_internals.raw_stream_reader()  # None on builds without it (CPU)


def require_cuda(what: str) -> None:
    """Raise a CugraphrtError unless torch can run CUDA work with a pluggable allocator.

    Parameters
    ----------
    what : str
        The feature asked for, for the message.
    """
    global _checked
    if _checked:
        return
    available = bool(getattr(torch.cuda, "is_available", lambda: False)())
    if not available or not _cuda_internals.has_custom_allocator():
        raise CugraphrtError(
            f"{what} needs a CUDA build of PyTorch and a visible GPU (got torch "
            f"{torch.__version__}, torch.cuda.is_available() = {available}); install a CUDA "
            f"build of torch (pip install torch) and run on a machine with an NVIDIA GPU"
        )
    if not hasattr(torch.cuda, "MemPool"):
        raise CugraphrtError(
            f"{what} needs torch.cuda.MemPool (got torch {torch.__version__}); upgrade to "
            f"torch >= 2.11 (the oldest tested: docs/torch.md, \"Versions\")"
        )
    # Initialize torch's CUDA state now: doing it lazily inside a capture would call
    # cudaMalloc and friends, which capture forbids.
    torch.cuda.init()
    _checked = True


def _cached(cache: dict, key: tuple[int, int], make):
    """``cache[key]``, built by ``make()`` on a miss; the cache is bounded by _CACHE_LIMIT."""
    stream = cache.get(key)
    if stream is None:
        with _lock:
            if len(cache) >= _CACHE_LIMIT:
                cache.clear()
            stream = cache[key] = make()
    return stream


def torch_stream_for(ptr: int, device: int):
    """A torch stream object for the raw stream handle ``ptr`` on ``device``."""
    if ptr == 0:  # the device's default stream, as torch itself names it
        return _cached(_torch_streams, (0, device), lambda: torch.cuda.default_stream(device))
    return _cached(_torch_streams, (ptr, device),
                   lambda: torch.cuda.ExternalStream(ptr, device=device))


def current_torch_stream(device: int):
    """torch's current stream on ``device``, as a (cached) torch stream object: what
    ``torch.cuda.current_stream(device)`` returns, without building a new one per call."""
    return torch_stream_for(current_torch_stream_ptr(device), device)


def cupy_stream_for(ptr: int, device: int) -> cupy.cuda.Stream:
    """A CuPy stream object for the raw stream handle ``ptr`` on ``device``."""
    if ptr == 0:
        return cupy.cuda.Stream.null
    return _cached(_cupy_streams, (ptr, device), lambda: _wrap_cupy_stream(ptr, device))


class _StreamHandle:
    """A raw stream handle speaking the CUDA stream protocol (``__cuda_stream__``)."""

    __slots__ = ("ptr",)

    def __init__(self, ptr: int) -> None:
        self.ptr = ptr

    def __cuda_stream__(self) -> tuple[int, int]:
        return (0, self.ptr)


def _wrap_cupy_stream(ptr: int, device: int):
    # CuPy 14 deprecates ExternalStream in favour of Stream.from_external.
    from_external = getattr(cupy.cuda.Stream, "from_external", None)
    if from_external is None:
        return cupy.cuda.ExternalStream(ptr, device)
    with cupy.cuda.Device(device):
        return from_external(_StreamHandle(ptr))


def current_torch_stream_ptr(device: int) -> int:
    """The raw handle of torch's current stream on ``device``.

    The raw reader (:func:`_internals.cuda.raw_stream_reader`, what Inductor's generated code
    calls) avoids building a Stream object; fall back to the public API where it is missing.
    """
    raw = _raw_stream
    if raw is not None:
        return int(raw(device))
    return int(torch.cuda.current_stream(device).cuda_stream)


def stream_handle(stream) -> int:
    """The raw handle of a CuPy stream, a torch stream or an int."""
    if isinstance(stream, int):
        return stream
    handle = getattr(stream, "cuda_stream", None)  # torch.cuda.Stream
    if handle is None:
        handle = stream.ptr  # cupy.cuda.Stream; AttributeError for anything else
    return int(handle)


def stream_pair(stream, device: int) -> tuple[cupy.cuda.Stream, torch.cuda.Stream]:
    """The same CUDA stream seen by CuPy and by torch.

    Parameters
    ----------
    stream : None, cupy.cuda.Stream or torch.cuda.Stream
        None picks cugraphrt's per-thread default capture stream.
    device : int
        The current device.

    Returns
    -------
    (cupy stream, torch stream)
    """
    if stream is None:
        from cugraphrt import default_capture_stream

        cupy_stream = default_capture_stream()
        return cupy_stream, torch_stream_for(cupy_stream.ptr, device)
    if isinstance(stream, torch.cuda.Stream):
        return cupy_stream_for(int(stream.cuda_stream), device), stream
    return stream, torch_stream_for(int(stream.ptr), device)


def drop_blas_workspaces() -> None:
    """Make torch forget its cached cuBLAS / cuBLASLt workspaces (all handles and streams).

    Torch keeps one workspace per (cuBLAS handle, stream) in a process-wide cache, allocated
    on first use, and a captured matmul bakes that workspace's address into the graph. The
    cache does not know about graphs: ``torch.compile``'s CUDA graph trees clear it before
    and after every warm-up and recording (``clear_cublas_manager``) and then
    ``torch.cuda.graph`` calls ``empty_cache()``, which hands the freed workspace back to the
    driver, so a graph that captured a cached workspace replays into unmapped memory
    (``cudaErrorLaunchFailure``) or into memory that is someone else's by then.

    Called right before each capture begins, it makes the capture allocate a fresh
    workspace from the capture's own pool; called right after it ends, it stops eager work
    and later captures from sharing that workspace. The workspace then belongs to the
    graph's pool like any intermediate freed during the capture: it stays mapped while the
    pool lives, whatever torch does to its cache. This is what the graph trees do for their
    own recordings.
    """
    global _workspace_owner
    _workspace_owner = _nobody
    _cuda_internals.clear_cublas_workspaces()


def give_back_dropped_workspaces() -> None:
    """After the first capture of a bucket family or a Generator: the workspaces
    :func:`drop_blas_workspaces` made torch forget, those of eager streams included (the
    default stream's, 32 MiB on an H200), sit freed in torch's general cache, where a server
    sizing its KV cache by ``cudaMemGetInfo`` after capture loses them (issue 51). Give them
    back to the device, as ``torch.cuda.graph`` does on entry. Once per family or
    generator, not per capture: every later capture drops its own workspace into its pool
    (or shares its owner's), and emptying per capture costs each next eager matmul a fresh
    ``cudaMalloc`` (``capture_time`` read 1.63x torch's that way on an H200)."""
    torch.cuda.empty_cache()


def _nobody() -> None:
    return None


# Whose captures made the workspaces torch's cache holds now (see blas_workspaces_for): a
# weak reference, or _nobody.
_workspace_owner: Callable[[], object | None] = _nobody


def blas_workspaces_for(owner: object | None) -> None:
    """Before a capture begins: drop torch's cached cuBLAS workspaces (as
    :func:`drop_blas_workspaces`), unless the captures of ``owner`` made them.

    An owner is an object all of whose graphs live and die together and never run at once,
    such as a ``Generator``'s: they may share one workspace per stream, which the first of
    them allocates from its pool and the others bake in too (a generator's decode graphs
    held one each, 455 MiB at batch 8 with the default buckets; issue 54). Anything else
    that clears the cache in between (another capture, torch.compile's graph trees) makes
    the next capture allocate afresh: never a workspace of another owner's pool.
    """
    global _workspace_owner
    if owner is not None and _workspace_owner() is owner:
        return
    drop_blas_workspaces()
    if owner is not None:
        _workspace_owner = weakref.ref(owner)


class Switched:
    """Context managers entered on creation and left in reverse by :meth:`close`: what a
    capture runs in (CuPy's and torch's stream switched to the capture stream). A list
    rather than an ExitStack: this runs on every build's clock, where an ExitStack's
    callbacks cost more host time than the switches themselves."""

    __slots__ = ("_entered",)

    def __init__(self, *contexts) -> None:
        entered: list = []
        try:
            for context in contexts:
                context.__enter__()
                entered.append(context)
        except BaseException:
            self._entered = entered
            try:
                self.close()
            except Exception:  # noqa: BLE001 - the error entering is the one to see
                pass
            raise
        self._entered = entered

    def close(self) -> None:
        """Leave every context entered, the last first; the first error raised, after all
        were left."""
        entered, self._entered = self._entered, []
        error: BaseException | None = None
        for context in reversed(entered):
            try:
                context.__exit__(None, None, None)
            except BaseException as exc:  # noqa: BLE001 - leave the others, then raise
                if error is None:
                    error = exc
        if error is not None:
            raise error
