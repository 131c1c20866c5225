"""Capture and replay of CuPy work: correctness, streams, lifecycle, errors."""

from __future__ import annotations

import gc
import threading
import warnings

import cupy
import numpy as np
import pytest

import cugraphrt
from cugraphrt import CaptureError, Graph, OptionsError, ReplayError, graph

pytestmark = pytest.mark.gpu


def _chain(x, steps=20):
    y = x
    for i in range(steps):
        y = y * 1.0001 + (i % 3) * 0.5
    return y


def test_replay_equals_eager_on_fresh_inputs(randn):
    x = randn((4096,))
    g = Graph()
    with graph(g):
        y = _chain(x)
    for _ in range(5):
        fresh = randn((4096,))
        x[...] = fresh
        g.replay()
        cupy.testing.assert_allclose(y, _chain(fresh), rtol=1e-6)


def test_replay_on_another_stream(randn):
    x = randn((1000,))
    g = Graph()
    with graph(g):
        y = cupy.sin(x) * 2
    other = cupy.cuda.Stream(non_blocking=True)
    fresh = randn((1000,))
    x.set(cupy.asnumpy(fresh))
    cupy.cuda.Device().synchronize()  # the copy first: the stream is non-blocking
    g.replay(stream=other)
    other.synchronize()
    cupy.testing.assert_allclose(y, cupy.sin(fresh) * 2, rtol=1e-6)
    with other:
        x[...] = fresh + 1
        g.replay()  # the current stream
    other.synchronize()
    cupy.testing.assert_allclose(y, cupy.sin(fresh + 1) * 2, rtol=1e-6)


def test_two_graphs_interleaved_with_eager_work(randn):
    a, b = randn((512,)), randn((512,))
    g1, g2 = Graph(), Graph()
    with graph(g1):
        out1 = a * 3 + 1
    with graph(g2):
        out2 = b.sum() * b
    for _ in range(3):
        na, nb = randn((512,)), randn((512,))
        a[...] = na
        g1.replay()
        eager = cupy.exp(na)  # eager work between replays allocates from CuPy's pool
        b[...] = nb
        g2.replay()
        cupy.testing.assert_allclose(out1, na * 3 + 1, rtol=1e-6)
        cupy.testing.assert_allclose(out2, nb.sum() * nb, rtol=1e-5)
        cupy.testing.assert_allclose(eager, cupy.exp(na), rtol=1e-6)


def test_reset_and_recapture(randn):
    x = randn((256,))
    g = Graph()
    with graph(g):
        y = x + 1
    g.reset()
    with pytest.raises(ReplayError, match="before a successful capture or after reset"):
        g.replay()
    with graph(g):
        z = x * 5
    fresh = randn((256,))
    x[...] = fresh
    g.replay()
    cupy.testing.assert_allclose(z, fresh * 5, rtol=1e-6)
    del y


def test_replay_before_capture_is_a_replay_error():
    with pytest.raises(ReplayError, match="capture work into it first"):
        Graph().replay()


def _stream_still_works(randn):
    x = randn((128,))
    g = Graph()
    with graph(g):
        y = x * 2
    g.replay()
    cupy.testing.assert_allclose(y, x * 2)
    s = cugraphrt.default_capture_stream()
    with s:
        cupy.testing.assert_allclose(x + 1, cupy.asnumpy(x) + 1, rtol=1e-6)
    s.synchronize()


def test_host_sync_in_capture_is_a_capture_error(randn):
    x = randn((64,))
    g = Graph()
    with pytest.raises(CaptureError, match="synchroniz") as info:
        with graph(g):
            y = x * 2
            y.get()
    assert info.value.__cause__ is not None
    assert not g.is_captured and g.pool() is None
    _stream_still_works(randn)


def test_stream_synchronize_in_capture_is_a_capture_error(randn):
    x = randn((64,))
    g = Graph()
    with pytest.raises(CaptureError, match="warm up first"):
        with graph(g) as ctx:
            x * 2
            ctx.capture_stream.synchronize()
    _stream_still_works(randn)


def test_capture_on_the_legacy_stream_is_refused(randn):
    g = Graph()
    with cupy.cuda.Stream.null:
        with pytest.raises(CaptureError, match="legacy default stream"):
            g.capture_begin()
    _stream_still_works(randn)


def test_capture_must_end_on_its_stream(randn):
    x = randn((64,))
    g = Graph()
    side = cupy.cuda.Stream(non_blocking=True)
    with side:
        g.capture_begin()
        y = x * 2
    other = cupy.cuda.Stream(non_blocking=True)
    with other:
        with pytest.raises(CaptureError, match="must end on the stream it began on"):
            g.capture_end()
    with side:
        g.capture_end()
    g.replay()
    cupy.testing.assert_allclose(y, x * 2)


def test_unjoined_fork_is_a_capture_error(randn):
    x = randn((64,))
    g = Graph()
    forked = cupy.cuda.Stream(non_blocking=True)
    with pytest.raises(CaptureError, match="not joined back"):
        with graph(g) as ctx:
            y = x * 2
            forked.wait_event(ctx.capture_stream.record())
            with forked:
                z = y + 1
    del z
    forked.synchronize()
    with forked:
        cupy.testing.assert_allclose(x * 3, cupy.asnumpy(x) * 3, rtol=1e-6)
    _stream_still_works(randn)


def test_fork_join_capture_replays_correctly(randn):
    x = randn((2048,))
    g = Graph()
    forked = cupy.cuda.Stream(non_blocking=True)
    with graph(g) as ctx:
        main = ctx.capture_stream
        a = x * 2
        forked.wait_event(main.record())
        with forked:
            b = cupy.cos(x) + 1  # allocated on the forked stream: from the graph's pool
        main.wait_event(forked.record())
        y = a + b
    stats = g.pool().stats()
    assert stats.live_arrays >= 3  # a, b and y came from the capture's pool
    for _ in range(3):
        fresh = randn((2048,))
        x[...] = fresh
        g.replay()
        cupy.testing.assert_allclose(y, fresh * 2 + cupy.cos(fresh) + 1, rtol=1e-5, atol=1e-6)


def test_nested_capture_is_refused(randn):
    x = randn((32,))
    outer, inner = Graph(), Graph()
    with graph(outer):
        y = x + 1
        with pytest.raises(CaptureError, match="nested capture"):
            inner.capture_begin()
    outer.replay()
    cupy.testing.assert_allclose(y, x + 1)


def test_other_exceptions_pass_unchanged_and_roll_back(randn):
    x = randn((1 << 20,))
    pool = cugraphrt.graph_pool_handle()
    g = Graph()
    with pytest.raises(KeyError, match="boom"):
        with graph(g, pool=pool):
            _ = x * 2
            raise KeyError("boom")
    del _
    gc.collect()
    stats = pool.stats()
    assert stats.active_bytes == 0 and stats.live_graphs == 0
    _stream_still_works(randn)


def test_empty_capture_warns(randn):
    x = randn((16,))
    other = cupy.cuda.Stream(non_blocking=True)
    with other:  # let CuPy's pool cache a block for `other`: no cudaMalloc during capture
        x * 2
    other.synchronize()
    g = Graph()
    with pytest.warns(UserWarning, match="nothing was captured"):
        with graph(g):
            with other:
                y = x * 2
    other.synchronize()
    g.replay()  # an empty graph still launches
    del y


def test_is_current_stream_capturing(randn):
    x = randn((8,))
    assert not cugraphrt.is_current_stream_capturing()
    seen = []
    with graph(Graph()):
        seen.append(cugraphrt.is_current_stream_capturing())
        x + 1
    assert seen == [True]
    assert not cugraphrt.is_current_stream_capturing()


def test_keep_graph_debug_dump_and_raw_handles(tmp_path, randn):
    x = randn((100,))
    g = Graph(keep_graph=True)
    with graph(g):
        y = x * 4
    assert isinstance(g.raw_graph, int) and g.raw_graph
    path = tmp_path / "graph.dot"
    g.debug_dump(path)
    assert "digraph" in path.read_text()
    g.instantiate()
    g.upload()
    assert g.raw_graph_exec
    g.replay()
    cupy.testing.assert_allclose(y, x * 4)
    plain = Graph()
    with graph(plain):
        x + 1
    with pytest.raises(CaptureError, match="keep_graph=True"):
        plain.debug_dump(tmp_path / "no.dot")
    with pytest.raises(CaptureError, match="keep_graph=True"):
        plain.instantiate()
    assert plain.raw_graph_exec


@pytest.mark.parametrize("mode", ["global", "thread_local", "relaxed"])
def test_capture_modes(mode, randn):
    x = randn((300,))
    g = Graph()
    with graph(g, capture_error_mode=mode):
        y = cupy.tanh(x)
    fresh = randn((300,))
    x[...] = fresh
    g.replay()
    cupy.testing.assert_allclose(y, cupy.tanh(fresh), rtol=1e-6)


def test_bad_options_name_the_field():
    with pytest.raises(OptionsError, match="capture_error_mode.*'global', 'thread_local', "
                                           "'relaxed'"):
        graph(Graph(), capture_error_mode="strict")
    with pytest.raises(OptionsError, match="pool"):
        Graph().capture_begin(pool="mine")


def test_capture_reset_cycles_do_not_grow_device_memory(randn):
    x = randn((1 << 16,))

    def cycle():
        g = Graph()
        with graph(g):
            y = x * 2 + 1
        g.replay()
        g.reset()
        del y

    for _ in range(20):  # streams, kernels, CuPy's own cache
        cycle()
    cupy.cuda.runtime.deviceSynchronize()
    free_before, _ = cupy.cuda.runtime.memGetInfo()
    for _ in range(1000):
        cycle()
    cupy.cuda.runtime.deviceSynchronize()
    gc.collect()
    free_after, _ = cupy.cuda.runtime.memGetInfo()
    assert free_before - free_after < (1 << 20)


def test_capture_in_thread_while_another_computes(randn):
    x = randn((1 << 14,))
    data = cupy.asnumpy(randn((1 << 14,)))
    errors = []
    stop = threading.Event()

    def eager_worker():
        try:
            with cupy.cuda.Stream(non_blocking=True) as s:
                while not stop.is_set():
                    a = cupy.asarray(data)  # allocates from CuPy's pool, syncs this thread
                    np.testing.assert_allclose(cupy.asnumpy(a * 2), data * 2, rtol=1e-6)
                s.synchronize()
        except Exception as exc:  # noqa: BLE001
            errors.append(exc)

    worker = threading.Thread(target=eager_worker)
    worker.start()
    try:
        graphs = []
        for _ in range(20):
            g = Graph()
            with graph(g, capture_error_mode="thread_local"):
                y = cupy.sqrt(cupy.abs(x)) + 1
            graphs.append((g, y))
        fresh = randn((1 << 14,))
        x[...] = fresh
        for g, y in graphs:
            g.replay()
            cupy.testing.assert_allclose(y, cupy.sqrt(cupy.abs(fresh)) + 1, rtol=1e-6)
    finally:
        stop.set()
        worker.join()
    assert not errors, errors


def test_warning_free_normal_capture(randn):
    x = randn((64,))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with graph(Graph()):
            x * 2
