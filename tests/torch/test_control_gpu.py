"""cugraphrt_torch.while_loop / cond inside cugraphrt_torch.graph: equal to eager runs."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

import cugraphrt_torch  # noqa: E402
import cupy  # noqa: E402
from cugraphrt_torch.capture import _alloc  # noqa: E402

import cugraphrt  # noqa: E402
import cugraphrt.random as crandom  # noqa: E402
from cugraphrt import CaptureError  # noqa: E402
from tests.conftest import torch_gpu_marks  # noqa: E402

pytestmark = torch_gpu_marks(torch)


def _in_cugraphrt_pool(tensor) -> bool:
    address = tensor.data_ptr()
    return any(ptr <= address < ptr + memory.mem.size for ptr, memory in
               list(_alloc._live.items()))


def _newton_sqrt(x, y, tol):
    """Newton iterations for sqrt(x) until every |y*y - x| <= tol: data-dependent count."""
    def cond_fn():
        return ((y * y - x).abs() > tol).any()

    def body_fn():
        y.copy_(0.5 * (y + x / y))

    return cond_fn, body_fn


def test_while_loop_equals_eager_and_replays_new_inputs(exact_math):
    x = torch.rand(512, device="cuda", dtype=torch.float64) * 100 + 1
    y = torch.ones_like(x)
    cond_fn, body_fn = _newton_sqrt(x, y, 1e-9)
    cond_fn(), body_fn()  # warm up
    g = cugraphrt.Graph()
    with cugraphrt_torch.graph(g):
        count = cugraphrt_torch.while_loop(cond_fn, body_fn)
    counts = set()
    for scale in (1e2, 1e6, 1.0):
        start = torch.rand(512, device="cuda", dtype=torch.float64) * scale + 1
        x.copy_(start)
        y.fill_(1.0)
        g.replay()
        torch.cuda.synchronize()
        graphed, graphed_count = y.clone(), int(count)
        x.copy_(start)
        y.fill_(1.0)
        eager_count = cugraphrt_torch.while_loop(*_newton_sqrt(x, y, 1e-9))
        assert graphed_count == int(eager_count)
        torch.testing.assert_close(graphed, y, rtol=0, atol=0)
        counts.add(graphed_count)
    assert len(counts) == 3, counts


def test_a_compiled_body_runs_its_compiled_code_in_the_loop_and_after(exact_math):
    calls = {"compiled": 0}

    def backend(gm, example_inputs):
        def run(*args):
            calls["compiled"] += 1
            return gm(*args)
        return run

    x = torch.rand(512, device="cuda", dtype=torch.float64) * 100 + 1
    y = torch.ones_like(x)
    cond_fn, body_fn = _newton_sqrt(x, y, 1e-9)
    torch._dynamo.reset()
    compiled_body = torch.compile(body_fn, backend=backend)
    cond_fn(), compiled_body()  # warm up (and compile)
    y.fill_(1.0)
    g = cugraphrt.Graph()
    with cugraphrt_torch.graph(g):
        count = cugraphrt_torch.while_loop(cond_fn, compiled_body)
    assert calls["compiled"] == 2, "the body's capture ran the compiled code"
    g.replay()
    torch.cuda.synchronize()
    graphed, graphed_count = y.clone(), int(count)
    y.fill_(1.0)
    eager_count = cugraphrt_torch.while_loop(cond_fn, compiled_body)  # eager loop
    assert int(eager_count) == graphed_count and calls["compiled"] == 2 + graphed_count
    torch.testing.assert_close(graphed, y, rtol=0, atol=0)
    torch._dynamo.reset()


def test_body_allocations_and_matmul_use_the_graph_pool(exact_math):
    w = torch.randn(64, 64, device="cuda") / 8
    h = torch.randn(16, 64, device="cuda")
    steps = torch.zeros((), dtype=torch.int32, device="cuda")
    kept = []

    def body():
        z = torch.tanh(h @ w)  # torch cuBLAS and a temporary, in the body
        kept.append(z)
        h.copy_(z)
        steps.add_(1)

    start = h.clone()
    body()  # warm up
    kept.clear()
    h.copy_(start)
    steps.zero_()
    g = cugraphrt.Graph()
    with cugraphrt_torch.graph(g):
        cugraphrt_torch.while_loop(lambda: steps < 4, body)
    assert _in_cugraphrt_pool(kept[0])
    steps.zero_()
    g.replay()
    torch.cuda.synchronize()
    graphed = h.clone()
    h.copy_(start)
    steps.zero_()
    for _ in range(4):
        h.copy_(torch.tanh(h @ w))
    torch.testing.assert_close(graphed, h)


def test_nested_loop_with_a_branch_equals_eager():
    n = torch.zeros((), dtype=torch.int64, device="cuda")
    acc = torch.zeros((), dtype=torch.int64, device="cuda")

    def program():
        i = torch.zeros((), dtype=torch.int64, device="cuda")

        def outer():
            j = torch.zeros((), dtype=torch.int64, device="cuda")

            def inner():
                acc.add_(i * j + 1)
                j.add_(1)

            cugraphrt_torch.while_loop(lambda: j <= i, inner)
            cugraphrt_torch.cond(i % 3 == 0, lambda: acc.mul_(2), lambda: acc.sub_(1))
            i.add_(1)

        return cugraphrt_torch.while_loop(lambda: i < n, outer)

    g = cugraphrt.Graph()
    with cugraphrt_torch.graph(g):
        count = program()
    for size in (4, 7, 0):
        n.fill_(size)
        acc.zero_()
        g.replay()
        torch.cuda.synchronize()
        graphed = (int(acc), int(count))
        acc.zero_()
        eager_count = program()
        assert graphed == (int(acc), int(eager_count)), size
        assert graphed[1] == size


def test_torch_rng_fresh_per_replay_in_a_branch_refused_in_a_loop():
    out = torch.zeros(1000, device="cuda")
    on = torch.ones((), dtype=torch.bool, device="cuda")
    g = cugraphrt.Graph()
    with cugraphrt_torch.graph(g):
        cugraphrt_torch.cond(on, lambda: out.copy_(torch.rand(1000, device="cuda")))
    draws = []
    for _ in range(2):
        g.replay()
        torch.cuda.synchronize()
        draws.append(out.clone())
    assert not torch.equal(draws[0], draws[1])
    assert 0.4 < float(draws[0].mean()) < 0.6  # uniform numbers, not zeros
    k = torch.zeros((), dtype=torch.int32, device="cuda")
    with pytest.raises(CaptureError, match="same numbers on every iteration"):
        with cugraphrt_torch.graph(cugraphrt.Graph()):
            cugraphrt_torch.while_loop(lambda: k < 3, lambda: out.copy_(torch.rand_like(out)))


def test_cugraphrt_random_in_a_torch_loop_is_fresh_per_iteration():
    gen = crandom.Generator(1234)
    rows = 5
    out = torch.zeros(rows, 8, device="cuda")
    i = torch.zeros((), dtype=torch.int64, device="cuda")
    index = torch.arange(rows, device="cuda")[:, None]

    def body():
        draw = cugraphrt_torch.from_cupy(gen.rand(8, dtype=cupy.float32))
        out.copy_(torch.where(index == i, draw[None, :], out))
        i.add_(1)

    g = cugraphrt.Graph()
    with cugraphrt_torch.graph(g):
        cugraphrt_torch.while_loop(lambda: i < rows, body)
    seen = []
    for _ in range(2):
        i.zero_()
        g.replay()
        torch.cuda.synchronize()
        seen.extend(row.cpu().numpy().tobytes() for row in out)
    assert len(set(seen)) == 2 * rows


def test_host_read_in_a_torch_body_is_a_capture_error():
    k = torch.zeros((), dtype=torch.int32, device="cuda")
    g = cugraphrt.Graph()
    with pytest.raises(CaptureError, match=r"cugraphrt_torch\.while_loop"):
        with cugraphrt_torch.graph(g):
            cugraphrt_torch.while_loop(lambda: k < 3, lambda: k.add_(int(k.item() > 0)))
    assert not g.is_captured
    with cugraphrt_torch.graph(g):  # torch's capture state was unwound
        cugraphrt_torch.while_loop(lambda: k < 3, lambda: k.add_(1))
    k.zero_()
    g.replay()
    torch.cuda.synchronize()
    assert int(k) == 3


def test_predicates_and_foreign_captures_are_refused():
    x = torch.ones(4, device="cuda")
    with pytest.raises(CaptureError, match="0-d bool or integer CUDA tensor"):
        with cugraphrt_torch.graph(cugraphrt.Graph()):
            cugraphrt_torch.while_loop(lambda: x > 0, lambda: x.add_(1))
    with pytest.raises(CaptureError, match="0-d bool or integer CUDA tensor"):
        cugraphrt_torch.cond(torch.tensor(True), lambda: x.add_(1))  # a CPU tensor, eagerly
    with pytest.raises(CaptureError, match=r"inside cugraphrt\.graph\(\)"):
        with cugraphrt.graph(cugraphrt.Graph()):
            cugraphrt_torch.while_loop(lambda: x.sum() < 0, lambda: x.add_(1))
    torch_graph = torch.cuda.CUDAGraph()
    with pytest.raises(CaptureError, match="did not begin"):
        with torch.cuda.graph(torch_graph):
            cugraphrt_torch.while_loop(lambda: x.sum() < 0, lambda: x.add_(1))
