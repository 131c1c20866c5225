"""Capture and replay in several threads at once (thread_local mode).

A serving process captures on worker threads while the main thread keeps computing
eagerly. Each worker uses its own non-blocking stream; "thread_local" lets the other
threads allocate and synchronize their own streams while a capture runs. What no thread may
do meanwhile is synchronize the whole device (cupy.cuda.Device().synchronize(),
torch.cuda.synchronize()): that invalidates every capture underway (docs/reliability.md).
"""

from __future__ import annotations

import threading

import cupy
import numpy as np

import cugraphrt


def worker(index: int, barrier: threading.Barrier, results: list) -> None:
    stream = cupy.cuda.Stream(non_blocking=True)
    rng = np.random.default_rng(index)
    with stream:
        x = cupy.asarray(rng.standard_normal(4096).astype(np.float32))
        cupy.tanh(x) * 2 + 1  # warm up: kernels compiled before capturing
        stream.synchronize()
    barrier.wait()  # all threads capture at the same time
    g = cugraphrt.Graph()
    with cugraphrt.graph(g, stream=stream, capture_error_mode="thread_local"):
        y = cupy.tanh(x) * 2 + 1
    fresh = rng.standard_normal(4096).astype(np.float32)
    with stream:
        x.set(fresh)
        g.replay(stream)
        results[index] = np.allclose(y.get(), np.tanh(fresh) * 2 + 1, rtol=1e-5, atol=1e-6)


def main() -> None:
    count = 8
    barrier = threading.Barrier(count)
    results = [False] * count
    threads = [threading.Thread(target=worker, args=(i, barrier, results)) for i in range(count)]
    for t in threads:
        t.start()
    # Meanwhile the main thread computes eagerly (its own stream, its own allocations).
    with cupy.cuda.Stream(non_blocking=True):
        for n in range(20):
            a = cupy.arange(1000 + n, dtype=cupy.float32)
            assert float((a * 2).sum()) == float(a.sum()) * 2
    for t in threads:
        t.join()
    assert all(results), results
    print(f"{count} threads captured and replayed their graphs; eager work ran beside them")


if __name__ == "__main__":
    main()
