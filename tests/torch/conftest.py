"""Fixtures of the torch adapter tests."""

from __future__ import annotations

import pytest


@pytest.fixture
def exact_math():
    """TF32 off for the duration of a test, so graphed and eager results compare tightly."""
    torch = pytest.importorskip("torch")
    saved = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    yield
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved


@pytest.fixture
def capture_stream():
    """cugraphrt's capture stream as a torch stream (warm-ups run there, like captures)."""
    torch = pytest.importorskip("torch")
    from cugraphrt_torch.capture import _torch

    import cugraphrt

    stream = cugraphrt.default_capture_stream()
    return _torch.torch_stream_for(stream.ptr, torch.cuda.current_device())
