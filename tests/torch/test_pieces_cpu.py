"""PiecewiseModule without a GPU: the module splits at its host read into pieces that the
compile backend reports (each running eagerly on the CPU, with the reason), and the calls
equal eager's."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from cugraphrt_torch.inference.pieces import PiecewiseModule  # noqa: E402

from ._pieces_models import HostRead  # noqa: E402


def test_the_module_splits_at_its_host_read_and_equals_eager():
    torch.manual_seed(0)
    model = HostRead().eval()
    pieces = PiecewiseModule(model, (torch.randn(4, 16),), num_warmup_iters=1)
    for _ in range(2):
        x = torch.randn(4, 16)
        with torch.no_grad():
            assert torch.equal(pieces(x), model(x))
    reports = pieces.report()
    assert len(reports) == 2 and all(r.compiler == "aot_eager" for r in reports)
    # On the CPU nothing is graphed, and each piece says why.
    assert not any(r.graphed for r in reports) and all("cpu" in r.reason for r in reports)
    assert pieces.graphed_fraction() == 0.0
    assert repr(pieces) == "<cugraphrt_torch.PiecewiseModule of HostRead: 0 of 2 pieces graphed>"


def test_modules_of_one_class_each_compile_and_report_their_own_pieces():
    """Dynamo keeps compilations per code object: without a forward of its own, the second
    PiecewiseModule of a class reused the first's pieces (re-recording them over its own
    parameters) and reported none, and past dynamo's recompile limit a module ran eagerly."""
    torch.manual_seed(0)
    modules = [HostRead().eval() for _ in range(10)]
    pieces = [PiecewiseModule(m, (torch.randn(4, 16),), num_warmup_iters=1) for m in modules]
    for model, piecewise in zip(modules, pieces, strict=True):
        x = torch.randn(4, 16)
        with torch.no_grad():
            assert torch.equal(piecewise(x), model(x))
        assert len(piecewise.report()) == 2


def test_a_module_with_a_hook_is_compiled_through_its_call():
    model = HostRead().eval()
    seen = []
    model.register_forward_hook(lambda module, args, out: seen.append(out.shape))
    pieces = PiecewiseModule(model, (torch.randn(4, 16),), num_warmup_iters=1)
    seen.clear()
    x = torch.randn(4, 16)
    with torch.no_grad():
        assert torch.equal(pieces(x), model(x))
    assert seen == [torch.Size([4, 16])] * 2  # the piecewise call and the eager one


def test_dropping_the_module_takes_its_pieces_out_of_the_report():
    import gc

    import cugraphrt_torch

    pieces = PiecewiseModule(HostRead().eval(), (torch.randn(4, 16),), num_warmup_iters=1)
    names = {r.name for r in pieces.report()}
    assert len(names) == 2 and names <= {r.name for r in cugraphrt_torch.compile_report()}
    del pieces
    gc.collect()
    assert not names & {r.name for r in cugraphrt_torch.compile_report()}
