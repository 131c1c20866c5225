"""``cugraphrt_torch.distributed``: torch.distributed (NCCL) collectives inside captures: the
capture checks, the capture stream, releasing graphs before a process group shuts down, the
collective timeout (defined in ``groups``). Built on :mod:`..capture`."""

from .groups import (
    capture_stream,
    check_capture,
    collective_timeout,
    nccl_version,
    release_graphs,
    set_collective_timeout,
)

__all__ = ["check_capture", "capture_stream", "nccl_version", "release_graphs",
           "collective_timeout", "set_collective_timeout"]
