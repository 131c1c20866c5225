"""PyTorch inference as a replayed CUDA graph, with torch and CuPy work in one capture.

1. `graph_module` graphs a small convnet's forward; the graphed calls equal eager calls, and
   per-call latency drops from many kernel launches to one copy and one graph launch.
2. `cugraphrt_torch.graph` captures torch work (with dropout, fresh on every replay) and a
   CuPy kernel on the same tensors, into a pool that `pool.stats()` accounts for; what the
   capture hands back (`capture.captured`, a `CapturedGraph`) replays it on torch's stream.
3. A forward that makes constants on the host and copies them to the device on every call
   (`torch.tensor(v, device=...)`, an index list), which capture refuses, is graphed whole:
   `graph_module` stages them in pinned memory the graph keeps.

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


class Normalized(torch.nn.Module):
    """Host constants in a forward, as torchvision's detection transform and Bloom's masks
    have them."""

    def __init__(self) -> None:
        super().__init__()
        self.mean, self.std = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]
        self.head = convnet()

    def forward(self, x):
        mean = torch.as_tensor(self.mean, dtype=x.dtype, device=x.device)[:, None, None]
        std = torch.as_tensor(self.std, dtype=x.dtype, device=x.device)[:, None, None]
        logits = self.head((x - mean) / std)
        return torch.maximum(logits[:, [0, 2, 4]], torch.tensor(0.0, device=x.device))


def host_constants() -> None:
    model = Normalized().cuda().eval()
    graphed = cugraphrt_torch.graph_module(model, torch.rand(BATCH, 3, 32, 32, device="cuda"))
    x = torch.rand(BATCH, 3, 32, 32, device="cuda")
    with torch.no_grad():
        torch.testing.assert_close(graphed(x), model(x), rtol=1e-3, atol=1e-3)
    print("host constants (torch.as_tensor of lists, torch.tensor(0.0), an index list): "
          "graphed whole, equal to eager")


def main() -> None:
    if not torch.cuda.is_available():
        raise SystemExit("this example needs a CUDA GPU and a CUDA build of torch")
    graphed_inference()
    torch_and_cupy_in_one_graph()
    host_constants()


if __name__ == "__main__":
    main()
