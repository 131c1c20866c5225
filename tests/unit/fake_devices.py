"""Fake CUDA devices for the replay path: the CUDA calls under Graph replaced by recorders.

:class:`FakeDevices` installs (through pytest's ``monkeypatch``) a current device, CuPy's
current stream per device and a recording ``graphLaunch`` under the replay and launcher
paths, and makes captured-looking graphs with :meth:`FakeDevices.graph`. The fakes stand in
for C functions (CuPy's runtime, ``get_current_stream``) only: the Python code above them,
the device switch included, runs as it does on a GPU, so :func:`call_profile` counts the
Python frames a call really runs.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from cupy_backends.cuda.api import runtime

from cugraphrt._capture import graphs
from cugraphrt._capture import launcher as launcher_module
from cugraphrt._capture.graph_handles import GraphHandles
from cugraphrt._cuda import devices
from cugraphrt._cuda import runtime as _cuda
from cugraphrt._flags import FLAGS


class Stream:
    """A CuPy-like stream: ``ptr`` and ``device_id`` (-1 for the null stream), or a torch-like
    one with ``device_index``."""

    def __init__(self, ptr: int, device_id: int = -1, device_index: int | None = None):
        self.ptr = ptr
        self.device_id = device_id
        if device_index is not None:
            self.device_index = device_index

    def __repr__(self) -> str:
        return f"Stream(0x{self.ptr:x}, device {self.device_id})"


class FakeDevices:
    """``count`` devices, device 0 current; CuPy's current stream of device ``d`` is a
    non-null stream ``0x100 + d`` of device ``d``, or the null stream (``ptr`` 0,
    ``device_id`` -1) after :meth:`use_null_stream`.

    Attributes
    ----------
    current : int
        The current device.
    launches : list of (exec_handle, stream_ptr, current device)
        Every ``graphLaunch``, in order.
    device_queries : int
        ``cudaGetDevice`` calls.
    """

    def __init__(self, monkeypatch, count: int = 2) -> None:
        self.count = count
        self.current = 0
        self.null = False
        self.launches: list[tuple[int, int, int]] = []
        self.device_queries = 0
        self.streams = {d: Stream(0x100 + d, device_id=d) for d in range(count)}
        patch = monkeypatch.setattr
        patch(runtime, "getDevice", self.get_device)  # read by _cuda and _on_device
        patch(runtime, "setDevice", self.set_device)
        patch(_cuda, "get_device", self.get_device)  # bound at import
        patch(_cuda, "set_device", self.set_device)
        patch(graphs, "_get_device", self.get_device)  # bound at import
        patch(_cuda, "device_count", lambda: self.count)
        patch(graphs, "_launch", self.launch)
        patch(_cuda, "graph_launch", self.launch)  # what a launcher binds
        for module in (graphs, devices, launcher_module):
            patch(module, "_current_stream", self.current_stream)
        patch(FLAGS, "multi_device", False)
        patch(FLAGS, "plain", not FLAGS.pool_checks)
        graphs._note_devices()

    # The C functions faked; call_profile counts each call as one C call.
    def get_device(self) -> int:
        self.device_queries += 1
        return self.current

    def set_device(self, device: int) -> None:
        self.current = device

    def launch(self, exec_handle: int, ptr: int) -> None:
        if not isinstance(exec_handle, int):  # CuPy's graphLaunch takes intptr_t only
            raise TypeError(f"an integer is required (got {exec_handle!r})")
        self.launches.append((exec_handle, ptr, self.current))

    def current_stream(self, device: int = -1) -> Stream:
        # CuPy's get_current_stream() asks CUDA for the current device; given one, it does not.
        device = self.get_device() if device < 0 else device
        return Stream(0, -1) if self.null else self.streams[device]

    def use_null_stream(self) -> None:
        """CuPy's current stream becomes the null stream on every device."""
        self.null = True

    def graph(self, device: int = 0, exec_handle: int = 0xE0) -> graphs.Graph:
        """A Graph that looks captured on ``device`` with executable ``exec_handle``."""
        g = graphs.Graph()
        g._handles = _MadeUpHandles()
        g._captured, g._device, g._handles.exec = True, device, exec_handle
        g._refresh_exec()
        return g


class _MadeUpHandles(GraphHandles):
    """A fake graph's handles: its executable is made up, so releasing destroys nothing."""

    __slots__ = ()

    def release(self, why: str = "released") -> None:
        self.exec = 0
        super().release(why)


_C_NAMES = {"get_device": "cudaGetDevice", "set_device": "cudaSetDevice",
            "launch": "cudaGraphLaunch", "current_stream": "get_current_stream"}


@dataclass
class Profile:
    """What one call ran: its Python frames and the C functions called from Python code."""

    frames: list[str] = field(default_factory=list)
    c_calls: list[str] = field(default_factory=list)


def call_profile(fn: Callable[[], object]) -> Profile:
    """Run ``fn()`` under ``sys.setprofile``; the fakes above count as C calls.

    Frames are named by function (``Graph.replay``, ``stream_ptr``...), ``fn``'s own first
    if it is Python; C calls by the builtin's name (``isinstance``) or the CUDA call a fake
    stands for. Pass the callable itself (``g.replay``), not a lambda around it.
    """
    import sys

    profile = Profile()
    fake_codes = {getattr(FakeDevices, name).__code__: c for name, c in _C_NAMES.items()}
    inside_fake = 0

    def hook(frame, event, arg):
        nonlocal inside_fake
        if event == "call":
            code = frame.f_code
            if code in fake_codes:
                if not inside_fake:
                    profile.c_calls.append(fake_codes[code])
                inside_fake += 1
            elif not inside_fake:
                profile.frames.append(code.co_qualname)
        elif event == "return" and frame.f_code in fake_codes:
            inside_fake -= 1
        elif event == "c_call" and not inside_fake and arg is not sys.setprofile:
            profile.c_calls.append(arg.__name__)

    sys.setprofile(hook)
    try:
        fn()
    finally:
        sys.setprofile(None)
    return profile
