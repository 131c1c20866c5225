"""Operations capture forbids raise CaptureError naming them; the process stays usable."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

import cugraphrt_torch  # noqa: E402
import cupy  # noqa: E402

import cugraphrt  # noqa: E402
from cugraphrt import CaptureError  # noqa: E402
from tests.conftest import torch_gpu_marks  # noqa: E402

pytestmark = torch_gpu_marks(torch)


def _item(y):
    return y.sum().item()


def _cpu(y):
    return y.cpu()


def _nonzero(y):
    return (y > 0).nonzero()


def _print(y):
    print(y)


FORBIDDEN = [
    (_item, r"`return y\.sum\(\)\.item\(\)`.*copies a CUDA tensor to the host"),
    (_cpu, r"`return y\.cpu\(\)`.*copies a CUDA tensor to the host"),
    (_nonzero, r"`return \(y > 0\)\.nonzero\(\)`.*depends on the data"),
    (_print, r"`print\(y\)`.*prints a CUDA tensor"),
]


def _assert_capture_works_again(pool):
    """A capture into the same pool succeeds and replays correctly."""
    assert not torch.cuda.is_current_stream_capturing()
    assert not cugraphrt.is_current_stream_capturing()
    x = torch.randn(2048, device="cuda")
    g = cugraphrt.Graph()
    with cugraphrt_torch.graph(g, pool=pool):
        y = torch.exp(x) - 1
    x.copy_(torch.randn(2048, device="cuda"))
    g.replay()
    torch.cuda.synchronize()
    torch.testing.assert_close(y, torch.exp(x) - 1)


@pytest.mark.parametrize("operation, message", FORBIDDEN, ids=lambda v: getattr(v, "__name__", ""))
def test_forbidden_operation_raises_capture_error_and_rolls_back(operation, message):
    pool = cugraphrt.graph_pool_handle()
    x = torch.randn(1000, device="cuda")
    g = cugraphrt.Graph()
    with pytest.raises(CaptureError, match=message) as info:
        with cugraphrt_torch.graph(g, pool=pool):
            y = torch.sin(x)
            operation(y)
    assert isinstance(info.value.__cause__, RuntimeError)
    assert "rolled back" in str(info.value)
    assert not g.is_captured
    assert pool.stats().live_graphs == 0
    _assert_capture_works_again(pool)
    # The Graph that failed can capture too.
    with cugraphrt_torch.graph(g, pool=pool):
        z = x * 3
    g.replay()
    torch.cuda.synchronize()
    torch.testing.assert_close(z, x * 3)


def test_other_exceptions_pass_through_unchanged():
    pool = cugraphrt.graph_pool_handle()
    x = torch.randn(64, device="cuda")
    with pytest.raises(KeyError, match="not a capture problem"):
        with cugraphrt_torch.graph(cugraphrt.Graph(), pool=pool):
            x * 2
            raise KeyError("not a capture problem")
    _assert_capture_works_again(pool)


def test_unjoined_fork_is_reported_at_the_end():
    pool = cugraphrt.graph_pool_handle()
    side = torch.cuda.Stream()
    x = torch.randn(64, device="cuda")
    with pytest.raises(CaptureError, match="joined"):
        with cugraphrt_torch.graph(cugraphrt.Graph(), pool=pool):
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                x * 2  # never joined back to the capture stream
    _assert_capture_works_again(pool)


def test_cupy_sync_inside_a_torch_capture_is_a_capture_error():
    pool = cugraphrt.graph_pool_handle()
    x = torch.randn(64, device="cuda")
    with pytest.raises(CaptureError):
        with cugraphrt_torch.graph(cugraphrt.Graph(), pool=pool):
            cupy.asnumpy(cugraphrt_torch.to_cupy(x * 2))
    _assert_capture_works_again(pool)
