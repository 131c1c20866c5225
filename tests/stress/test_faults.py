"""Fault injection: a failure at any point of capture, instantiation or replay leaves the
process usable: no capture underway, the pool back at its baseline, the next capture right.
"""

from __future__ import annotations

import gc

import cupy
import numpy as np
import pytest

import cugraphrt
from cugraphrt import CugraphrtError, Graph, PoolOutOfMemoryError, graph
from cugraphrt._capture import graphs as graphs_module
from cugraphrt._capture import stream_capture as _capture
from cugraphrt._cuda import runtime as _cuda
from cugraphrt._memory.backing import capture_activity

from ._measure import MiB, device_used_bytes, growth_limit

pytestmark = pytest.mark.gpu


class Injected(RuntimeError):
    pass


def failing(original, exc_type, after: int = 0):
    """``original`` that raises ``exc_type`` on its call number ``after`` (0 = first)."""
    calls = [0]

    def call(*args, **kwargs):
        calls[0] += 1
        if calls[0] == after + 1:
            raise exc_type("injected")
        return original(*args, **kwargs)

    return call


# Where a fault is injected: (name, object, attribute, which call fails).
POINTS = [
    ("prepare", graphs_module.hooks, "prepare_capture", 0),  # what every capture runs first
    ("pool begin", cugraphrt.MemPool, "_begin_capture", 0),
    ("cuda begin", cupy.cuda.Stream, "begin_capture", 0),
    ("capture info", _cuda, "capture_info", 1),  # the check right after the begin
    ("pool allocate", cugraphrt.MemPool, "_allocate", 1),  # inside the captured block
    ("cuda end", _cuda, "end_capture", 0),
    ("node count", _cuda, "graph_node_count", 0),
    ("instantiate", _cuda, "instantiate", 0),
    ("replay", graphs_module, "_launch", 0),
]


def assert_clean(stream) -> None:
    assert not _capture._tls.captures, "a capture is still registered"
    assert capture_activity.active == 0
    assert _cuda.capture_info(stream.ptr)[0] == _cuda.STATUS_NONE, "the stream still captures"


def attempt(x, pool, stream):
    """One capture and replay, as a user writes it."""
    g = Graph()
    with graph(g, pool=pool, stream=stream):
        y = cupy.sin(x) * 2
        z = y + 1  # a second allocation inside the block
    g.replay()
    return g, z


@pytest.mark.parametrize("exc_type", [Injected, KeyboardInterrupt])
def test_a_fault_at_every_point_leaves_the_process_usable(exc_type, level, randn, figures,
                                                          monkeypatch):
    repeats = level.pick(short=3, long=100)
    x = randn((1 << 16,))
    cupy.sin(x) * 2 + 1
    stream = cupy.cuda.Stream(non_blocking=True)
    pool = cugraphrt.graph_pool_handle()
    attempt(x, pool, stream)[0].reset()
    baseline = pool.stats()
    device_before = device_used_bytes()
    tried = 0
    for _ in range(repeats):
        for name, owner, attribute, after in POINTS:
            original = getattr(owner, attribute)
            with monkeypatch.context() as patch:
                patch.setattr(owner, attribute, failing(original, exc_type, after))
                with pytest.raises((exc_type, CugraphrtError)):
                    g, z = attempt(x, pool, stream)
                    g.reset()
            tried += 1
            assert_clean(stream)
            gc.collect()  # a Graph that failed after its capture dies with the frame
            stats = pool.stats()
            assert stats.live_graphs == 0 and stats.active_bytes == 0, (name, stats)
            assert stats.reserved_bytes <= baseline.reserved_bytes, (name, stats)  # no growth
            g, z = attempt(x, pool, stream)  # the next capture works and is right
            cupy.testing.assert_allclose(z, cupy.sin(x) * 2 + 1, rtol=1e-6)
            g.reset()
            del z
    gc.collect()
    growth = device_used_bytes() - device_before
    figures.add(f"faults/{exc_type.__name__}", f"{tried} injected faults at {len(POINTS)} "
                                               f"points: all recovered, device "
                                               f"{growth / MiB:+.2f} MiB")
    assert growth < growth_limit(tried)


def test_failed_instantiation_is_retried_by_the_next_replay(randn, monkeypatch):
    x = randn((4096,))
    x + 1
    g = Graph()
    with monkeypatch.context() as patch:
        patch.setattr(_cuda, "instantiate", failing(_cuda.instantiate, KeyboardInterrupt))
        with pytest.raises(KeyboardInterrupt):
            with graph(g):
                y = x + 1
    # The capture succeeded; only the executable is missing: the replay instantiates it.
    fresh = randn((4096,))
    x[...] = fresh
    g.replay()
    cupy.testing.assert_allclose(y, fresh + 1)


def test_out_of_memory_at_instantiation_is_a_clear_error(randn, monkeypatch):
    x = randn((4096,))
    x * 5
    driver = _cuda.driver()
    real = driver.instantiate
    monkeypatch.setattr(driver, "instantiate", lambda *args: _cuda.OUT_OF_MEMORY)
    g = Graph()
    with pytest.raises(CugraphrtError, match="cuGraphInstantiateWithFlags failed: the device "
                                             "is out of memory"):
        with graph(g):
            y = x * 5
    monkeypatch.setattr(driver, "instantiate", real)
    g.replay()  # memory back: the instantiation is retried
    cupy.testing.assert_allclose(y, x * 5)


def test_out_of_memory_during_capture_rolls_back(randn, figures):
    x = randn((1024,))
    x * 2
    free, total = cupy.cuda.runtime.memGetInfo()
    pool = cugraphrt.graph_pool_handle()
    stream = cupy.cuda.Stream(non_blocking=True)
    with pytest.raises(PoolOutOfMemoryError) as info:
        with graph(Graph(), pool=pool, stream=stream):
            cupy.empty(total + (1 << 30), dtype=cupy.uint8)
    assert info.value.requested_bytes >= total
    assert_clean(stream)
    assert pool.stats().active_bytes == 0
    g, z = attempt(x, pool, stream)
    cupy.testing.assert_allclose(z, cupy.sin(x) * 2 + 1, rtol=1e-6)
    figures.add("faults/oom", f"capture asking {info.value.requested_bytes / MiB:.0f} MiB of "
                              f"{total / MiB:.0f} MiB: PoolOutOfMemoryError, rolled back")


def test_graph_garbage_collected_during_its_capture(randn):
    x = randn((2048,))
    x * 2
    stream = cupy.cuda.Stream(non_blocking=True)
    pool = cugraphrt.graph_pool_handle()
    with stream:
        g = Graph()
        g.capture_begin(pool=pool)
        y = x * 2
        del g, y  # the capture's owner is gone before capture_end()
        gc.collect()
    assert_clean(stream)
    assert pool.stats().active_bytes == 0
    g, z = attempt(x, pool, stream)
    cupy.testing.assert_allclose(z, cupy.sin(x) * 2 + 1, rtol=1e-6)


def test_another_graph_collected_during_a_capture_is_freed_after_it(randn):
    x = randn((1 << 16,))
    x * 2
    old = Graph()
    with graph(old):
        kept = x * 2
    old_pool = old.pool()
    g = Graph()
    with graph(g):
        del old, kept  # destroying a graph now would break a global-mode capture
        gc.collect()
        assert old_pool.stats().live_graphs == 1  # deferred until the capture ends
        y = x * 4
    assert old_pool.stats().live_graphs == 0 and old_pool.stats().reserved_bytes == 0
    g.replay()
    cupy.testing.assert_allclose(y, x * 4)


def test_pool_reset_while_a_graph_is_alive(randn):
    x = randn((1 << 16,))
    x * 2
    pool = cugraphrt.graph_pool_handle()
    g = Graph()
    with graph(g, pool=pool):
        y = cupy.cos(x) + x
    reserved = pool.stats().reserved_bytes
    assert pool.empty_cache() == 0 and cugraphrt.empty_cache() >= 0
    assert pool.stats().reserved_bytes == reserved  # the graph keeps its memory
    junk = [cupy.ones(1 << 20, dtype=cupy.float32) for _ in range(4)]
    for _ in range(3):
        fresh = randn((1 << 16,))
        x[...] = fresh
        g.replay()
        cupy.testing.assert_allclose(y, cupy.cos(fresh) + fresh, rtol=1e-6)
    assert all(bool((j == 1).all()) for j in junk)
    g.reset()
    del y
    gc.collect()
    assert pool.empty_cache() == reserved


def test_torch_capture_faults_leave_torch_usable(randn):
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA build of torch")
    import cugraphrt_torch

    lin = torch.nn.Linear(64, 64).cuda()
    x = torch.randn(8, 64, device="cuda")
    lin(x)
    for exc_type in (Injected, KeyboardInterrupt):
        with pytest.raises(exc_type):
            with torch.no_grad(), cugraphrt_torch.graph(Graph()):
                lin(x)
                raise exc_type("injected in the block")
        assert not _capture._tls.captures and capture_activity.active == 0
    g = Graph()
    with torch.no_grad(), cugraphrt_torch.graph(g):
        y = lin(x)
    fresh = torch.randn(8, 64, device="cuda")
    x.copy_(fresh)
    g.replay()
    torch.cuda.synchronize()
    assert torch.allclose(y, lin(fresh), atol=1e-5)
    assert np.isfinite(y.cpu().numpy()).all()
