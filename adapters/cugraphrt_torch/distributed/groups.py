"""torch.distributed (NCCL) collectives inside cugraphrt_torch captures: the checks and helpers.

How torch's NCCL process group behaves under CUDA graph capture (torch 2.x, read from
``ProcessGroupNCCL.cpp``), and what follows for cugraphrt_torch:

* A collective issued while the current stream captures is recorded like any kernel: the
  process group makes its NCCL stream wait on the current stream, and ``work.wait()`` (or
  ``async_op=False``) makes the current stream wait on the NCCL stream: a fork and a join
  inside the capture. Replays rerun the collective on the same buffers.
* Captured collectives are *not* handed to torch's watchdog thread (it would query their
  events, which capture forbids), so a hang inside a replayed collective is not detected by
  ``TORCH_NCCL_ASYNC_ERROR_HANDLING``; torch's ``capture_begin`` waits for the watchdog's
  pending event queries first, which the adapter inherits because torch owns the capture.
* ``TORCH_NCCL_BLOCKING_WAIT=1`` (or a ``timeout`` passed to ``wait()``) makes ``wait()``
  poll the work's events from the host until it finishes: inside a capture that fails, so
  :func:`check_capture` refuses it; ``barrier()`` waits on the host too.
* The communicator is created on a group's first collective (unless
  ``init_process_group(device_id=...)`` created it eagerly): its set-up allocates and
  synchronizes, so every collective must run once eagerly before the capture, on every rank.
* Whether a collective is captured must be the same on every rank, and graphs holding
  collectives must be captured and replayed in the same order on every rank. The adapter
  records the collectives of each capture and compares them across ranks before the graph's
  first replay (``_collective_mode``), and releases such graphs before their process group
  shuts down (``_lifecycle``): NCCL will not destroy a communicator while they live.

See docs/distributed.md.
"""

from __future__ import annotations

from typing import Any

import torch

from cugraphrt.adapter import collectives as collective_log
from cugraphrt.distributed import (
    blocking_wait_variable,
    check_nccl_version,
    collective_timeout,
    set_collective_timeout,
)
from cugraphrt.errors import CaptureError, OptionsError

from .._internals import distributed as _distributed
from ..capture import _torch

__all__ = ["check_capture", "capture_stream", "nccl_version", "release_graphs",
           "collective_timeout", "set_collective_timeout"]


def nccl_version() -> int:
    """torch's NCCL version as an integer (2.27.7 is 22707).

    Raises
    ------
    OptionsError
        When this build of torch has no NCCL.
    """
    try:
        version = torch.cuda.nccl.version()
    except Exception as exc:  # a CPU build, or NCCL missing
        raise OptionsError("torch.cuda.nccl", "unavailable",
                           f"a CUDA build of torch with NCCL (got: {exc})") from exc
    if isinstance(version, tuple):
        major, minor, patch = (list(version) + [0, 0, 0])[:3]
        return major * 10000 + minor * 100 + patch
    return int(version)


def check_capture(group: Any = None) -> None:
    """Check that collectives of ``group`` can be captured now, on the current device.

    Call it once before capturing work that holds collectives (``cugraphrt_torch.graph``
    or ``make_graphed_callables``); it reads only host state and costs microseconds.

    Parameters
    ----------
    group : torch.distributed.ProcessGroup, optional
        The group the captured collectives use; the default group if omitted.

    Raises
    ------
    OptionsError
        When torch.distributed is not initialized, the group's backend is not NCCL, or the
        group is bound to another device than the current one.
    CaptureError
        When a blocking wait is configured (``TORCH_NCCL_BLOCKING_WAIT``,
        ``NCCL_BLOCKING_WAIT``) or torch's NCCL is older than 2.9.6.
    """
    dist = torch.distributed
    if not (dist.is_available() and dist.is_initialized()):
        raise OptionsError("torch.distributed", "not initialized",
                           "an initialized process group: torch.distributed."
                           "init_process_group('nccl') first (one process per GPU, e.g. "
                           "started with torchrun)")
    backend = str(dist.get_backend(group))
    if "nccl" not in backend.lower():
        raise OptionsError("backend", backend,
                           "the NCCL backend: collectives of other backends run on the host "
                           "and cannot be captured (init_process_group('nccl'), or a "
                           "'cuda:nccl' entry in a device-backend map)")
    variable = blocking_wait_variable()
    if variable is not None:
        raise CaptureError(
            f"{variable} is set (got {variable}=1): a collective's wait() would block the host "
            f"until it finishes, which capture forbids; unset it (the default, non-blocking "
            f"wait makes the stream wait instead) for processes that capture collectives")
    version = nccl_version()
    check_nccl_version(version)
    bound = _bound_device(group)
    current = torch.cuda.current_device()
    if bound is not None and bound != current:
        raise OptionsError("current device", current,
                           f"the process group's device {bound}: capture under "
                           f"torch.cuda.device({bound}) (one GPU per process: "
                           f"torch.cuda.set_device(local_rank) before init_process_group)")


def _bound_device(group: Any) -> int | None:
    """The device a process group was bound to (``init_process_group(device_id=...)``)."""
    pg = group if group is not None else _distributed.default_group()
    device = getattr(pg, "bound_device_id", None)
    if device is None:
        return None
    return device.index if isinstance(device, torch.device) else int(device)


def capture_stream() -> torch.cuda.Stream:
    """cugraphrt's capture stream of the current device, as a torch stream.

    Warm-ups belong on it (library handles and workspaces are per stream), and so does the
    construction of a ``DistributedDataParallel`` whose backward will be captured (DDP
    records the stream it was built on for its gradient buckets).
    """
    from cugraphrt import default_capture_stream

    _torch.require_cuda("cugraphrt_torch.distributed.capture_stream()")
    return _torch.torch_stream_for(default_capture_stream().ptr, torch.cuda.current_device())



def release_graphs(group: Any = None) -> int:
    """Reset the cugraphrt graphs that hold collectives of ``group`` (of any group if None).

    NCCL does not destroy a communicator while a graph that captured its operations is
    alive, so ``destroy_process_group()`` would wait for them forever. cugraphrt_torch calls
    this for each group as it shuts down (and for all of them at exit); call it yourself to
    free the graphs earlier. A released graph raises :class:`cugraphrt.ReplayError` if
    replayed. Graphs captured with torch's own ``torch.cuda.graph`` are not tracked: call
    their ``reset()`` before ``destroy_process_group()``.

    Parameters
    ----------
    group : torch.distributed.ProcessGroup, optional
        The group whose graphs go.

    Returns
    -------
    int
        How many graphs were reset.
    """
    names = None if group is None else [str(group.group_name)]
    return collective_log.release_graphs(names)
