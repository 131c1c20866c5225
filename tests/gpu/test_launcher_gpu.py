"""Graph.launcher and Graph.replay's fast path on a GPU: real launches checked against eager
CuPy, the launcher's contract (stream, reset, instantiate, lifetime, pool checks), and the
Python frames each path runs with CuPy's real streams."""

from __future__ import annotations

import gc
import sys

import pytest

import cugraphrt
from cugraphrt import PoolOrderError, ReplayError

pytestmark = pytest.mark.gpu


def _frames(fn) -> list[str]:
    """The Python frames ``fn()`` runs (``fn``'s own first, if it is Python)."""
    frames: list[str] = []

    def hook(frame, event, arg):
        if event == "call":
            frames.append(frame.f_code.co_qualname)

    sys.setprofile(hook)
    try:
        fn()
    finally:
        sys.setprofile(None)
    return frames


def _captured(randn, keep_graph=False, pool=None):
    import cupy

    x = randn((1 << 16,))
    cupy.sin(x) * 3 + 1  # kernels loaded before the capture
    g = cugraphrt.Graph(keep_graph=keep_graph)
    with cugraphrt.graph(g, pool=pool):
        y = cupy.sin(x) * 3 + 1
    return g, x, y


def _check(x, y, randn, launch, stream=None) -> None:
    import cupy

    for _ in range(3):
        x[...] = randn(x.shape)
        expected = cupy.sin(x) * 3 + 1
        cupy.cuda.runtime.deviceSynchronize()
        launch()
        if stream is not None:
            stream.synchronize()
        cupy.cuda.runtime.deviceSynchronize()
        cupy.testing.assert_allclose(y, expected, rtol=1e-6)


def test_launcher_replays_like_replay_with_no_python_frame(randn):
    import cupy

    g, x, y = _captured(randn)
    stream = cupy.cuda.Stream(non_blocking=True)
    with stream:
        launch = g.launcher()  # binds `stream`, CuPy's current stream now
        assert launch.stream_ptr == stream.ptr
        _check(x, y, randn, launch, stream)
        assert _frames(launch) == []
        # Replay's fast path with CuPy's real streams: one frame, the method itself.
        assert _frames(g.replay) == ["Graph.replay"]
    _check(x, y, randn, launch, stream)  # outside the block: still on `stream`
    g.reset()


def test_launcher_after_reset_and_instantiate(randn):
    g, x, y = _captured(randn, keep_graph=True)
    launch = g.launcher()
    _check(x, y, randn, launch)
    g.instantiate()  # the old executable is destroyed: the launcher runs the new one
    _check(x, y, randn, launch)
    g.reset()
    with pytest.raises(ReplayError, match="the launcher's graph was reset"):
        launch()


def test_launcher_keeps_its_graph_alive(randn):
    g, x, y = _captured(randn)
    launch = g.launcher()
    del g
    gc.collect()
    _check(x, y, randn, launch)
    launch.graph.reset()


def test_launcher_follows_pool_checks(randn):
    pool = cugraphrt.graph_pool_handle()
    made = [_captured(randn, pool=pool) for _ in range(3)]
    launches = [g.launcher() for g, _, _ in made]
    cugraphrt.set_pool_checks(True)
    try:
        launches[0]()
        with pytest.raises(PoolOrderError, match="graph #3 of the 3 graphs"):
            launches[2]()
    finally:
        cugraphrt.set_pool_checks(False)
    launches[2]()  # checks off: launched without a check
    for g, _, _ in made:
        g.reset()
