"""make_graphed: plain CuPy functions as replayed graphs."""

from __future__ import annotations

import cupy
import numpy as np
import pytest

import cugraphrt
from cugraphrt import OptionsError, ReplayError, make_graphed
from cugraphrt.adapter import CupyFramework

pytestmark = pytest.mark.gpu


def mlp(x, w1, w2):
    return cupy.tanh(x @ w1) @ w2


def test_results_equal_eager_on_fresh_inputs(randn):
    x, w1, w2 = randn((32, 64)), randn((64, 128)), randn((128, 16))
    fn = make_graphed(mlp, (x, w1, w2))
    for _ in range(3):
        nx, n1, n2 = randn((32, 64)), randn((64, 128)), randn((128, 16))
        out = fn(nx, n1, n2)
        cupy.testing.assert_allclose(out, mlp(nx, n1, n2), rtol=1e-3, atol=1e-3)
    assert fn.graph.is_captured


def test_static_inputs_are_not_copied(randn, monkeypatch):
    x, w1, w2 = randn((8, 16)), randn((16, 32)), randn((32, 4))
    copies = []
    original = CupyFramework.copy

    def counting(static, value):
        copies.append(value.nbytes)
        original(static, value)

    # The call path binds the framework's copy when the callable is made.
    monkeypatch.setattr(CupyFramework, "copy", staticmethod(counting))
    fn = make_graphed(mlp, (x, w1, w2))
    fn(x, w1, w2)
    assert copies == []
    fn(x, w1, w2[...])  # a view of the very same memory: no copy either
    assert copies == []
    new_x = randn((8, 16))
    out = fn(new_x, w1, w2)
    assert copies == [new_x.nbytes]
    cupy.testing.assert_allclose(out, mlp(new_x, w1, w2), rtol=1e-3, atol=1e-3)
    strided = randn((8, 32))[:, ::2]  # not contiguous: copied with a kernel
    out = fn(strided, w1, w2)
    cupy.testing.assert_allclose(out, mlp(strided, w1, w2), rtol=1e-3, atol=1e-3)


def test_outputs_are_static_and_overwritten_unless_copied(randn):
    x = randn((100,))
    fn = make_graphed(lambda a: a * 2, (x,))
    first = fn(randn((100,)))
    snapshot = first.copy()
    second_input = randn((100,))
    second = fn(second_input)
    assert second is first  # the same static output, overwritten
    cupy.testing.assert_allclose(first, second_input * 2)
    assert not cupy.allclose(first, snapshot)
    copying = make_graphed(lambda a: a * 2, (x,), copy_outputs=True)
    a_input, b_input = randn((100,)), randn((100,))
    a, b = copying(a_input), copying(b_input)
    assert a is not b
    cupy.testing.assert_allclose(a, a_input * 2)
    cupy.testing.assert_allclose(b, b_input * 2)


def test_nested_inputs_and_outputs(randn):
    def fn(batch, params):
        h = batch["x"] @ params[0]
        return {"h": h, "pair": [h.sum(axis=1), batch["bias"] + 1]}

    batch = {"x": randn((4, 8)), "bias": randn((3,))}
    params = [randn((8, 5))]
    graphed = make_graphed(fn, (batch, params))
    nb = {"x": randn((4, 8)), "bias": randn((3,))}
    out = graphed(nb, params)
    eager = fn(nb, params)
    cupy.testing.assert_allclose(out["h"], eager["h"], rtol=1e-4, atol=1e-5)
    cupy.testing.assert_allclose(out["pair"][0], eager["pair"][0], rtol=1e-4, atol=1e-4)
    cupy.testing.assert_allclose(out["pair"][1], eager["pair"][1])
    with pytest.raises(ReplayError, match="structure"):
        graphed({"x": nb["x"]}, params)


def test_mismatched_arguments_name_the_argument(randn):
    x, w = randn((4, 8)), randn((8, 2))
    fn = make_graphed(lambda a, b: a @ b, (x, w))
    with pytest.raises(ReplayError, match=r"args\[0\].*expected shape \(4, 8\) float32.*"
                                          r"got shape \(5, 8\) float32"):
        fn(randn((5, 8)), w)
    with pytest.raises(ReplayError, match=r"args\[1\].*float32.*got shape \(8, 2\) float64"):
        fn(x, randn((8, 2), np.float64))
    with pytest.raises(ReplayError, match=r"args\[0\].*got numpy.ndarray"):
        fn(np.zeros((4, 8), np.float32), w)
    with pytest.raises(ReplayError, match="structure"):
        fn(x)


def test_non_array_arguments_must_match_capture(randn):
    x = randn((16,))
    fn = make_graphed(lambda a, scale: a * scale, (x, 3.0))
    cupy.testing.assert_allclose(fn(x, 3.0), x * 3.0)
    with pytest.raises(ReplayError, match=r"args\[1\].*expected 3.0, got 4.0"):
        fn(x, 4.0)


def test_shared_pool_and_warmup_options(randn):
    pool = cugraphrt.graph_pool_handle()
    x = randn((1 << 16,))
    f1 = make_graphed(lambda a: cupy.exp(a) + 1, (x,), pool=pool, num_warmup_iters=0)
    f2 = make_graphed(lambda a: cupy.sin(a) * 2, (x,), pool=pool, num_warmup_iters=1)
    assert f1.graph.pool() is pool and f2.graph.pool() is pool
    assert pool.stats().live_graphs == 2
    nx = randn((1 << 16,))
    cupy.testing.assert_allclose(f1(nx), cupy.exp(nx) + 1, rtol=1e-5)
    cupy.testing.assert_allclose(f2(nx), cupy.sin(nx) * 2, rtol=1e-5, atol=1e-6)
    with pytest.raises(OptionsError, match="num_warmup_iters"):
        make_graphed(lambda a: a, (x,), num_warmup_iters=-1)
    with pytest.raises(OptionsError, match="fn"):
        make_graphed("not callable", (x,))
