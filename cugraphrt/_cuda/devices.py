"""Devices: which device a pool, a graph or a capture belongs to, and per-device statistics.

Every pool allocates on one device, every graph is captured on one device, and nothing crosses
devices: a capture on device B refuses a pool of device A (``CaptureError``), and a graph
replays on its own device whatever device is current (see :meth:`cugraphrt.Graph.replay`).
This module validates device indices and streams; the device switch itself is
:class:`cugraphrt._memory.backing._on_device`, and the per-device pool statistics are
:mod:`cugraphrt._memory.pool_summary`.
"""

from __future__ import annotations

import cupy

from cugraphrt._cuda import runtime as _cuda
from cugraphrt.errors import OptionsError, ReplayError

_current_stream = cupy.cuda.get_current_stream

__all__ = ["resolve_device", "stream_device", "stream_ptr", "check_capture_stream",
           "check_replay_stream"]


def resolve_device(device: object, field: str = "device") -> int:
    """The device index ``device`` names: the current device for None.

    Parameters
    ----------
    device : int or None
        A device index, ``0 <= device < device count``.
    field : str
        The option's name, for the error message.

    Returns
    -------
    int

    Raises
    ------
    OptionsError
        For anything but None or an int in range.
    """
    if device is None:
        return _cuda.current_device()
    # bool is an int subclass, and True would silently mean device 1.
    index = getattr(device, "__index__", None)
    if isinstance(device, bool) or index is None:
        raise OptionsError(field, device, "a device index (int) or None for the current device")
    value = int(index())
    count = _cuda.device_count()
    if not 0 <= value < count:
        raise OptionsError(field, device, f"a device index from 0 to {count - 1} (this process "
                                          f"sees {count} device(s); CUDA_VISIBLE_DEVICES "
                                          f"renumbers them from 0)")
    return value


def stream_device(stream: object) -> int:
    """The device a stream object was made on; -1 when it does not say.

    CuPy streams carry ``device_id`` (-1 for the null and per-thread streams, which follow
    the current device), torch streams ``device_index``; int handles say nothing.
    """
    owner = getattr(stream, "device_index", None)  # torch.cuda.Stream
    if owner is None:
        owner = getattr(stream, "device_id", -1)  # cupy.cuda.Stream
    return int(owner) if isinstance(owner, int) else -1


def stream_ptr(stream, device: int = -1) -> int:
    """The handle of ``stream`` (CuPy's current stream of ``device`` for None).

    A CuPy stream made on another device than ``device`` (>= 0) raises ReplayError; the
    null and per-thread streams (``device_id`` -1) follow the current device, and int
    handles are taken as given.
    """
    if stream is None:
        return _current_stream(device).ptr
    if isinstance(stream, int):
        return stream
    try:
        ptr = stream.ptr
    except AttributeError:
        raise OptionsError("stream", stream, "a cupy.cuda.Stream (anything with .ptr), an "
                           "int handle, or None for the current stream") from None
    if device >= 0:
        check_replay_stream(stream, device)
    return ptr


def check_replay_stream(stream: object, device: int) -> None:
    """Refuse a replay stream (CuPy or torch) made on another device than the graph's.

    Raises
    ------
    ReplayError
        Naming both devices.
    """
    owner = stream_device(stream)
    if owner >= 0 and owner != device:
        raise ReplayError(
            f"the replay stream belongs to device {owner} (got a graph captured on device "
            f"{device}); replay on a stream of device {device}, or capture the work again "
            f"on device {owner}")


def check_capture_stream(stream: object, device: int) -> None:
    """Refuse a capture stream made on another device than the current one.

    Raises
    ------
    OptionsError
        Naming both devices: work issued under the current device would not reach the
        stream, and the graph would come out empty or wrong.
    """
    owner = stream_device(stream)
    if owner >= 0 and owner != device:
        raise OptionsError(
            "stream", stream,
            f"a stream of the current device {device} (got a stream of device {owner}); "
            f"capture under `with cupy.cuda.Device({owner}):` (torch: torch.cuda.device("
            f"{owner})), or pass a stream of device {device}")
