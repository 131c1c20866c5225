"""Capture a chain of CuPy kernels once, replay it with one launch.

Run: python examples/capture_cupy_kernels.py   (needs a CUDA GPU: `cugraphrt info` says
whether one is usable here)
"""

from __future__ import annotations

import time

import cupy

import cugraphrt


def step(x: cupy.ndarray, steps: int = 200) -> cupy.ndarray:
    """200 chained elementwise updates: 400 small kernels when run eagerly."""
    y = x
    for i in range(steps):
        y = y * 0.999 + 0.001 * i
    return y


def main() -> None:
    x = cupy.random.rand(1024, dtype=cupy.float32)  # the graph's static input
    step(x)  # warm up: compile the kernels outside the capture

    g = cugraphrt.Graph()
    with cugraphrt.graph(g):  # captured on a side stream, allocations from g's own pool
        y = step(x)

    # New data goes into the static input in place; the replay reruns all 400 kernels.
    fresh = cupy.random.rand(1024, dtype=cupy.float32)
    x[...] = fresh
    g.replay()
    cupy.testing.assert_allclose(y, step(fresh), rtol=1e-5)

    for label, run in (("eager", lambda: step(x)), ("replay", g.replay)):
        run()
        cupy.cuda.runtime.deviceSynchronize()
        start = time.perf_counter()
        for _ in range(50):
            run()
        cupy.cuda.runtime.deviceSynchronize()
        print(f"{label:>6}: {(time.perf_counter() - start) / 50 * 1e3:.3f} ms per step")
    print("pool:", g.pool().stats())


if __name__ == "__main__":
    main()
