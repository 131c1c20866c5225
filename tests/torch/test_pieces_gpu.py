"""graph_module(..., pieces=True): a module that reads a value on the host mid-forward cannot
be captured whole (the error says pieces=True), and is graphed in pieces around that
statement, equal to eager."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

import cugraphrt_torch  # noqa: E402

from cugraphrt import CaptureError, OptionsError  # noqa: E402
from tests.conftest import torch_gpu_marks  # noqa: E402

from ._pieces_models import HostRead  # noqa: E402

pytestmark = torch_gpu_marks(torch)


def test_a_forward_with_a_host_read_is_graphed_in_pieces_equal_to_eager():
    torch.manual_seed(0)
    model = HostRead().cuda().eval()
    x = torch.randn(4, 16, device="cuda")
    with pytest.raises(CaptureError, match=r"pieces=True"):
        cugraphrt_torch.graph_module(model, x)
    graphed = cugraphrt_torch.graph_module(model, x, pieces=True)
    assert isinstance(graphed, cugraphrt_torch.PiecewiseModule)
    for _ in range(3):
        fresh = torch.randn(4, 16, device="cuda")
        with torch.no_grad():
            expected = model(fresh)
        assert torch.equal(graphed(fresh), expected)  # eager's kernels: eager's bits
    reports = graphed.report()
    assert len(reports) >= 2 and all(r.graphed for r in reports), reports
    assert graphed.graphed_fraction() == 1.0 and "pieces graphed" in repr(graphed)


def test_pieces_refuses_options_it_does_not_take():
    model = HostRead().cuda().eval()
    x = torch.randn(4, 16, device="cuda")
    for kwargs in ({"pieces": 1}, {"pieces": True, "buckets": [4]},
                   {"pieces": True, "inputs": "rebind"}):
        with pytest.raises(OptionsError, match="pieces"):
            cugraphrt_torch.graph_module(model, x, **kwargs)
