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
