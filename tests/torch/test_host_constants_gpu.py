"""Host constants staged by the capture, on the GPU: forwards that make constants on the host
and copy them to the device are graphed whole and equal to eager; the constants survive every
reference the caller had, and their pinned memory goes back when the graph goes; a pinned
tensor from before the capture is read at replay, a pageable one is refused by name."""

from __future__ import annotations

import gc

import cupy
import pytest

torch = pytest.importorskip("torch")

import cugraphrt_torch  # noqa: E402

import cugraphrt  # noqa: E402
from cugraphrt import CaptureError  # noqa: E402
from tests.conftest import torch_gpu_marks  # noqa: E402

pytestmark = torch_gpu_marks(torch)


class Constants(torch.nn.Module):
    """Each kind of host constant of the breadth issue: a list (torchvision's image mean), a
    scalar (Bloom's mask value), a grid built on the host and moved (RAFT), an index list
    (Falcon)."""

    def __init__(self) -> None:
        super().__init__()
        self.mean = [0.1, 0.2, 0.3, 0.4]
        self.lin = torch.nn.Linear(4, 4)

    def forward(self, x):
        mean = torch.as_tensor(self.mean, dtype=x.dtype, device=x.device)
        floor = torch.tensor(-0.25, device=x.device)
        grid = torch.stack(torch.meshgrid(torch.arange(2), torch.arange(4), indexing="ij"))
        y = self.lin(x - mean)[..., [3, 0, 1, 2]]
        return torch.maximum(y, floor) + grid.float().to(x.device).sum(0)


def test_graph_module_graphs_a_forward_with_host_constants_whole():
    torch.manual_seed(0)
    model = Constants().cuda().eval()
    x = torch.randn(2, 4, device="cuda")
    graphed = cugraphrt_torch.graph_module(model, x)
    for _ in range(3):
        fresh = torch.randn(2, 4, device="cuda")
        with torch.no_grad():
            expected = model(fresh)
        torch.testing.assert_close(graphed(fresh), expected)


def test_the_option_stages_them_and_without_it_the_error_names_it():
    model = Constants().cuda().eval()
    x = torch.randn(2, 4, device="cuda")
    with torch.no_grad():
        model(x)  # warm-up
        with pytest.raises(CaptureError, match="stage_host_constants=True"):
            with cugraphrt_torch.graph(cugraphrt.Graph()):
                model(x)
        g = cugraphrt.Graph()
        with cugraphrt_torch.graph(g, stage_host_constants=True) as capture:
            y = model(x)
        assert capture._session is None  # the mode is gone with the capture
        x.copy_(torch.randn_like(x))
        g.replay()
        torch.cuda.synchronize()
        torch.testing.assert_close(y, model(x))


def test_staged_constants_outlive_the_callers_references_and_go_with_the_graph():
    pinned = cupy.get_default_pinned_memory_pool()
    pinned.free_all_blocks()
    x = torch.randn(3, device="cuda")

    def capture():
        values = [1.0, 2.0, 3.0]
        g = cugraphrt.Graph()
        with cugraphrt_torch.graph(g, stage_host_constants=True):
            y = x * torch.tensor(values, device="cuda") + torch.tensor(0.5, device="cuda")
        return g, y  # the list and the CPU tensors made from it are gone

    g, y = capture()
    gc.collect()
    in_use = pinned.n_free_blocks()
    for _ in range(2):
        x.copy_(torch.randn(3, device="cuda"))
        g.replay()
        torch.cuda.synchronize()
        expected = x * torch.tensor([1.0, 2.0, 3.0], device="cuda") + 0.5
        torch.testing.assert_close(y, expected)
    g.reset()
    del g, y
    gc.collect()
    assert pinned.n_free_blocks() >= in_use + 2  # both constants' pinned blocks came back


def test_a_pinned_tensor_from_before_is_read_at_replay_and_a_pageable_one_is_refused():
    x = torch.zeros(2, device="cuda")
    host = torch.tensor([1.0, 2.0]).pin_memory()
    g = cugraphrt.Graph()
    with cugraphrt_torch.graph(g, stage_host_constants=True):
        y = x + host.to("cuda")
    host.copy_(torch.tensor([5.0, 7.0]))
    g.replay()
    torch.cuda.synchronize()
    assert y.tolist() == [5.0, 7.0]
    pageable = torch.tensor([1.0, 2.0])
    with pytest.raises(CaptureError, match=r"pageable CPU tensor made before the capture "
                                           r"\(a torch.float32 tensor of shape \(2,\)\)"):
        with cugraphrt_torch.graph(cugraphrt.Graph(), stage_host_constants=True):
            x + pageable.to("cuda")

    class Old(torch.nn.Module):  # graph_module's retry refuses it by name too
        def forward(self, v):
            return v + pageable.to(v.device)

    with pytest.raises(CaptureError, match="made before the capture"):
        cugraphrt_torch.graph_module(Old(), x)
