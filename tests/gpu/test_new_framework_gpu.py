"""The minitensor adapter of examples/dlpack_framework: a new framework graphed through the
public interface only (its imports are checked by tests/unit/test_layers.py).

Every result is compared with a float64 NumPy reference of the same function.
"""

from __future__ import annotations

import gc
import sys
import weakref
from pathlib import Path

import numpy as np
import pytest

cupy = pytest.importorskip("cupy")

pytestmark = pytest.mark.gpu

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples" / "dlpack_framework"))

import minitensor as mt  # noqa: E402
from cugraphrt_minitensor import MiniFramework, make_bucketed, make_graphed  # noqa: E402

from cugraphrt import OverwrittenOutputError, ReplayError  # noqa: E402


def affine(x, w, b):
    return mt.relu(mt.matmul(x, w) + b)


def reference(x, w, b):
    return np.maximum(x.astype(np.float64) @ w + b, 0)


@pytest.fixture
def params(rng):
    w = rng.standard_normal((16, 8)).astype(np.float32)
    b = rng.standard_normal(8).astype(np.float32)
    return w, b


def test_replays_on_new_inputs_equal_the_reference(rng, params):
    w, b = params
    graphed = make_graphed(affine, (mt.tensor(rng.standard_normal((4, 16))), mt.tensor(w),
                                    mt.tensor(b)))
    for _ in range(3):
        x = rng.standard_normal((4, 16)).astype(np.float32)
        out = graphed(mt.tensor(x), mt.tensor(w), mt.tensor(b))
        np.testing.assert_allclose(out.numpy(), reference(x, w, b), rtol=1e-4, atol=1e-4)


def test_static_inputs_are_not_copied_and_new_ones_are(rng, params, monkeypatch):
    w, b = params
    copies = []
    original = MiniFramework.copy
    monkeypatch.setattr(MiniFramework, "copy",
                        staticmethod(lambda dst, src: (copies.append(src.shape),
                                                       original(dst, src))))
    x, wt, bt = mt.tensor(rng.standard_normal((4, 16))), mt.tensor(w), mt.tensor(b)
    graphed = make_graphed(affine, (x, wt, bt))
    graphed(x, wt, bt)
    assert copies == []
    graphed(mt.from_dlpack(x), wt, bt)  # another Tensor over the very same memory
    assert copies == []
    graphed(mt.tensor(rng.standard_normal((4, 16))), wt, bt)
    assert copies == [(4, 16)]


def test_a_mismatched_argument_raises(rng, params):
    w, b = params
    graphed = make_graphed(affine, (mt.tensor(rng.standard_normal((4, 16))), mt.tensor(w),
                                    mt.tensor(b)))
    with pytest.raises(ReplayError, match=r"args\[0\] does not match"):
        graphed(mt.tensor(rng.standard_normal((5, 16))), mt.tensor(w), mt.tensor(b))
    with pytest.raises(ReplayError, match=r"args\[1\]"):
        graphed(mt.tensor(rng.standard_normal((4, 16))), np.zeros((16, 8)), mt.tensor(b))


def test_the_checked_mode_refuses_to_overwrite_a_live_output(rng, params):
    w, b = params
    wt, bt = mt.tensor(w), mt.tensor(b)
    graphed = make_graphed(affine, (mt.tensor(rng.standard_normal((4, 16))), wt, bt),
                           check_outputs=True)
    x1 = rng.standard_normal((4, 16)).astype(np.float32)
    first = graphed(mt.tensor(x1), wt, bt)
    with pytest.raises(OverwrittenOutputError, match="output of call #1 of minitensor affine"):
        graphed(mt.tensor(rng.standard_normal((4, 16))), wt, bt)
    np.testing.assert_allclose(first.numpy(), reference(x1, w, b), rtol=1e-4, atol=1e-4)
    del first  # dropped: the next replay may overwrite it
    x2 = rng.standard_normal((4, 16)).astype(np.float32)
    np.testing.assert_allclose(graphed(mt.tensor(x2), wt, bt).numpy(), reference(x2, w, b),
                               rtol=1e-4, atol=1e-4)


def test_buckets_serve_every_size_and_run_larger_ones_eagerly(rng, params):
    w, b = params
    wt, bt = mt.tensor(w), mt.tensor(b)
    served = make_bucketed(affine, (mt.tensor(rng.standard_normal((8, 16))), wt, bt),
                           buckets=[2, 4, 8], dynamic_dim=(0, None, None))
    for n in range(1, 9):
        x = rng.standard_normal((n, 16)).astype(np.float32)
        out = served(mt.tensor(x), wt, bt)
        assert out.shape == (n, 8)
        np.testing.assert_allclose(out.numpy(), reference(x, w, b), rtol=1e-4, atol=1e-4)
    x = rng.standard_normal((9, 16)).astype(np.float32)
    with pytest.warns(UserWarning, match="above the largest bucket 8"):
        out = served(mt.tensor(x), wt, bt)
    np.testing.assert_allclose(out.numpy(), reference(x, w, b), rtol=1e-4, atol=1e-4)
    stats = served.stats()
    assert [s.calls for s in stats.buckets] == [2, 2, 4] and stats.eager_calls == 1


def test_the_graph_goes_with_the_callable(rng, params):
    w, b = params

    def build():
        graphed = make_graphed(affine, (mt.tensor(rng.standard_normal((4, 16))),
                                        mt.tensor(w), mt.tensor(b)))
        return graphed, weakref.ref(graphed.graph)

    graphed, graph_ref = build()
    assert graph_ref() is not None
    gc.disable()  # released by reference counting alone, not by a collection
    try:
        del graphed
        assert graph_ref() is None
    finally:
        gc.enable()
