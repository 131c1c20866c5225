"""The cuBLAS workspace of captures: one pool-held block per stream rank (no GPU needed).

A stand-in for the core's Capture object carries what ``_cublas._workspace_for`` reads (pool,
token, device, keepalive and finish hooks); the pool runs on the fake backing allocator.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from cugraphrt import MemPool
from cugraphrt._libraries import cublas as _cublas

from .fakes import FakeBackingAllocator

WORKSPACE_BYTES = 1 << 20
STREAM_A, STREAM_B, STREAM_C = 0xA000, 0xB000, 0xC000


@pytest.fixture(autouse=True)
def _workspace_size(monkeypatch):
    # The default size needs the device's compute capability; the override needs no GPU.
    monkeypatch.setenv("CUGRAPHRT_CUBLAS_WORKSPACE_BYTES", str(WORKSPACE_BYTES))


def begin(pool):
    token = object()
    pool._begin_capture(token)
    return SimpleNamespace(pool=pool, token=token, device_id=0, keepalive=[],
                           finish_hooks=[])


def end(capture, succeeded=True):
    seq = capture.pool._add_graph() if succeeded else None
    for hook in capture.finish_hooks:
        hook(capture)
    capture.pool._end_capture(capture.token, succeeded)
    return seq


def test_captures_of_one_pool_share_a_workspace_per_stream_rank():
    backing = FakeBackingAllocator()
    pool = MemPool(backing=backing)
    first = begin(pool)
    a = _cublas._workspace_for(first, STREAM_A)
    assert a[1] == WORKSPACE_BYTES
    assert _cublas._workspace_for(first, STREAM_A) == a
    b = _cublas._workspace_for(first, STREAM_B)  # a forked stream of the same capture
    assert b[0] != a[0] and abs(b[0] - a[0]) >= WORKSPACE_BYTES, "streams share a workspace"
    g1 = end(first)
    assert first.keepalive == [], "the graph would keep the capture's workspace lookup"

    second = begin(pool)  # another capture stream: its first GEMM stream is rank 0 too
    assert _cublas._workspace_for(second, STREAM_C) == a
    assert _cublas._workspace_for(second, STREAM_A) == b
    g2 = end(second)
    assert pool.stats().active_bytes == 2 * WORKSPACE_BYTES  # not one per capture

    pool._remove_graph(g1)
    assert pool.stats().active_bytes == 2 * WORKSPACE_BYTES, "g2 still replays with them"
    pool._remove_graph(g2)
    assert pool.stats().active_bytes == 0
    pool.empty_cache()
    assert backing.live == {}


def test_private_pool_returns_the_workspace_with_its_graph():
    backing = FakeBackingAllocator()
    pool = MemPool(backing=backing, _private=True)
    capture = begin(pool)
    _cublas._workspace_for(capture, STREAM_A)
    seq = end(capture)
    assert pool.stats().reserved_bytes == 2 << 20
    pool._remove_graph(seq)
    assert backing.live == {} and pool.stats().active_bytes == 0


def test_a_failed_capture_returns_its_workspace():
    backing = FakeBackingAllocator()
    pool = MemPool(backing=backing)
    capture = begin(pool)
    _cublas._workspace_for(capture, STREAM_A)
    end(capture, succeeded=False)
    assert pool.stats().active_bytes == 0 and backing.live == {}
