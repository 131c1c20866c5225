"""A framework cugraphrt has never heard of, graphed with one page of adapter code.

``examples/dlpack_framework/minitensor.py`` is a tiny array framework (DLPack in and out,
its kernels on CuPy's stream); ``examples/dlpack_framework/cugraphrt_minitensor.py`` is its
whole cugraphrt adapter, written against the public interface ``cugraphrt.adapter``
(docs/adapters.md). This
program graphs a small MLP of minitensor tensors, replays it on new inputs, then serves every
batch size from 1 to 32 with four shape buckets, checking each result against a float64
NumPy reference.

Run: python examples/new_framework.py   (needs a CUDA GPU)
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent / "dlpack_framework"))

import minitensor as mt
from cugraphrt_minitensor import make_bucketed, make_graphed


def mlp(x, w1, w2):
    return mt.softmax(mt.matmul(mt.relu(mt.matmul(x, w1)), w2))


def reference(x, w1, w2):
    h = np.maximum(x.astype(np.float64) @ w1, 0) @ w2
    e = np.exp(h - h.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def main() -> None:
    rng = np.random.default_rng(0)
    w1_host = rng.standard_normal((64, 128)).astype(np.float32) / 8
    w2_host = rng.standard_normal((128, 10)).astype(np.float32) / 11
    w1, w2 = mt.tensor(w1_host), mt.tensor(w2_host)

    x = mt.tensor(rng.standard_normal((32, 64)))
    graphed = make_graphed(mlp, (x, w1, w2))
    for _ in range(3):  # new inputs are copied into the graph's static input, then replayed
        x_host = rng.standard_normal((32, 64)).astype(np.float32)
        out = graphed(mt.tensor(x_host), w1, w2)
        np.testing.assert_allclose(out.numpy(), reference(x_host, w1_host, w2_host),
                                   rtol=1e-4, atol=1e-5)
    print("graphed: 3 replays equal the float64 reference")

    served = make_bucketed(mlp, (x, w1, w2), buckets=[4, 8, 16, 32],
                           dynamic_dim=(0, None, None))  # rows vary, weights do not
    served.capture_all(progress=False)
    for n in range(1, 33):
        x_host = rng.standard_normal((n, 64)).astype(np.float32)
        out = served(mt.tensor(x_host), w1, w2)
        assert out.shape == (n, 10)
        np.testing.assert_allclose(out.numpy(), reference(x_host, w1_host, w2_host),
                                   rtol=1e-4, atol=1e-5)
    stats = served.stats()
    print(f"buckets: sizes 1..32 served by {len(stats.buckets)} graphs, "
          f"{stats.eager_calls} eager calls, pool {stats.pool.reserved_bytes >> 20} MiB")


if __name__ == "__main__":
    main()
