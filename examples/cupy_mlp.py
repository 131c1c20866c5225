"""A small MLP forward in pure CuPy (matmul, bias, ReLU, dropout), captured and replayed.

CuPy alone refuses cuBLAS and cuRAND inside a capture; cugraphrt captures the matrix products
itself and draws dropout masks from cugraphrt.random, which advances on the device, so every
replay draws a fresh mask — and the sequence of replays equals eager calls from the same seed.

Run: python examples/cupy_mlp.py
"""

from __future__ import annotations

import cupy
import numpy as np

import cugraphrt
import cugraphrt.random as crandom

SIZES = [256, 512, 512, 10]
DROPOUT = 0.1


def init(seed: int = 0):
    rng = np.random.default_rng(seed)
    params = []
    for fan_in, fan_out in zip(SIZES, SIZES[1:], strict=False):
        w = rng.standard_normal((fan_in, fan_out)).astype(np.float32) / np.sqrt(fan_in)
        params.append((cupy.asarray(w), cupy.zeros(fan_out, dtype=cupy.float32)))
    return params


def forward(x, params, generator):
    h = x
    for i, (w, b) in enumerate(params):
        h = h @ w + b
        if i < len(params) - 1:
            h = cupy.maximum(h, 0)
            keep = generator.bernoulli(1 - DROPOUT, size=h.shape)
            h = h * keep / (1 - DROPOUT)
    return h


def main() -> None:
    params = init()
    x = cupy.random.standard_normal((64, SIZES[0]), dtype=cupy.float32)
    generator = crandom.Generator(seed=1234)
    forward(x, params, generator)  # warm up: cuBLAS handle, kernels

    g = cugraphrt.Graph()
    with cugraphrt.graph(g):
        out = forward(x, params, generator)

    generator.manual_seed(1234)
    replays = []
    for _ in range(3):
        g.replay()
        replays.append(out.copy())
    generator.manual_seed(1234)
    for replayed in replays:
        eager = forward(x, params, generator)
        cupy.testing.assert_allclose(replayed, eager, rtol=1e-5, atol=1e-5)
    assert not cupy.allclose(replays[0], replays[1]), "dropout repeated its mask"
    print("graphed MLP forward matches eager; dropout is fresh on every replay")


if __name__ == "__main__":
    main()
