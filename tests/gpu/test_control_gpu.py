"""Device-side control flow (cugraphrt.while_loop / cond): graphs equal eager runs."""

from __future__ import annotations

import cupy
import numpy as np
import pytest

import cugraphrt
import cugraphrt.random as crandom
from cugraphrt import CaptureError, Graph, graph
from cugraphrt._cuda import conditional as _conditional
from cugraphrt._cuda import runtime as _cuda

pytestmark = pytest.mark.gpu


def _halving(v):
    """A loop whose iteration count depends on the data: halve v until max|v| <= 1."""
    def cond_fn():
        return cupy.abs(v).max() > 1.0

    def body_fn():
        v[...] = v * 0.5 + 0.01

    return cond_fn, body_fn


def _eager_halving(start):
    v = start.copy()
    count = cugraphrt.while_loop(*_halving(v))  # outside a capture: runs eagerly
    return v, int(count)


def test_while_loop_equals_eager_and_replays_new_inputs(randn):
    v = randn((1000,), dtype=np.float64) * 50
    cond_fn, body_fn = _halving(v)
    cond_fn(), body_fn()  # warm up the kernels
    g = Graph()
    with graph(g):
        count = cugraphrt.while_loop(cond_fn, body_fn)
    counts = set()
    for scale in (50.0, 3.0, 1e4, 0.1):
        start = randn((1000,), dtype=np.float64) * scale
        v[...] = start
        g.replay()
        expected, expected_count = _eager_halving(start)
        assert int(count) == expected_count
        cupy.testing.assert_array_equal(v, expected)  # same kernels, same order: bit-equal
        counts.add(expected_count)
    assert len(counts) >= 3, counts  # the replays ran different numbers of iterations
    assert 0 in counts  # scale 0.1: max|v| < 1, the body never runs


def test_max_iters_stops_the_loop_on_the_device():
    k = cupy.zeros((), dtype=cupy.int64)
    limit = cupy.asarray(10**9, dtype=cupy.int64)
    g, g0 = Graph(), Graph()
    with graph(g):
        count = cugraphrt.while_loop(lambda: k < limit, lambda: k.__iadd__(1), max_iters=7)
    with graph(g0):
        count0 = cugraphrt.while_loop(lambda: k < limit, lambda: k.__iadd__(1), max_iters=0)
    g.replay()
    assert int(count) == 7 and int(k) == 7
    g.replay()
    assert int(count) == 7 and int(k) == 14
    limit[...] = 16  # the predicate now stops it first
    g.replay()
    assert int(count) == 2 and int(k) == 16
    g0.replay()
    assert int(count0) == 0 and int(k) == 16
    k[...] = 0  # eagerly: the same counts
    assert int(cugraphrt.while_loop(lambda: k < 100, lambda: k.__iadd__(1), max_iters=7)) == 7


def test_nested_loops_and_branches_equal_eager():
    n = cupy.zeros((), dtype=cupy.int32)
    total = cupy.zeros((), dtype=cupy.int64)
    odd = cupy.zeros((), dtype=cupy.int64)

    def program():
        i = cupy.zeros((), dtype=cupy.int32)  # allocated in the graph: static state
        inner_counts = cupy.zeros((), dtype=cupy.int64)

        def outer():
            j = cupy.zeros((), dtype=cupy.int32)

            def inner():
                total[...] += i * 10 + j
                j[...] += 1

            inner_counts[...] += cugraphrt.while_loop(lambda: j < i, inner)
            cugraphrt.cond(i % 2 == 1, lambda: odd.__iadd__(i), lambda: odd.__isub__(1))
            i[...] += 1

        outer_count = cugraphrt.while_loop(lambda: i < n, outer)
        return outer_count, inner_counts

    def reset():
        total[...] = 0
        odd[...] = 0

    g = Graph()
    with graph(g):
        graphed = program()
    for size in (5, 0, 9):
        n[...] = size
        reset()
        g.replay()
        got = (int(total), int(odd), int(graphed[0]), int(graphed[1]))
        reset()
        eager = program()
        want = (int(total), int(odd), int(eager[0]), int(eager[1]))
        assert got == want, (size, got, want)
        assert got[2] == size and got[3] == size * (size - 1) // 2


@pytest.mark.parametrize("else_body", ["if_else_node", "two_if_nodes"])
def test_cond_runs_the_branch_the_device_picks(monkeypatch, else_body, randn):
    if else_body == "two_if_nodes":
        monkeypatch.setattr(_conditional, "if_else_supported", lambda: False)
    x = randn((64,))
    out = cupy.zeros(64, dtype=cupy.float32)
    flag = cupy.zeros((), dtype=cupy.bool_)

    def true_fn():
        out[...] = x * 2
        flag[...] = False  # the false branch must not run after this one

    def false_fn():
        out[...] = -x

    g, g_if = Graph(), Graph()
    with graph(g):
        cugraphrt.cond(flag, true_fn, false_fn)
    with graph(g_if):
        cugraphrt.cond(x.sum() > 0, lambda: out.__imul__(3))
    for value in (True, False, True):
        flag[...] = value
        g.replay()
        cupy.testing.assert_allclose(out, x * 2 if value else -x)
    for sign in (1, -1):
        x[...] = cupy.abs(x) * sign
        out[...] = 1
        g_if.replay()
        cupy.testing.assert_allclose(out, cupy.full(64, 3.0 if sign > 0 else 1.0))


def test_libraries_and_pool_memory_inside_bodies(randn):
    a = randn((64, 64)) / 64
    v = randn((64, 8))
    signal = randn((256,)).astype(cupy.complex64)
    k = cupy.zeros((), dtype=cupy.int32)
    energy = cupy.zeros((), dtype=cupy.float32)
    kept = []

    def body():
        w = a @ v  # a cuBLAS GEMM through cugraphrt
        v[...] = w / cupy.sqrt((w * w).sum())  # reductions
        energy[...] += cupy.abs(cupy.fft.fft(signal)).sum()  # cuFFT, plan cached
        kept.append(w)
        k[...] += 1

    def run(n):
        k[...] = 0
        energy[...] = 0
        return cugraphrt.while_loop(lambda: k < n, body)

    start = v.copy()
    run(2)  # warm up every kernel, the cuBLAS handle and the FFT plan
    kept.clear()
    v[...] = start
    pool = cugraphrt.graph_pool_handle()
    g = Graph()
    with graph(g, pool=pool):
        count = run(5)
    live = pool.stats().live_arrays
    kept.clear()  # the body's array came from the graph's pool
    assert pool.stats().live_arrays == live - 1
    v[...] = start
    g.replay()
    graphed_v, graphed_energy = v.copy(), float(energy)
    v[...] = start
    assert int(run(5)) == int(count) == 5
    cupy.testing.assert_allclose(graphed_v, v, rtol=1e-5)
    assert graphed_energy == pytest.approx(float(energy), rel=1e-5)


def test_random_in_a_body_is_fresh_per_iteration_and_replay(rng):
    seed = int(rng.integers(0, 2**63))
    gen = crandom.Generator(seed)
    rows = 6
    out = cupy.zeros((rows, 4), dtype=cupy.float32)
    i = cupy.zeros((), dtype=cupy.int32)
    index = cupy.arange(rows)[:, None]

    def body():
        draw = gen.rand(4, dtype=np.float32)
        out[...] = cupy.where(index == i, draw[None, :], out)
        i[...] += 1

    g = Graph()
    with graph(g):
        cugraphrt.while_loop(lambda: i < rows, body)
    replays = []
    for _ in range(2):
        i[...] = 0
        g.replay()
        replays.append(cupy.asnumpy(out))
    gen.manual_seed(seed)
    eager = []
    for _ in range(2):
        i[...] = 0
        cugraphrt.while_loop(lambda: i < rows, body)
        eager.append(cupy.asnumpy(out))
    np.testing.assert_array_equal(np.stack(replays), np.stack(eager))
    every_row = np.concatenate(replays)
    assert len({r.tobytes() for r in every_row}) == 2 * rows  # fresh per iteration and replay


def test_host_sync_in_a_body_is_a_capture_error_and_rolls_back():
    x = cupy.ones(8)
    k = cupy.zeros((), dtype=cupy.int32)
    g = Graph()
    with pytest.raises(CaptureError, match=r"in cugraphrt\.while_loop: .*host"):
        with graph(g):
            cugraphrt.while_loop(lambda: k < 3, lambda: (x.get(), k.__iadd__(1)))
    assert not g.is_captured
    with graph(g):  # the stream and the pool are usable again
        cugraphrt.while_loop(lambda: k < 3, lambda: k.__iadd__(1))
    k[...] = 0
    g.replay()
    assert int(k) == 3


@pytest.mark.parametrize("bad", ["vector", "float", "host"])
def test_predicate_must_be_a_0d_device_array(bad):
    x = cupy.ones(8)
    pred = {"vector": lambda: x > 0, "float": lambda: x.sum(), "host": lambda: True}[bad]
    g = Graph()
    with pytest.raises(CaptureError, match="must be a 0-d bool or integer device array"):
        with graph(g):
            cugraphrt.while_loop(pred, lambda: x.__iadd__(1))
    with pytest.raises(CaptureError, match="must be a 0-d bool or integer device array"):
        cugraphrt.while_loop(pred, lambda: x.__iadd__(1))  # the same check eagerly


def test_a_capture_cugraphrt_did_not_begin_is_refused():
    stream = cupy.cuda.Stream(non_blocking=True)
    k = cupy.zeros((), dtype=cupy.int32)
    with stream:
        stream.begin_capture()
        try:
            with pytest.raises(CaptureError, match="did not begin"):
                cugraphrt.while_loop(lambda: k < 3, lambda: k.__iadd__(1))
        finally:
            stream.end_capture()


def test_an_old_driver_is_named_with_the_versions(monkeypatch):
    monkeypatch.setattr(_cuda, "driver_version", lambda: 12030)
    k = cupy.zeros((), dtype=cupy.int32)
    with pytest.raises(CaptureError, match=r"CUDA 12\.4 or newer \(got driver version 12\.3"):
        with graph(Graph()):
            cugraphrt.while_loop(lambda: k < 3, lambda: k.__iadd__(1))
