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
``cugraphrt_torch.capture._host_constants``.
"""

from __future__ import annotations

import cupy
import numpy

from cugraphrt._capture.stream_capture import Capture
from cugraphrt._cuda import runtime as _runtime

__all__ = ["pinned_constant"]


def pinned_constant(capture: Capture, data: numpy.ndarray) -> numpy.ndarray:
    """A C-contiguous copy of ``data`` in pinned memory, alive as long as ``capture``'s graph
    (or until the capture rolls back)."""
    count = int(data.size)
    nbytes = max(count * data.dtype.itemsize, 1)
    # A miss of CuPy's pinned pool calls cudaHostAlloc, which a global-mode capture forbids
    # on every thread: this thread's mode is relaxed around it, as for the pool's growth.
    with _runtime.relaxed_capture_mode():
        memory = cupy.cuda.alloc_pinned_memory(nbytes)
    host = numpy.frombuffer(memory, dtype=data.dtype, count=count).reshape(data.shape)
    host[...] = data
    capture.keepalive.append(memory)
    return host
