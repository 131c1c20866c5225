"""PyTorch inference as a replayed CUDA graph, with torch and CuPy work in one capture.

1. `graph_module` graphs a small convnet's forward; the graphed calls equal eager calls, and
   per-call latency drops from many kernel launches to one copy and one graph launch.
2. `cugraphrt_torch.graph` captures torch work (with dropout, fresh on every replay) and a
   CuPy kernel on the same tensors, into a pool that `pool.stats()` accounts for; what the
   capture hands back (`capture.captured`, a `CapturedGraph`) replays it on torch's stream.

Run: python examples/torch_inference.py   (needs a CUDA GPU and a CUDA build of torch)
"""

from __future__ import annotations

import time

import cugraphrt_torch
import cupy
import torch

import cugraphrt

BATCH = 8


def convnet() -> torch.nn.Module:
    nn = torch.nn
    return nn.Sequential(
        nn.Conv2d(3, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(),
        nn.Conv2d(32, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(32, 10),
    )


def per_call_us(fn, inputs, repeats: int = 200) -> float:
    for x in inputs[:3]:
        fn(x)
    torch.cuda.synchronize()
    start = time.perf_counter()
    for i in range(repeats):
        fn(inputs[i % len(inputs)])
    torch.cuda.synchronize()
    return (time.perf_counter() - start) / repeats * 1e6


def graphed_inference() -> None:
    torch.manual_seed(0)
    model = convnet().cuda().eval()
    sample = torch.randn(BATCH, 3, 32, 32, device="cuda")
    graphed = cugraphrt_torch.graph_module(model, sample)

    inputs = [torch.randn(BATCH, 3, 32, 32, device="cuda") for _ in range(4)]
    with torch.no_grad():
        for x in inputs:
            torch.testing.assert_close(graphed(x), model(x), rtol=1e-3, atol=1e-3)
        eager_us = per_call_us(model, inputs)
    graphed_us = per_call_us(graphed, inputs)
    print(f"graph_module: graphed equals eager on {len(inputs)} fresh batches")
    print(f"  per call: eager {eager_us:.1f} us, graphed {graphed_us:.1f} us")
    print(f"  pool: {graphed.graph.pool()}")


def torch_and_cupy_in_one_graph() -> None:
    pool = cugraphrt.graph_pool_handle()
    x = torch.randn(1 << 16, device="cuda")
    shift = cupy.ElementwiseKernel("float32 y", "float32 z", "z = y > 0 ? y : 0.1f * y",
                                   "leaky")

    def work():
        y = torch.nn.functional.dropout(torch.sin(x), p=0.5, training=True)
        z = shift(cugraphrt_torch.to_cupy(y))  # a CuPy kernel on torch's tensor, no copy
        return cugraphrt_torch.from_cupy(z) * 2

    work()  # warm up: compile the CuPy kernel outside the capture
    g = cugraphrt.Graph()
    with cugraphrt_torch.graph(g, pool=pool) as capture:
        out = work()
    captured = capture.captured  # the graph, its replays, its memory, its number in the pool

    torch.cuda.manual_seed(7)
    masks = []
    for _ in range(3):
        x.copy_(torch.randn_like(x))
        captured.on_torch_stream()  # g.replay() on torch's current stream
        torch.cuda.synchronize()
        masks.append(out == 0)
    fresh = not torch.equal(masks[0], masks[1]) and not torch.equal(masks[1], masks[2])
    print(f"graph: torch + CuPy in one capture; dropout mask fresh per replay: {fresh}")
    print(f"  pool holds torch's memory too: {pool.stats().active_bytes} bytes active")
    print(f"  {captured!r}: graph {captured.graph}")


def main() -> None:
    if not torch.cuda.is_available():
        raise SystemExit("this example needs a CUDA GPU and a CUDA build of torch")
    graphed_inference()
    torch_and_cupy_in_one_graph()


if __name__ == "__main__":
    main()
