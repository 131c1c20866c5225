"""Replay a graph on new input buffers without copying them: inputs="rebind".

A graphed function usually copies each call's arrays into the arrays it was captured with.
With ``inputs="rebind"`` cugraphrt points the graph at the call's own arrays instead: for a
256 MiB input that saves a 256 MiB copy per call. ``f.rebinding.explain(...)`` says where the
input's address was found in the graph (or why the callable copies instead).

Run: python examples/rebind_inputs.py   (needs a CUDA GPU; docs/rebinding.md explains the rules)
"""

from __future__ import annotations

import time

import cupy

import cugraphrt

ROWS, COLS = 16384, 4096  # 256 MiB of float32


def column_stats(x: cupy.ndarray) -> tuple[cupy.ndarray, cupy.ndarray]:
    """Mean and maximum of every column of a large array (reads it once each)."""
    return x.mean(axis=0), x.max(axis=0)


def per_call_ms(fn, inputs, calls: int = 20) -> float:
    fn(inputs[0])
    cupy.cuda.Device().synchronize()
    start = time.perf_counter()
    for i in range(calls):
        fn(inputs[i % len(inputs)])
    cupy.cuda.Device().synchronize()
    return (time.perf_counter() - start) / calls * 1e3


def main() -> None:
    inputs = [cupy.random.rand(ROWS, COLS, dtype=cupy.float32) for _ in range(3)]
    sample = inputs[0].copy()
    column_stats(sample)  # compile the kernels outside the capture

    copying = cugraphrt.make_graphed(column_stats, (sample,))
    rebinding = cugraphrt.make_graphed(column_stats, (sample,), inputs="rebind")
    print(rebinding.rebinding.explain(["x"]))

    for x in inputs:  # each call reads the array it is given, not a copy of it
        mean, peak = rebinding(x)
        cupy.testing.assert_allclose(mean, x.mean(axis=0), rtol=1e-5)
        cupy.testing.assert_array_equal(peak, x.max(axis=0))
        cupy.testing.assert_allclose(copying(x)[0], mean, rtol=1e-6)

    copy_ms = per_call_ms(copying, inputs)
    rebind_ms = per_call_ms(rebinding, inputs)
    print(f"per call: copy {copy_ms:.3f} ms, rebind {rebind_ms:.3f} ms "
          f"({rebind_ms / copy_ms:.2f}x)")


if __name__ == "__main__":
    main()
