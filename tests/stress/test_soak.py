"""Soak: thousands of capture/replay/reset cycles must not grow device or host memory."""

from __future__ import annotations

import gc

import cupy
import numpy as np
import pytest

import cugraphrt
from cugraphrt import Graph, graph

from ._measure import MiB, device_used_bytes, growth_limit, host_rss_bytes

#: Host growth allowed per 1,000 torch capture/replay/reset cycles.
TORCH_HOST_PER_1000_CYCLES = 1 * MiB

pytestmark = pytest.mark.gpu


def soak(cycle, cycles: int, warm_up: int = 50, settle=None) -> tuple[int, int]:
    """Run ``cycle`` ``cycles`` times after a warm-up; device and host growth in bytes.

    ``settle()``, if given, runs before each measurement (torch: empty its cache).
    """
    for _ in range(warm_up):  # kernels, streams, CuPy's cache, Python's arenas settle
        cycle()
    gc.collect()
    if settle is not None:
        settle()
    device_before, host_before = device_used_bytes(), host_rss_bytes()
    for _ in range(cycles):
        cycle()
    gc.collect()
    if settle is not None:
        settle()
    return device_used_bytes() - device_before, host_rss_bytes() - host_before


def check(figures, name: str, cycles: int, device: int, host: int, *,
          host_limited: bool = True, host_limit: float | None = None) -> None:
    limit = growth_limit(cycles)
    host_limit = limit if host_limit is None else host_limit
    figures.add(f"soak/{name}", f"{cycles} cycles: device {device / MiB:+.2f} MiB (limit "
                                f"{limit / MiB:.0f} MiB), host {host / MiB:+.2f} MiB (limit "
                                f"{host_limit / MiB:.2f} MiB)")
    assert device < limit, f"device memory grew by {device / MiB:.2f} MiB"
    if host_limited:
        assert host <= host_limit, (f"host memory grew by {host / MiB:.2f} MiB over {cycles} "
                                    f"cycles (limit {host_limit / MiB:.2f} MiB)")


def test_cupy_capture_replay_reset_cycles(level, randn, figures):
    cycles = level.pick(short=500, long=10_000)
    x, w = randn((256, 256)), randn((256, 256))
    x @ w
    pool = cugraphrt.graph_pool_handle()
    state = {"n": 0}

    def cycle():
        state["n"] += 1
        shared = state["n"] % 2 == 0  # alternate private pools and one shared pool
        g = Graph()
        with graph(g, pool=pool if shared else None):
            y = cupy.tanh(x @ w) * 2 + 1
        g.replay()
        g.replay()
        g.reset()
        del y

    device, host = soak(cycle, cycles)
    fresh = randn((256, 256))
    g = Graph()
    with graph(g):
        y = cupy.tanh(x @ w) * 2 + 1
    x[...] = fresh
    g.replay()
    cupy.testing.assert_allclose(y, cupy.tanh(fresh @ w) * 2 + 1, rtol=1e-4, atol=1e-4)
    check(figures, "cupy", cycles, device, host)


def test_random_and_make_graphed_cycles(level, randn, figures):
    cycles = level.pick(short=300, long=5000)
    from cugraphrt import random as crandom

    x = randn((1024,))

    def step(v):
        return v * crandom.rand(1024, dtype=np.float32) + 1

    def cycle():
        fn = cugraphrt.make_graphed(step, (x,), num_warmup_iters=1)
        out = fn(x)
        assert out.shape == (1024,)
        fn.graph.reset()

    device, host = soak(cycle, cycles, warm_up=20)
    check(figures, "make_graphed+random", cycles, device, host)


def _torch_cycle_setup(torch):
    import cugraphrt_torch

    model = torch.nn.Sequential(torch.nn.Linear(128, 256), torch.nn.GELU(),
                                torch.nn.Dropout(0.1), torch.nn.Linear(256, 64)).cuda()
    x = torch.randn(32, 128, device="cuda")
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        model(x)
    torch.cuda.current_stream().wait_stream(stream)

    def capture_replay_reset():
        g = Graph()
        with torch.no_grad(), cugraphrt_torch.graph(g):
            y = model(x)
        g.replay()
        g.reset()
        del y

    return capture_replay_reset


def _require_torch_cuda():
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA build of torch")
    return torch


def test_torch_capture_replay_reset_cycles(level, figures):
    torch = _require_torch_cuda()
    cycles = level.pick(short=1000, long=5000)
    capture_replay_reset = _torch_cycle_setup(torch)
    state = {"n": 0}

    def cycle():
        capture_replay_reset()
        state["n"] += 1
        if state["n"] % 50 == 0:
            # Torch keeps the segments of a reset graph's private pool in its cache until
            # empty_cache (see the expected failure below and docs/reliability.md).
            torch.cuda.empty_cache()

    device, host = soak(cycle, cycles, warm_up=20, settle=torch.cuda.empty_cache)
    # The host bound of issue 26: at most 1 MiB per 1,000 torch captures. It was 48 KiB per
    # capture before cugraphrt_torch emptied torch's pinned-host cache after captures.
    check(figures, "torch (empty_cache every 50 cycles)", cycles, device, host,
          host_limit=TORCH_HOST_PER_1000_CYCLES * cycles / 1000)


@pytest.mark.xfail(strict=True, reason="known: torch keeps the segments of each reset graph's "
                   "private pool cached until torch.cuda.empty_cache() (measured +2 MiB per "
                   "cycle on an H100); cugraphrt_torch.capture._alloc would have to release them")
def test_torch_cycles_return_memory_without_empty_cache():
    torch = _require_torch_cuda()
    capture_replay_reset = _torch_cycle_setup(torch)
    device, _ = soak(capture_replay_reset, 100, warm_up=10)
    assert device < growth_limit(100), f"device memory grew by {device / MiB:.0f} MiB"
