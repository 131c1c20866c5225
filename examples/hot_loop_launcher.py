"""A hot loop of small graphs: Graph.launcher() against Graph.replay().

A launcher is the graph's launch as one C-level call (no Python frame): for loops where the
launch itself is the cost, such as a decode step of a small model. It is bound to a stream
when it is made and follows the graph: after reset() it raises instead of launching.

Run: python examples/hot_loop_launcher.py
"""

from __future__ import annotations

import time

import cupy

import cugraphrt


def step(state: cupy.ndarray, weights: cupy.ndarray) -> None:
    """One recurrent update, in place: a few small kernels."""
    cupy.tanh(state @ weights, out=state)


def main() -> None:
    rng = cupy.random.default_rng(0)
    weights = rng.standard_normal((64, 64), dtype=cupy.float32) / 8
    state = rng.standard_normal((1, 64), dtype=cupy.float32)
    stream = cupy.cuda.Stream(non_blocking=True)
    with stream:
        step(state.copy(), weights)  # warm up: cuBLAS handle and kernels outside the capture
        g = cugraphrt.Graph()
        with cugraphrt.graph(g, stream=stream):
            step(state, weights)
        launch = g.launcher()  # bound to `stream`, CuPy's current stream now

        # The launcher computes what eager computes, step after step.
        start = rng.standard_normal((1, 64), dtype=cupy.float32)
        state[...] = start
        expected = start.copy()
        for _ in range(100):
            launch()
            step(expected, weights)
        cupy.testing.assert_allclose(state, expected, rtol=1e-4, atol=1e-5)

        for label, run in (("replay()", g.replay), ("launcher", launch)):
            run()
            stream.synchronize()
            begin = time.perf_counter()
            for _ in range(1000):
                run()
            issued = time.perf_counter() - begin
            stream.synchronize()
            print(f"{label:>9}: {issued / 1000 * 1e6:.2f} us of host time per launch")

    g.reset()  # the launcher does not outlive the graph's executable
    try:
        launch()
    except cugraphrt.ReplayError as exc:
        print("after reset:", exc)
    else:
        raise AssertionError("a launcher of a reset graph launched")


if __name__ == "__main__":
    main()
