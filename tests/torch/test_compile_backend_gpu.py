"""torch.compile(backend="cugraphrt") on a GPU, against eager runs of the same code."""

from __future__ import annotations

import copy
import warnings

import pytest

from ._compile_reports import CompileReports

torch = pytest.importorskip("torch")

pytestmark = pytest.mark.gpu


_reports = CompileReports()


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    yield from _reports.around_test()


class Decoder(torch.nn.Module):
    """A KV-cache-like step: in-place writes into a static cache and a counter."""

    def __init__(self, width=64, steps=16):
        super().__init__()
        self.proj = torch.nn.Linear(width, width)
        self.register_buffer("cache", torch.zeros(steps, width))
        self.register_buffer("position", torch.zeros((), dtype=torch.long))

    def forward(self, x):
        row = torch.tanh(self.proj(x))
        self.cache.index_copy_(0, self.position.view(1), row.view(1, -1))
        self.position.add_(1)
        return self.cache.sum(0) * 0.5 + row


@pytest.mark.parametrize("compiler", ["inductor", "aot_eager"])
def test_mutated_static_buffers_are_replayed(compiler, exact_math):
    model = Decoder().cuda()
    control = copy.deepcopy(model)
    # By name, through the entry point: no import of the backend.
    compiled = torch.compile(model, backend="cugraphrt", options={"compiler": compiler})
    with torch.no_grad():
        for _ in range(10):
            x = torch.randn(64, device="cuda")
            torch.testing.assert_close(compiled(x), control(x), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(model.cache, control.cache, rtol=1e-5, atol=1e-5)
    assert int(model.position) == 10
    (report,) = _reports()
    assert report.graphed and report.graphs == 1 and report.replays == 9  # 1 warm-up call
    assert report.compiler == compiler
    assert any("cache" in name for name in report.mutated_inputs)
    assert any("cache" in name for name in report.static_inputs)


def test_mutation_of_a_copied_input_is_written_back():
    def accumulate(total, x):
        total.add_(x * 2)
        return total.sum()

    compiled = torch.compile(accumulate, backend="cugraphrt",
                             options={"compiler": "aot_eager"})
    total, expected = torch.zeros(8, device="cuda"), torch.zeros(8, device="cuda")
    for _ in range(5):
        x = torch.randn(8, device="cuda")
        got = compiled(total, x)
        want = accumulate(expected, x)
        torch.testing.assert_close(got, want)
        torch.testing.assert_close(total, expected)
    (report,) = _reports()
    assert report.graphed and report.replays == 4
    assert report.mutated_inputs == report.copied_inputs[:1] and len(report.copied_inputs) == 2


def test_graph_breaks_split_the_program_into_graphed_pieces(capsys):
    layer = torch.nn.Linear(32, 32).cuda()
    means = []

    def step(x):
        y = torch.relu(layer(x))
        print("between pieces")           # a graph break
        means.append(y.mean().item())     # a host sync: another break
        return layer(y) * 2

    compiled = torch.compile(step, backend="cugraphrt", options={"compiler": "aot_eager"})
    with torch.no_grad():
        for _ in range(4):
            x = torch.randn(16, 32, device="cuda")
            torch.testing.assert_close(compiled(x), step(x), rtol=1e-4, atol=1e-4)
    assert capsys.readouterr().out.count("between pieces") == 8  # the print ran every call
    assert len(means) == 8
    reports = _reports()
    assert len(reports) >= 2 and sum(r.graphed for r in reports) >= 2
    assert all(r.replays == 3 for r in reports if r.graphed)


def test_a_moved_static_input_re_records_then_falls_back_with_a_warning():
    def scaled(weight, x):
        return x @ weight + 1

    weights = [torch.randn(16, 16, device="cuda") for _ in range(5)]
    for w in weights:
        torch._dynamo.mark_static_address(w, guard=False)  # one compiled graph for all
    compiled = torch.compile(scaled, backend="cugraphrt",
                             options={"compiler": "aot_eager", "max_rerecords": 2})
    x = torch.randn(4, 16, device="cuda")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for w in weights[:2]:              # warm-up, capture, then a move: re-record
            for _ in range(2):
                torch.testing.assert_close(compiled(w, x), scaled(w, x))
        (report,) = _reports()
        assert report.graphed and report.rerecords == 1
        for w in weights[2:]:              # the second re-record, then the limit
            torch.testing.assert_close(compiled(w, x), scaled(w, x))
    (report,) = _reports()
    assert not report.graphed and report.rerecords == 3
    assert "moved to another address" in report.reason
    messages = [str(w.message) for w in caught if "moved to another address" in str(w.message)]
    assert len(messages) == 1 and "'l_weight_'" in messages[0]
    torch.testing.assert_close(compiled(weights[0], x), scaled(weights[0], x))  # eager now


def test_strict_raises_where_the_default_falls_back():

    import cugraphrt

    def mixed(x):
        y = x * 2
        return (y.cpu() + 1).cuda()       # CPU work inside the traced region

    x = torch.randn(8, device="cuda")
    strict = torch.compile(mixed, backend="cugraphrt",
                           options={"compiler": "aot_eager", "strict": True})
    with pytest.raises(cugraphrt.CaptureError, match="cannot be captured.*on cpu"):
        strict(x)
    _reports.start()
    relaxed = torch.compile(mixed, backend="cugraphrt", options={"compiler": "aot_eager"})
    for _ in range(3):
        torch.testing.assert_close(relaxed(x), mixed(x))
    (report,) = _reports()
    assert not report.graphed and "cpu" in report.reason


def test_one_graph_per_shape_up_to_max_graphs():
    def f(x):
        return torch.nn.functional.gelu(x) * 3

    compiled = torch.compile(f, backend="cugraphrt", dynamic=True,
                             options={"compiler": "aot_eager", "max_graphs": 2})
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for n in (8, 16, 32, 8, 16, 32):
            for _ in range(2):
                x = torch.randn(n, device="cuda")
                torch.testing.assert_close(compiled(x), f(x))
    (report,) = _reports()
    assert report.graphed and report.graphs == 2
    assert sum("already holds 2 graphs" in str(w.message) for w in caught) == 1


@pytest.mark.parametrize("compiler", ["inductor", "aot_eager"])
def test_training_steps_match_eager(compiler, exact_math):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.GELU(),
                                torch.nn.Linear(64, 8)).cuda()
    control = copy.deepcopy(model)
    compiled = torch.compile(model, backend="cugraphrt", options={"compiler": compiler})
    opts = [torch.optim.SGD(m.parameters(), lr=0.05) for m in (model, control)]
    for _ in range(5):
        x, target = torch.randn(16, 32, device="cuda"), torch.randn(16, 8, device="cuda")
        for net, opt in zip((compiled, control), opts, strict=True):
            opt.zero_grad(set_to_none=True)
            loss = torch.nn.functional.mse_loss(net(x), target)
            loss.backward()
            opt.step()
    for p, pc in zip(model.parameters(), control.parameters(), strict=True):
        torch.testing.assert_close(p, pc, rtol=1e-4, atol=1e-5)
    reports = _reports()
    kinds = {r.name.split()[-1]: r for r in reports}
    assert kinds["forward"].graphed and kinds["backward"].graphed
    assert kinds["backward"].replays == 4
