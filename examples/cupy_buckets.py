"""One graphed CuPy function for every batch size, through bucketed captures.

`cugraphrt.make_graphed(fn, sample, buckets="pow2")` captures a graph per power-of-two batch
size up to the sample's (1, 2, 4, ..., 32), all in one memory pool. A call with n rows
replays the smallest bucket >= n: its input is copied into that bucket's static buffer, rows
n.. are filled with `pad` (0 by default), and outputs with the bucket's rows come back as
views of their first n rows.

Padding is invisible when rows are independent (an MLP: output row i depends on input row i
only). When a function combines rows, the pad rows take part, so either

1. pick a pad that is neutral for the combination: +inf for a minimum over the batch (the
   default 0 would win the minimum), or
2. pass a mask: a masked mean over the batch gets a mask whose pad rows are 0, so they drop
   out of both the sum and the count.

Run: python examples/cupy_buckets.py
"""

from __future__ import annotations

import functools
import time

import cupy
import numpy as np

import cugraphrt

MAX_BATCH, WIDTH, FEATURES = 32, 512, 100
rng = np.random.default_rng(0)


def rand(*shape: int, low: float = -1.0, high: float = 1.0) -> cupy.ndarray:
    return cupy.asarray(rng.uniform(low, high, shape).astype(np.float32))


def mlp(layers, x):
    for i, (w, b) in enumerate(layers):
        x = x @ w + b
        if i < len(layers) - 1:
            x = cupy.maximum(x, 0)
    return x


def batch_min(x):
    return x.min(axis=0)


def masked_mean(x, mask):
    weights = mask[:, None]
    return (x * weights).sum(axis=0) / weights.sum()


def per_call_us(fn, requests) -> float:
    for x in requests:  # warm up: kernels, and the first use of every bucket
        fn(x)
    cupy.cuda.Device().synchronize()
    start = time.perf_counter()
    for x in requests:
        fn(x)
    cupy.cuda.Device().synchronize()
    return (time.perf_counter() - start) / len(requests) * 1e6


def independent_rows() -> None:
    layers = [(rand(WIDTH, WIDTH) * WIDTH ** -0.5, rand(WIDTH) * 0.1) for _ in range(4)]
    # Weights are bound, not passed: every array argument's first dimension is dynamic.
    forward = functools.partial(mlp, layers)
    graphed = cugraphrt.make_graphed(forward, (rand(MAX_BATCH, WIDTH),), buckets="pow2")
    graphed.capture_all()  # or let each bucket be captured on its first use
    for n in range(1, MAX_BATCH + 1):
        x = rand(n, WIDTH)
        cupy.testing.assert_allclose(graphed(x), forward(x), rtol=1e-4, atol=1e-4)
    sizes = np.random.RandomState(0).randint(1, MAX_BATCH + 1, size=300)
    requests = [rand(int(n), WIDTH) for n in sizes]
    eager_us, graphed_us = per_call_us(forward, requests), per_call_us(graphed, requests)
    print(f"MLP, batch sizes 1..{MAX_BATCH}: every size equals eager; per call over "
          f"{len(requests)} mixed sizes: eager {eager_us:.0f} us, bucketed {graphed_us:.0f} us")
    print(graphed.stats())


def neutral_pad() -> None:
    sample = rand(MAX_BATCH, FEATURES, low=1.0, high=2.0)
    graphed = cugraphrt.make_graphed(batch_min, (sample,), buckets="pow2", pad=float("inf"))
    zero_padded = cugraphrt.make_graphed(batch_min, (sample,), buckets="pow2")
    for n in range(1, MAX_BATCH + 1):
        x = rand(n, FEATURES, low=1.0, high=2.0)
        cupy.testing.assert_allclose(graphed(x), x.min(axis=0))
    x = rand(3, FEATURES, low=1.0, high=2.0)  # padded to 4 rows: one pad row
    assert float(zero_padded(x).max()) == 0.0, "with pad=0 the pad row wins every minimum"
    print("batch minimum: pad=inf equals eager at every size; the default pad=0 gives 0")


def masked_rows() -> None:
    sample = (rand(MAX_BATCH, FEATURES), cupy.ones(MAX_BATCH, dtype=cupy.float32))
    graphed = cugraphrt.make_graphed(masked_mean, sample, buckets="pow2")
    for n in (1, 3, 17, 32):
        x = rand(n, FEATURES)
        counted = rng.random(n) < 0.7
        counted[0] = True  # at least one row counts
        mean = graphed(x, cupy.asarray(counted.astype(np.float32)))
        cupy.testing.assert_allclose(mean, cupy.asnumpy(x)[counted].mean(axis=0), rtol=1e-5,
                                     atol=1e-6)
    print("masked mean over the batch: pad rows get mask 0 and never count")


def main() -> None:
    independent_rows()
    neutral_pad()
    masked_rows()


if __name__ == "__main__":
    main()
