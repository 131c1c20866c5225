"""Reading an overwritten output on a GPU: graph_module, make_graphed_callables, compile
pieces with copy_outputs=False, and CuPy's checked mode (docs/reliability.md)."""

from __future__ import annotations

import copy

import pytest

torch = pytest.importorskip("torch")

import cugraphrt_torch  # noqa: E402
from cugraphrt_torch.capture import _output_check  # noqa: E402

from cugraphrt import OverwrittenOutputError, make_graphed  # noqa: E402
from tests.conftest import torch_gpu_marks  # noqa: E402

pytestmark = torch_gpu_marks(torch)

nn = torch.nn


@pytest.fixture(autouse=True)
def _default_check(monkeypatch):
    monkeypatch.delenv("CUGRAPHRT_CHECK_OUTPUTS", raising=False)


def randn(*shape):
    return torch.randn(*shape, device="cuda")


def stale(what: str, fix: str = r"\.clone\(\) an output you keep before calling again") -> str:
    return rf"this tensor is {what}.*overwritten its memory.*{fix}"


def test_cuda_builds_mark_whole_storages():
    assert _output_check.available() == "storage"


def test_graph_module_read_after_overwrite_raises_naming_the_call(exact_math):
    model = nn.Linear(16, 16).cuda().eval()
    graphed = cugraphrt_torch.graph_module(model, randn(4, 16))
    x1, x2 = randn(4, 16), randn(4, 16)
    y1 = graphed(x1)
    kept, row = y1.clone(), y1[1]
    y2 = graphed(x2)
    message = stale(r"output of call #1 of graph_module\(Linear\)", r".*copy_outputs=True")
    with pytest.raises(RuntimeError, match=message):
        y1.sum()
    with pytest.raises(RuntimeError, match=message):
        row + 1  # a view of it too
    with pytest.raises(RuntimeError, match=message):
        y1.cpu()
    assert y1.shape == (4, 16)  # metadata stays readable
    with torch.no_grad():
        torch.testing.assert_close(y2, model(x2))
        torch.testing.assert_close(kept, model(x1))  # cloned before the second call
    x = x1
    for _ in range(3):  # x = f(x): each output is read (copied in) before it is overwritten
        x = graphed(x)
    with torch.no_grad():
        torch.testing.assert_close(x, model(model(model(x1))))


def test_graph_module_copy_outputs_and_check_off_never_raise(exact_math):
    model = nn.Linear(8, 8).cuda().eval()
    copying = cugraphrt_torch.graph_module(model, randn(2, 8), copy_outputs=True)
    x1, x2 = randn(2, 8), randn(2, 8)
    a, b = copying(x1), copying(x2)
    with torch.no_grad():
        torch.testing.assert_close(a, model(x1))
        torch.testing.assert_close(b, model(x2))
    unchecked = cugraphrt_torch.graph_module(model, randn(2, 8), check_outputs=False)
    first = unchecked(x1)
    unchecked(x2)
    assert first is unchecked.static_outputs
    with torch.no_grad():
        torch.testing.assert_close(first, model(x2))  # overwritten, silently: the old way


def test_graph_module_buckets_mark_outputs_of_the_same_bucket(exact_math):
    model = nn.Linear(8, 4).cuda().eval()
    graphed = cugraphrt_torch.graph_module(model, randn(8, 8), buckets=[4, 8])
    y1 = graphed(randn(3, 8))
    y2 = graphed(randn(4, 8))  # the same bucket: its replay rewrites y1's rows
    with pytest.raises(RuntimeError,
                       match=stale(r"output of call #1 of graph_module\(Linear, buckets\)")):
        y1.sum()
    assert y2.shape == (4, 4)


def test_make_graphed_callables_forward_outputs_raise_and_training_stays_right(exact_math):
    torch.manual_seed(0)
    control = nn.Linear(8, 8).cuda()
    model = cugraphrt_torch.make_graphed_callables(copy.deepcopy(control), (randn(4, 8),))
    x1, x2 = randn(4, 8), randn(4, 8)
    y1 = model(x1)
    kept = y1.detach().clone()
    y2 = model(x2)
    with pytest.raises(RuntimeError, match=stale(r"output of call #1 of graphed callable "
                                                 r"Linear")):
        y1.sum()
    y2.square().sum().backward()
    control(x2).square().sum().backward()
    torch.testing.assert_close(y2, control(x2))
    torch.testing.assert_close(kept, control(x1))
    for p, pc in zip(model.parameters(), control.parameters(), strict=True):
        torch.testing.assert_close(p.grad, pc.grad)


def test_compile_pieces_without_copies_raise_and_with_copies_do_not():
    def f(x):
        return torch.sin(x) * 2

    torch._dynamo.reset()
    try:
        compiled = torch.compile(f, backend="cugraphrt",
                                 options={"compiler": "aot_eager", "copy_outputs": False})
        compiled(randn(32))  # warm-up call: eager
        x1, x2 = randn(32), randn(32)
        y1 = compiled(x1)  # captured and replayed
        kept = y1.clone()
        y2 = compiled(x2)
        with pytest.raises(RuntimeError, match=stale(
                r"output 0 of call #1 of torch.compile piece 'graph \d+ inference'",
                r".*copy_outputs option on")):
            y1.sum()
        torch.testing.assert_close(y2, f(x2))
        torch.testing.assert_close(kept, f(x1))
        torch._dynamo.reset()
        copying = torch.compile(f, backend="cugraphrt", options={"compiler": "aot_eager"})
        outs = [copying(x) for x in (x1, x2, x1, x2)]
        torch.testing.assert_close(outs[0], f(x1))
        torch.testing.assert_close(outs[1], f(x2))
    finally:
        torch._dynamo.reset()


def test_cupy_checked_mode_refuses_a_replay_over_a_referenced_output():
    import cupy

    def step(a):
        return cupy.tanh(a) * 2

    x1, x2 = (cupy.random.standard_normal((64,), dtype=cupy.float32) for _ in range(2))
    fn = make_graphed(step, (cupy.random.standard_normal((64,), dtype=cupy.float32),),
                      check_outputs=True)
    y1 = fn(x1)
    kept = y1.copy()
    with pytest.raises(OverwrittenOutputError,
                       match=r"output of call #1 of make_graphed\(step\) is still referenced"):
        fn(x2)
    del y1
    y2 = fn(x2)
    cupy.testing.assert_allclose(y2, step(x2), rtol=1e-6)
    cupy.testing.assert_allclose(kept, step(x1), rtol=1e-6)
    tail = y2[32:]
    del y2
    with pytest.raises(OverwrittenOutputError, match="call #2"):
        fn(x1)  # a view holds the output's memory too
    del tail
    x = fn(x1)
    x = fn(x)  # an argument of the call itself is copied in first: allowed
    cupy.testing.assert_allclose(x, step(step(x1)), rtol=1e-5)
    plain = make_graphed(step, (x1,))  # the default: unchecked
    a = plain(x1)
    plain(x2)
    assert a is plain.static_outputs
