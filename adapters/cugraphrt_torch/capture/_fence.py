"""Work on the capture stream, fenced on both sides: what every warm-up before a capture does.

Warm-ups run on the stream the capture will use, because cuBLAS and cuDNN create their
handles and workspaces per stream on first use, and one created inside the capture would be
carved from the graph's pool. The capture stream waits for the caller's stream first (the
warm-ups read what the caller wrote), and the caller's stream waits for the warm-ups after
(their memory is reused: by the capture, or by the caller's own work).

:func:`~.capture.warmed_graph` fences the warm-ups it runs from the capture's pool;
``make_graphed_callables`` fences its warm-ups with :func:`on_capture_stream` (a backward
runs on autograd's device thread, which a thread-keyed pool would not reach).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from . import _torch

__all__ = ["fenced", "on_capture_stream"]


@contextlib.contextmanager
def fenced(caller, stream) -> Iterator[None]:
    """``stream`` waits for ``caller`` before the block, ``caller`` for ``stream`` after it
    (torch streams; the block makes ``stream`` current itself)."""
    stream.wait_stream(caller)
    yield
    caller.wait_stream(stream)


@contextlib.contextmanager
def on_capture_stream(device: int) -> Iterator[None]:
    """Run the block with cugraphrt's capture stream of ``device`` current for torch and
    CuPy, fenced against torch's current stream on both sides."""
    import torch

    cupy_stream, side = _torch.stream_pair(None, device)
    with fenced(_torch.current_torch_stream(device), side), cupy_stream, torch.cuda.stream(side):
        yield
