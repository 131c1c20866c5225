"""Graph memory pools on the GPU, ported from PyTorch's CUDA-graph memory tests."""

from __future__ import annotations

import gc

import cupy
import pytest

import cugraphrt
from cugraphrt import Graph, PoolOrderError, PoolOutOfMemoryError, graph

pytestmark = pytest.mark.gpu

MiB = 1 << 20


def _big_temporaries(x, size):
    """Work with a large temporary that dies inside the capture, and a small output."""
    t = cupy.broadcast_to(x[:1], (size,)) * 2.0 + 1.0  # `size` floats, freed below
    return x * 3.0 + t[:x.size].sum()


def test_two_successive_graphs_without_sharing(randn):
    x = randn((1024,))
    g1, g2 = Graph(), Graph()
    with graph(g1):
        y1 = x + 1
    with graph(g2):
        y2 = y1 * 2
    assert g1.pool() is not g2.pool()
    fresh = randn((1024,))
    x[...] = fresh
    g1.replay()
    g2.replay()
    cupy.testing.assert_allclose(y2, (fresh + 1) * 2, rtol=1e-6)


@pytest.mark.parametrize("share", ["graph_pool", "pool_handle"])
def test_sharing_saves_memory(share, randn):
    size = 8 * MiB  # 32 MiB temporaries
    x = randn((1024,))

    def capture(pool):
        g = Graph()
        with graph(g, pool=pool):
            y = _big_temporaries(x, size)
        return g, y

    separate = [capture(None) for _ in range(2)]
    separate_reserved = sum(g.pool().stats().reserved_bytes for g, _ in separate)
    if share == "graph_pool":
        first = capture(None)
        second = capture(first[0].pool())
        shared_pool = first[0].pool()
    else:
        shared_pool = cugraphrt.graph_pool_handle()
        first, second = capture(shared_pool), capture(shared_pool)
    shared_reserved = shared_pool.stats().reserved_bytes
    assert shared_pool.stats().live_graphs == 2
    assert shared_reserved < 0.6 * separate_reserved, (shared_reserved, separate_reserved)
    fresh = randn((1024,))
    x[...] = fresh
    for g, y in (first, second):
        g.replay()
        expected = fresh * 3.0 + (fresh[0] * 2.0 + 1.0) * 1024
        cupy.testing.assert_allclose(y, expected, rtol=1e-4)


def test_three_successive_graphs_replayed_in_capture_order(randn):
    x = randn((4096,))
    pool = cugraphrt.graph_pool_handle()
    graphs = []
    with graph(g0 := Graph(), pool=pool):
        a = x * 2
        tmp = cupy.exp(a)
        b = tmp + a
        del tmp
    graphs.append(g0)
    with graph(g1 := Graph(), pool=pool):
        tmp = b * b
        c = tmp - 1
        del tmp
    graphs.append(g1)
    with graph(g2 := Graph(), pool=pool):
        d = c + b + a
    graphs.append(g2)
    for _ in range(3):
        fresh = randn((4096,))
        x[...] = fresh
        for g in graphs:
            g.replay()
        fa = fresh * 2
        fb = cupy.exp(fa) + fa
        fc = fb * fb - 1
        cupy.testing.assert_allclose(d, fc + fb + fa, rtol=1e-5)


def test_concurrent_replay_on_two_streams_with_separate_pools(randn):
    x1, x2 = randn((1 << 20,)), randn((1 << 20,))
    g1, g2 = Graph(), Graph()
    with graph(g1):
        y1 = _chain(x1)
    with graph(g2):
        y2 = _chain(x2)
    s1, s2 = cupy.cuda.Stream(non_blocking=True), cupy.cuda.Stream(non_blocking=True)
    for _ in range(3):
        f1, f2 = randn((1 << 20,)), randn((1 << 20,))
        x1[...] = f1
        x2[...] = f2
        cupy.cuda.runtime.deviceSynchronize()
        g1.replay(stream=s1)
        g2.replay(stream=s2)
        s1.synchronize()
        s2.synchronize()
        cupy.testing.assert_allclose(y1, _chain(f1), rtol=1e-5)
        cupy.testing.assert_allclose(y2, _chain(f2), rtol=1e-5)


def _chain(x):
    y = x
    for _ in range(30):
        y = cupy.sin(y) * 0.9 + 0.1
    return y


def test_output_outlives_deleted_graph_and_stats_follow(randn):
    x = randn((1 << 18,))
    g = Graph()
    with graph(g):
        tmp = x * 2
        y = tmp + 1
        del tmp
    pool = g.pool()
    stats = pool.stats()
    assert stats.live_graphs == 1 and stats.live_arrays == 1
    assert stats.active_bytes == y.nbytes
    assert stats.peak_active_bytes >= 2 * y.nbytes
    fresh = randn((1 << 18,))
    x[...] = fresh
    g.replay()
    del g
    gc.collect()
    stats = pool.stats()
    assert stats.live_graphs == 0 and stats.live_arrays == 1
    assert stats.reserved_bytes >= y.nbytes
    cupy.testing.assert_allclose(y, fresh * 2 + 1, rtol=1e-6)  # still readable
    del y
    gc.collect()
    assert pool.stats().reserved_bytes == 0  # a private pool gives everything back


def test_out_of_memory_during_capture_and_recovery(randn):
    x = randn((1024,))
    pool = cugraphrt.graph_pool_handle()
    first = Graph()
    with graph(first, pool=pool):
        keep = x * 2
    first.replay()
    baseline = pool.stats()
    _, total = cupy.cuda.runtime.memGetInfo()
    g = Graph()
    with pytest.raises(PoolOutOfMemoryError) as info:
        with graph(g, pool=pool):
            (x + 1).sum()
            cupy.empty(2 * total, dtype=cupy.uint8)
    error = info.value
    assert isinstance(error, MemoryError)
    assert error.requested_bytes == 2 * total
    assert error.device_total_bytes == total
    assert error.reserved_bytes >= baseline.reserved_bytes
    del info, error
    gc.collect()
    after = pool.stats()
    assert (after.reserved_bytes, after.active_bytes, after.live_arrays, after.live_graphs) == (
        baseline.reserved_bytes, baseline.active_bytes, baseline.live_arrays,
        baseline.live_graphs)
    assert not g.is_captured
    with graph(g, pool=pool):
        y = keep + 1
    g.replay()
    cupy.testing.assert_allclose(y, x * 2 + 1, rtol=1e-6)


def test_freed_temporary_is_not_reused_by_eager_code(randn):
    n = 1 << 16
    x = randn((n,))
    g = Graph()
    with graph(g):
        t = x * 2  # a temporary: freed inside the capture, written on every replay
        y = t + 1
        del t
    poisoned = [cupy.full((n,), cupy.nan, dtype=cupy.float32) for _ in range(16)]
    for _ in range(3):
        fresh = randn((n,))
        x[...] = fresh
        g.replay()
        cupy.testing.assert_allclose(y, fresh * 2 + 1, rtol=1e-6)
    for p in poisoned:
        assert bool(cupy.isnan(p).all()), "a replay wrote into eager memory"


def test_capture_cycles_into_a_shared_pool_do_not_grow_it(randn):
    x = randn((1 << 16,))
    pool = cugraphrt.graph_pool_handle()
    reserved = []
    for _ in range(100):
        g = Graph()
        with graph(g, pool=pool):
            y = cupy.tanh(x) * 2
        g.replay()
        g.reset()
        del y
        reserved.append(pool.stats().reserved_bytes)
    assert len(set(reserved[1:])) == 1, reserved[:5]
    assert pool.empty_cache() == reserved[-1]


def _three_graphs(x, pool):
    graphs, outs = [], []
    y = x
    for k in range(3):
        g = Graph()
        with graph(g, pool=pool):
            y = y * 2 + k
        graphs.append(g)
        outs.append(y)
    return graphs, outs


def test_pool_checks_catch_out_of_order_replay(randn):
    x = randn((1024,))
    pool = cugraphrt.graph_pool_handle()
    (g0, g1, g2), _ = _three_graphs(x, pool)
    cugraphrt.set_pool_checks(True)
    assert cugraphrt.pool_checks_enabled()
    for g in (g0, g1, g2, g0, g1, g1, g2):
        g.replay()
    g0.replay()
    with pytest.raises(PoolOrderError, match="out-of-order"):
        g2.replay()  # skipped g1
    g1.replay()
    g2.replay()
    with pytest.raises(PoolOrderError, match="out-of-order"):
        g1.replay()  # back to the middle of a round
    cupy.cuda.runtime.deviceSynchronize()


def test_pool_checks_catch_concurrent_replay(randn):
    x = randn((1 << 22,))
    pool = cugraphrt.graph_pool_handle()
    g0, g1 = Graph(), Graph()
    with graph(g0, pool=pool):
        y = _chain(x)  # long enough to still run when g1 is launched
    with graph(g1, pool=pool):
        z = y + 1
    cugraphrt.set_pool_checks(True)
    s1, s2 = cupy.cuda.Stream(non_blocking=True), cupy.cuda.Stream(non_blocking=True)
    for _ in range(5):
        g0.replay(stream=s1)
    with pytest.raises(PoolOrderError, match="concurrent replay"):
        g1.replay(stream=s2)
    s1.synchronize()
    g1.replay(stream=s2)  # after the previous replay finished: allowed
    s2.synchronize()
    cupy.testing.assert_allclose(z, _chain(x) + 1, rtol=1e-5)


def test_pool_checks_leave_private_graphs_alone(randn):
    x = randn((64,))
    g = Graph()
    with graph(g):
        y = x + 1
    cugraphrt.set_pool_checks(True)
    for _ in range(3):
        g.replay(stream=cupy.cuda.Stream(non_blocking=True))
    cupy.cuda.runtime.deviceSynchronize()
    cupy.testing.assert_allclose(y, x + 1)


def test_user_allocator_is_untouched_outside_and_beside_captures(randn):
    x = randn((4096,))
    calls = []
    base = cupy.get_default_memory_pool()

    def counting(nbytes):
        calls.append(nbytes)
        return base.malloc(nbytes)

    other = cupy.cuda.Stream(non_blocking=True)
    with other:
        x * 3  # warm CuPy's pool for `other`
    other.synchronize()
    cupy.cuda.set_allocator(counting)
    try:
        calls.clear()
        x * 2
        assert calls, "eager allocation skipped the user's allocator"
        calls.clear()
        g = Graph()
        with graph(g, capture_error_mode="relaxed"):
            y = x * 2  # capture stream: the graph's pool
            with other:
                z = x * 3  # another stream: the user's allocator
        assert calls == [z.nbytes]
        assert g.pool().stats().live_arrays == 1
        calls.clear()
        x + 1
        assert calls
        g.replay()
        cupy.testing.assert_allclose(y, x * 2)
    finally:
        cupy.cuda.set_allocator(base.malloc)


def test_memory_summary_and_empty_cache(randn):
    x = randn((1 << 18,))
    pool = cugraphrt.graph_pool_handle()
    g = Graph()
    with graph(g, pool=pool):
        y = x * 2
    table = cugraphrt.memory_summary()
    assert str(pool.id) in table and "shared" in table
    g.reset()
    del y
    assert cugraphrt.empty_cache() >= 1 * MiB
    assert pool.stats().reserved_bytes == 0
