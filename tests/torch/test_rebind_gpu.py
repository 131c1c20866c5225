"""inputs="rebind" on torch modules: graph_module (one graph, and buckets) on the call's own
tensors equals eager torch, with no copy into the static inputs (docs/rebinding.md)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

import cugraphrt_torch  # noqa: E402

from cugraphrt.errors import OptionsError  # noqa: E402
from tests.conftest import torch_gpu_marks  # noqa: E402

pytestmark = torch_gpu_marks(torch)

nn = torch.nn


@pytest.fixture(autouse=True)
def _rebind_every_input(monkeypatch):
    """These inputs are small: rebind them anyway (by default, inputs under 1 MiB copy)."""
    monkeypatch.setenv("CUGRAPHRT_REBIND_MIN_BYTES", "0")


class _Block(nn.Module):
    """Linear (cuBLAS), LayerNorm, an embedding lookup by an index input, a reduction over an
    interior slice, and an in-place update of an input."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(32, 48)
        self.norm = nn.LayerNorm(48)
        self.emb = nn.Embedding(100, 48)

    def forward(self, x, ids, state):
        h = self.norm(torch.relu(self.lin(x))) + self.emb(ids)
        state.add_(1.0)  # in place on an input, as eager does it
        return h, x[:, 4:20].sum(dim=1), h.softmax(-1) * state[:1]


def _inputs(batch=8):
    return (torch.randn(batch, 32, device="cuda"),
            torch.randint(0, 100, (batch,), device="cuda"),
            torch.randn(4, 48, device="cuda"))


def test_graph_module_rebind_equals_eager_without_copies():
    torch.manual_seed(0)
    module = _Block().cuda().eval()
    sample = _inputs()
    graphed = cugraphrt_torch.graph_module(module, sample, inputs="rebind")
    plan = graphed.rebinding
    assert plan is not None and plan.complete
    assert all(n > 0 for n in plan.sites_per_input), plan.explain(["x", "ids", "state"])
    kept = [t.clone() for t in graphed.static_inputs]
    for _ in range(4):
        args = _inputs()
        eager_args = [t.clone() for t in args]
        with torch.no_grad():
            expected = module(*eager_args)
        got = graphed(*args)
        for g, e in zip(got, expected, strict=True):
            torch.testing.assert_close(g, e, rtol=0, atol=0)  # the same kernels: bit-equal
        torch.testing.assert_close(args[2], eager_args[2], rtol=0, atol=0)
    for static, before in zip(graphed.static_inputs, kept, strict=True):
        torch.testing.assert_close(static, before, rtol=0, atol=0)  # never copied into


def test_graph_module_rebind_buckets():
    torch.manual_seed(1)
    lin = nn.Linear(16, 8).cuda().eval()
    graphed = cugraphrt_torch.graph_module(lin, (torch.randn(32, 16, device="cuda"),),
                                           buckets=[8, 32], inputs="rebind")
    graphed.capture_all()
    for n in (32, 5, 8, 32, 1):
        x = torch.randn(n, 16, device="cuda")
        with torch.no_grad():
            expected = lin(x)
        torch.testing.assert_close(graphed(x), expected, rtol=1e-5, atol=1e-5)


def test_graph_module_rebind_refuses_a_bad_mode():
    lin = nn.Linear(4, 4).cuda()
    with pytest.raises(OptionsError, match="inputs"):
        cugraphrt_torch.graph_module(lin, (torch.randn(2, 4, device="cuda"),), inputs="view")


# -- inputs="rebind" keeps its meaning where it copies (issue 51) ---------------------------


class _Bump(nn.Module):
    """Reads x, updates state in place, returns a view of x (an output inside an input: the
    rebinding plan is incomplete and the call copies)."""

    def forward(self, x, state):
        state.add_(1.0)
        return x[1:], x.sum(0) + state


def test_graph_module_fallback_writes_back_what_the_forward_wrote():
    x, state = torch.randn(8, 4, device="cuda"), torch.randn(4, device="cuda")
    with pytest.warns(UserWarning, match="falls back to copying"):
        graphed = cugraphrt_torch.graph_module(_Bump(), (x, state), inputs="rebind")
    plan = graphed.rebinding
    assert not plan.complete and plan.written == [False, True]  # version counters
    for _ in range(3):
        a, s = torch.randn(8, 4, device="cuda"), torch.randn(4, device="cuda")
        ea, es = a.clone(), s.clone()
        with torch.no_grad():
            view, total = _Bump()(ea, es)
        got_view, got_total = graphed(a, s)
        torch.testing.assert_close(s, es, rtol=0, atol=0)  # landed in the caller's tensor
        torch.testing.assert_close(a, ea, rtol=0, atol=0)
        torch.testing.assert_close(got_total, total, rtol=0, atol=0)
        torch.testing.assert_close(got_view, view, rtol=0, atol=0)


def test_graph_module_strict_raises_where_it_would_fall_back():
    from cugraphrt.errors import CaptureError

    x, state = torch.randn(8, 4, device="cuda"), torch.randn(4, device="cuda")
    with pytest.raises(CaptureError, match="cannot rebind every input"):
        cugraphrt_torch.graph_module(_Bump(), (x, state), inputs="rebind", strict=True)


class _Scale(nn.Module):
    def forward(self, x):
        x.mul_(2.0)
        return x.sum(1)


@pytest.mark.parametrize("n", [5, 32, 8])
def test_graph_module_buckets_write_back_a_padded_call(n):
    graphed = cugraphrt_torch.graph_module(_Scale(), (torch.randn(32, 16, device="cuda"),),
                                           buckets=[8, 32], inputs="rebind")
    graphed.capture_all()
    for _ in range(2):
        x = torch.randn(n, 16, device="cuda")
        x0 = x.clone()
        torch.testing.assert_close(graphed(x), (x0 * 2).sum(1), rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(x, x0 * 2, rtol=0, atol=0)
