"""Graphs that always replay in the same order can share one memory pool.

Each graph below has a large temporary. With private pools each graph reserves its own; with
one shared pool the second graph reuses the first one's freed temporary, so the pair reserves
about as much as the larger of them. The safety mode checks the replay order.

Run: python examples/shared_pool.py
"""

from __future__ import annotations

import cupy

import cugraphrt

MiB = 1 << 20


def stage(x: cupy.ndarray, scale: float) -> cupy.ndarray:
    big = cupy.repeat(x, 4096) * scale  # a 64 MiB temporary that dies inside the capture
    return big.reshape(x.size, 4096).mean(axis=1) + x


def capture_pair(pool):
    x = cupy.random.rand(4096, dtype=cupy.float32)
    first, second = cugraphrt.Graph(), cugraphrt.Graph()
    with cugraphrt.graph(first, pool=pool):
        h = stage(x, 2.0)
    # A shared pool: reuse the first graph's pool (or pass the same graph_pool_handle()).
    with cugraphrt.graph(second, pool=first.pool() if pool is not None else None):
        y = stage(h, 0.5)
    reserved = first.pool().stats().reserved_bytes
    if second.pool() is not first.pool():
        reserved += second.pool().stats().reserved_bytes
    return x, (first, second), y, reserved


def main() -> None:
    cupy.repeat(cupy.ones(4096, cupy.float32), 4096).reshape(4096, 4096).mean(axis=1)
    _, _, _, separate = capture_pair(None)
    x, (first, second), y, shared = capture_pair(cugraphrt.graph_pool_handle())
    print(f"separate pools reserve {separate / MiB:.0f} MiB, "
          f"one shared pool {shared / MiB:.0f} MiB")
    assert shared < separate

    cugraphrt.set_pool_checks(True)  # replays out of capture order now raise
    fresh = cupy.random.rand(4096, dtype=cupy.float32)
    x[...] = fresh
    first.replay()
    second.replay()
    expected = stage(stage(fresh, 2.0), 0.5)
    cupy.testing.assert_allclose(y, expected, rtol=1e-5)
    try:
        second.replay()
        first.replay()  # restarting the round is fine
        second.replay()
    finally:
        cugraphrt.set_pool_checks(False)
    print(cugraphrt.memory_summary())


if __name__ == "__main__":
    main()
