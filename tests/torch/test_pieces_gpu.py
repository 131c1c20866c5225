"""graph_module(..., pieces=True): a module that reads a value on the host mid-forward cannot
be captured whole (the error says pieces=True), and is graphed in pieces around that
statement, equal to eager."""

from __future__ import annotations

import gc

import pytest

torch = pytest.importorskip("torch")

import cugraphrt_torch  # noqa: E402

from cugraphrt import CaptureError, OptionsError  # noqa: E402
from tests.conftest import torch_gpu_marks  # noqa: E402

from ._pieces_models import Broken, HostAnchors, HostRead  # noqa: E402

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


def test_cpu_work_on_the_modules_cpu_tensors_runs_eagerly_and_the_rest_is_graphed():
    """An SSD's default boxes: made on the CPU from tensors the module holds there, then
    copied to the device. Whole, the capture refuses the CPU inputs; in pieces, that work
    runs before the graph on every call, with the tensors' values of that call."""
    torch.manual_seed(0)
    model = HostAnchors().cuda().eval()
    x = torch.randn(4, 16, device="cuda")
    graphed = cugraphrt_torch.graph_module(model, x, pieces=True)
    (report,) = graphed.report()
    assert report.graphed and report.reason is None, report
    for step in range(3):
        if step == 2:
            model.wh_pairs[1][1, 0] = 0.05  # read at the next call, as eager reads it
        fresh = torch.randn(4, 16, device="cuda")
        with torch.no_grad():
            expected = model(fresh)
        assert torch.equal(graphed(fresh), expected)
    assert graphed.report()[0].replays >= 3


def test_pieces_refuses_options_it_does_not_take():
    model = HostRead().cuda().eval()
    x = torch.randn(4, 16, device="cuda")
    for kwargs in ({"pieces": 1}, {"pieces": True, "buckets": [4]},
                   {"pieces": True, "inputs": "rebind"}):
        with pytest.raises(OptionsError, match="pieces"):
            cugraphrt_torch.graph_module(model, x, **kwargs)


def test_two_modules_of_one_class_keep_their_own_graphed_pieces():
    """Dynamo keeps compilations per code object: sharing them, the second module re-recorded
    the first's pieces over its own parameters at every alternate call."""
    torch.manual_seed(0)
    models = [Broken().cuda().eval() for _ in range(2)]
    x = torch.randn(4, 16, device="cuda")
    graphed = [cugraphrt_torch.graph_module(m, x, pieces=True) for m in models]
    for _ in range(3):
        for model, pieces in zip(models, graphed, strict=True):
            fresh = torch.randn(4, 16, device="cuda")
            with torch.no_grad():
                assert torch.equal(pieces(fresh), model(fresh))
    for pieces in graphed:
        reports = pieces.report()
        assert len(reports) == 2 and all(r.graphed and r.rerecords == 0 for r in reports)


def test_dropping_the_module_releases_its_pieces_graphs():
    model = Broken().cuda().eval()
    x = torch.randn(4, 16, device="cuda")
    graphed = cugraphrt_torch.graph_module(model, x, pieces=True)
    own = list(graphed._pieces)
    assert own and all(p.report().graphs == 1 for p in own)
    del graphed
    gc.collect()
    assert all(p.report().graphs == 0 for p in own)  # dynamo still holds the code, not graphs
    assert not {p.name for p in own} & {r.name for r in cugraphrt_torch.compile_report()}


def test_a_detection_model_is_graphed_in_pieces_equal_to_eager():
    """Detection's non-maximum suppression makes sizes from data: whole, the capture refuses;
    in pieces, backbone, FPN and heads are graphed, and the boxes equal eager's bit for bit
    (aot_eager keeps eager's bilinear resize: traced as torch._decomp's pointwise ops it
    rounded otherwise, and other boxes came out)."""
    pytest.importorskip("torchvision")
    from cugraphrt.bench import zoo_models

    (entry,) = [m for m in zoo_models.torchvision_models()
                if m.name == "fasterrcnn_resnet50_fpn"]
    module, inputs = entry.build(torch)
    fresh = tuple(torch.rand_like(t) for t in inputs)
    with torch.no_grad():
        expected = zoo_models.flatten_outputs(torch, module(*fresh))
    with pytest.raises(CaptureError, match=r"pieces=True"):
        cugraphrt_torch.graph_module(module, inputs)
    graphed = cugraphrt_torch.graph_module(module, inputs, pieces=True)
    got = zoo_models.flatten_outputs(torch, graphed(*fresh))
    assert len(got) == len(expected) and len(expected) == 3  # boxes, labels, scores
    for a, b in zip(got, expected, strict=True):
        assert a.shape == b.shape and torch.equal(a, b)
    assert graphed.graphed_fraction() >= 0.5, graphed.report()
