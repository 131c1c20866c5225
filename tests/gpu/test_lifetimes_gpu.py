"""Every kind of CuPy replay handle keeps its graph alive, and lets it go at once when dropped.

Each case builds a graph in a function of its own and keeps one handle: ``g.replay`` (also
bound with a stream), ``g.launcher()``, ``StreamGraph.launch``, a graphed function, a bucketed
one, a graph holding a ``while_loop`` and a ``cond``, and a graph holding an NCCL
collective (its first, checked replay and its steady one, with and without the watchdog).
See tests/lifetimes.py for the steps and docs/concepts.md, "Lifetimes", for the rule.
"""

from __future__ import annotations

import functools

import numpy as np
import pytest

cupy = pytest.importorskip("cupy")

import cugraphrt  # noqa: E402
from tests.lifetimes import BIG_BYTES, Kept, check_lifetime  # noqa: E402

pytestmark = pytest.mark.gpu

N = 1 << 16
ROWS = BIG_BYTES // (4 * N)  # the temporary (ROWS, N) float32 is BIG_BYTES


def _work(x, w):
    """x * sum(w), through a temporary of ROWS rows of x (BIG_BYTES for x of N) freed inside
    the capture."""
    return (cupy.broadcast_to(x, (ROWS, x.shape[0])) * w[:, None]).sum(axis=0)


def _inputs(rng):
    x = cupy.asarray(rng.standard_normal(N).astype(np.float32))
    w = cupy.asarray(rng.standard_normal(ROWS).astype(np.float32))
    _work(x, w)  # kernels compiled before the capture
    return x, w


def _checker(rng, x, w, y, replay_with: str = "call"):
    """check(handle): new data into the static input, one replay through the handle, the
    output compared with a float64 NumPy reference."""

    def check(handle):
        x[...] = cupy.asarray(rng.standard_normal(N).astype(np.float32))
        out = handle(x) if replay_with == "argument" else handle()
        cupy.cuda.runtime.deviceSynchronize()
        want = cupy.asnumpy(x).astype(np.float64) * cupy.asnumpy(w).astype(np.float64).sum()
        got = cupy.asnumpy(out if out is not None else y)
        np.testing.assert_allclose(got, want, rtol=1e-3, atol=1e-3 * np.abs(want).max())

    return check


def _captured(rng, pool=None):
    x, w = _inputs(rng)
    g = cugraphrt.Graph()
    with cugraphrt.graph(g, pool=pool):
        y = _work(x, w)
    return g, x, w, y


def test_bound_replay_keeps_its_graph(rng):
    def build():
        g, x, w, y = _captured(rng)
        return Kept(g.replay, _checker(rng, x, w, y), g.pool())

    check_lifetime(build)


def test_replay_bound_to_a_stream_keeps_its_graph(rng):
    stream = cupy.cuda.Stream(non_blocking=True)

    def build():
        g, x, w, y = _captured(rng)
        return Kept(functools.partial(g.replay, stream), _checker(rng, x, w, y), g.pool())

    check_lifetime(build)


def test_launcher_keeps_its_graph(rng):
    def build():
        g, x, w, y = _captured(rng)
        return Kept(g.launcher(), _checker(rng, x, w, y), g.pool())

    check_lifetime(build)


def test_stream_graph_launch_keeps_its_graph(rng):
    def build():
        x, w = _inputs(rng)
        stream = cugraphrt.Stream(non_blocking=True)
        with stream:
            stream.begin_capture()
            y = _work(x, w)
            g = stream.end_capture()
        return Kept(g.launch, _checker(rng, x, w, y), g.pool())

    check_lifetime(build)


def test_graphed_function_keeps_its_graph(rng):
    def build():
        x, w = _inputs(rng)
        graphed = cugraphrt.make_graphed(lambda x: _work(x, w), (x,))
        return Kept(graphed, _checker(rng, x, w, None, "argument"), graphed.graph.pool())

    check_lifetime(build)


def test_bucketed_function_keeps_its_graphs(rng):
    def build():
        x, w = _inputs(rng)
        graphed = cugraphrt.make_graphed(lambda x: _work(x, w), (x,), buckets=[N // 2, N],
                                         dynamic_dim=0)
        graphed.capture_all()
        pool = graphed.pool  # one pool for every bucket: it caches what the graphs gave back
        return Kept(graphed, _checker(rng, x, w, None, "argument"), pool, pool.empty_cache)

    check_lifetime(build)


def test_graph_with_device_side_loop_and_branch_keeps_its_graph(rng):
    """A while_loop whose body allocates the big temporary, then a cond: both bodies live in
    the graph, their memory in its pool."""

    def build():
        x, w = _inputs(rng)
        y = cupy.zeros(N, dtype=cupy.float32)
        i = cupy.zeros((), dtype=cupy.int32)
        g = cugraphrt.Graph()
        with cugraphrt.graph(g):
            y.fill(0)
            i.fill(0)

            def body():
                y[...] += _work(x, w)
                i[...] += 1

            cugraphrt.while_loop(lambda: i < 3, body)
            cugraphrt.cond(i == 3, lambda: cupy.divide(y, 3, out=y))  # three iterations: mean
        return Kept(g.replay, _checker(rng, x, w, y), g.pool())

    check_lifetime(build)


@pytest.mark.parametrize("watchdog", [False, True], ids=["plain", "watchdog"])
def test_graph_holding_a_collective_keeps_itself_through_its_checked_replays(
        rng, solo, watchdog):
    """First replay: the cross-rank check; later ones: the steady replay (watched with a
    collective timeout). A one-rank communicator's sum is the value itself."""
    from cugraphrt.distributed.watchdog import set_collective_timeout

    set_collective_timeout(60.0 if watchdog else None)
    try:
        def build():
            x, w = _inputs(rng)
            y = cupy.empty(N, dtype=cupy.float32)
            solo.all_reduce(_work(x, w), out=y)  # warm-up
            g = cugraphrt.Graph()
            with cugraphrt.graph(g):
                solo.all_reduce(_work(x, w), out=y)
            assert g._route is not None  # armed: the first replay checks across ranks
            return Kept(g.replay, _checker(rng, x, w, y), g.pool())

        check_lifetime(build)
    finally:
        set_collective_timeout(None)
        solo.close()
