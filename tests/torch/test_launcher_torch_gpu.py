"""Graph.launcher on a graph captured by cugraphrt_torch: refused, replay() still works."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

import cugraphrt_torch  # noqa: E402

import cugraphrt  # noqa: E402
from cugraphrt import ReplayError  # noqa: E402
from tests.conftest import torch_gpu_marks  # noqa: E402

pytestmark = torch_gpu_marks(torch)


def test_no_launcher_for_a_torch_captured_graph():
    x = torch.randn(4096, device="cuda")
    torch.sin(x)
    g = cugraphrt.Graph()
    with cugraphrt_torch.graph(g):
        y = torch.sin(x) * 2 + torch.rand_like(x)  # torch's RNG: replay() advances it
    with pytest.raises(ReplayError, match=r"captured by cugraphrt_torch.*call g.replay\(\)"):
        g.launcher()
    x.copy_(torch.randn(4096, device="cuda"))
    g.replay()
    torch.cuda.synchronize()
    noise = y - torch.sin(x) * 2
    assert 0 <= float(noise.min()) and float(noise.max()) < 1  # rand_like's range, fresh x
    g.reset()
