"""Host constants of a capture: bytes the captured code makes on the host and copies to the
device, kept in pinned memory the graph owns.

CUDA captures a host-to-device copy only from pinned (page-locked) memory: a copy from
pageable memory is staged through a driver buffer and waits for it, which capture forbids
(torch refuses it first: "Cannot copy between CPU and CUDA tensors during CUDA graph capture
unless the CPU tensor is pinned"). A constant the captured code makes on the host (a Python
scalar or list turned into a tensor, an index list, a grid built with host operations) holds
the same bytes on every call, so the capture copies it once, when it runs, into pinned memory
of its own, and captures the copy from there: every replay copies those bytes. The memory
lives as long as the graph (the capture's ``keepalive``), and goes back to CuPy's pinned
memory pool with it.

The framework adapters decide what a constant is: the torch adapter's
``cugraphrt_torch.capture._host_constants``. For CuPy, ``cupy.asarray`` and ``cupy.array`` of
host data (Python values and lists, NumPy arrays) inside a cugraphrt capture are staged here
(:func:`stage_host_arrays` installs that before the first capture). A NumPy array is read
once, at capture, like any constant: the graph does not see later changes to it, and a
UserWarning says so once per capture; a pinned NumPy array is read at every replay.
"""

from __future__ import annotations

import functools
import warnings
from typing import Any, cast

import cupy
import numpy

from cugraphrt._capture import stream_capture as _capture
from cugraphrt._capture.stream_capture import Capture
from cugraphrt._cuda import runtime as _runtime

__all__ = ["pinned_constant", "device_constant", "stage_host_arrays"]

_HOST_SCALARS = (bool, int, float, complex, numpy.generic)


def pinned_constant(capture: Capture, data: numpy.ndarray) -> numpy.ndarray:
    """A C-contiguous copy of ``data`` in pinned memory, alive as long as ``capture``'s graph
    (or until the capture rolls back)."""
    count = int(data.size)
    if not count:  # nothing to copy, nothing to keep
        return numpy.empty(data.shape, dtype=data.dtype)
    nbytes = count * data.dtype.itemsize
    # A miss of CuPy's pinned pool calls cudaHostAlloc, which a global-mode capture forbids
    # on every thread: this thread's mode is relaxed around it, as for the pool's growth.
    with _runtime.relaxed_capture_mode():
        memory = cupy.cuda.alloc_pinned_memory(nbytes)
    host = numpy.frombuffer(memory, dtype=data.dtype, count=count).reshape(data.shape)
    host[...] = data
    capture.keepalive.append(memory)
    return host


def device_constant(capture: Capture, host: numpy.ndarray) -> cupy.ndarray:
    """A device array holding ``host``'s values at every replay: ``host`` copied now into
    pinned memory the graph keeps, and a captured copy from there on the current stream. A
    pinned ``host`` from before the capture is copied from its own memory (read at replay)."""
    host = numpy.ascontiguousarray(host)
    out = cupy.empty(host.shape, dtype=host.dtype)
    if host.size:  # an empty constant copies nothing
        if not _is_pinned(host):
            host = pinned_constant(capture, host)
        # Not ``out.set``: CuPy refuses every host-to-device copy during a capture, pinned
        # or not; from pinned memory the runtime captures it as a memcpy node.
        _runtime.copy_host_to_device(out.data.ptr, host.ctypes.data, host.nbytes,
                                     cupy.cuda.get_current_stream().ptr)
    return out


def stage_host_arrays() -> None:
    """Let ``cupy.asarray`` and ``cupy.array`` of host data stage it during a capture (they
    copy it synchronously otherwise, which capture refuses); idempotent."""
    for name in ("asarray", "array"):
        original = getattr(cupy, name)
        if not hasattr(original, "__cugraphrt_original__"):
            setattr(cupy, name, _staging(original, name))


def _staging(original, name: str):
    @functools.wraps(original)
    def staging(obj, dtype=None, *args, **kwargs):
        capture = _capture.current_capture()
        if capture is None or args or kwargs or not _host_data(obj):
            return original(obj, dtype, *args, **kwargs)
        host = numpy.asarray(obj, dtype=dtype)
        if isinstance(obj, numpy.ndarray) and not _is_pinned(obj):
            _warn_once(capture, name, host)
        return device_constant(capture, host)

    cast(Any, staging).__cugraphrt_original__ = original
    return staging


def _host_data(obj: Any) -> bool:
    if isinstance(obj, numpy.ndarray):
        return obj.dtype.kind in "biufc"
    if isinstance(obj, (list, tuple)):
        return all(_host_data(item) or isinstance(item, _HOST_SCALARS) for item in obj)
    return isinstance(obj, _HOST_SCALARS)


def _is_pinned(array: numpy.ndarray) -> bool:
    """Whether ``array``'s memory is page-locked (cupyx.empty_pinned, alloc_pinned_memory)."""
    return bool(array.size) and _runtime.is_pinned_host(array.ctypes.data)


#: Kept by a capture that warned about a NumPy array (once per capture).
_WARNED = object()


def _warn_once(capture: Capture, name: str, host: numpy.ndarray) -> None:
    if any(item is _WARNED for item in capture.keepalive):  # identity: items may be tensors
        return
    capture.keepalive.append(_WARNED)
    warnings.warn(
        f"cupy.{name}() of a NumPy array ({host.dtype}, shape {host.shape}) during a capture: "
        f"its values were copied now, and every replay copies these (the graph does not see "
        f"later changes to the array); copy changing host data into a device buffer before "
        f"replaying, or pass a pinned array (cupyx.empty_pinned) to read it at replay",
        UserWarning, stacklevel=3)
