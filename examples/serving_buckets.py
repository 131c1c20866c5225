"""Serve an image model on a stream of mixed batch sizes with bucketed CUDA graphs.

A server sees whatever batch size its requests add up to. A graph captured at one size
replays that size only; `graph_module(model, sample, buckets="pow2")` captures one graph per
power-of-two batch size up to the sample's (1, 2, 4, ..., 32), all in one memory pool. A
request of n images replays the smallest bucket >= n on zero-padded input and returns the
first n rows of the output. That is correct because in eval mode each image's output
depends on that image only (see examples/cupy_buckets.py for functions that mix rows).

Uses torchvision's resnet18 (random weights) when torchvision is installed, a small conv
net otherwise.

Run: python examples/serving_buckets.py   (needs a CUDA GPU and a CUDA build of torch)
"""

from __future__ import annotations

import time
import warnings

import cugraphrt_torch
import numpy as np
import torch

MAX_BATCH, IMAGE, REQUESTS = 32, 64, 200


def build_model() -> tuple[torch.nn.Module, str]:
    try:
        import torchvision
    except (ImportError, RuntimeError):  # absent, or built for another torch
        nn = torch.nn
        model = nn.Sequential(
            nn.Conv2d(3, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(),
            nn.Conv2d(32, 64, 3, stride=2, padding=1), nn.BatchNorm2d(64), nn.ReLU(),
            nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(64, 10))
        return model, "a small conv net (torchvision is not installed)"
    return torchvision.models.resnet18(weights=None), "torchvision resnet18"


def images(n: int) -> torch.Tensor:
    return torch.randn(n, 3, IMAGE, IMAGE, device="cuda")


def per_call_us(fn, requests) -> float:
    for x in requests:  # warm up: cuDNN's choices for every size, kernels
        fn(x)
    torch.cuda.synchronize()
    start = time.perf_counter()
    for x in requests:
        fn(x)
    torch.cuda.synchronize()
    return (time.perf_counter() - start) / len(requests) * 1e6


@torch.no_grad()
def main() -> None:
    if not torch.cuda.is_available():
        raise SystemExit("this example needs a CUDA GPU and a CUDA build of torch")
    # Exact float32 convolutions, so that the graphs can be checked tightly against eager
    # (TF32 may round differently at different batch sizes); buckets do not need this.
    torch.backends.cudnn.allow_tf32 = False
    torch.manual_seed(0)
    model, name = build_model()
    model = model.cuda().eval()  # eval: batch norm uses its running statistics, per image

    served = cugraphrt_torch.graph_module(model, images(MAX_BATCH), buckets="pow2")
    start = time.perf_counter()
    # What the whole family will reserve, known from its largest bucket (captured now): a
    # server sizes its caches from the memory left (docs/shapes.md, "Sizing memory").
    predicted = served.predict_reserved_bytes()
    served.capture_all()  # a progress bar on a terminal; without it, buckets capture lazily
    print(f"{name}: captured buckets {served.buckets} in {time.perf_counter() - start:.2f} s")
    reserved = served.stats().pool.reserved_bytes
    print(f"graph memory: predicted {predicted / 2**20:.1f} MiB, reserved "
          f"{reserved / 2**20:.1f} MiB")
    assert abs(reserved / predicted - 1) <= 0.05, "the prediction holds within 5%"

    for n in (1, 3, 8, 17, 32):
        x = images(n)
        torch.testing.assert_close(served(x), model(x), rtol=1e-3, atol=1e-3)

    sizes = np.random.RandomState(0).randint(1, MAX_BATCH + 1, size=REQUESTS)
    requests = [images(int(n)) for n in sizes]
    eager_us, served_us = per_call_us(model, requests), per_call_us(served, requests)
    print(f"{REQUESTS} requests of 1..{MAX_BATCH} images: eager {eager_us:.0f} us per call, "
          f"bucketed graphs {served_us:.0f} us ({eager_us / served_us:.1f}x)")
    assert served.stats().eager_calls == 0, "every request fit a bucket"

    # Above the largest bucket: the model runs eagerly, with a warning naming the reason.
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        big = images(MAX_BATCH + 8)
        torch.testing.assert_close(served(big), model(big), rtol=1e-3, atol=1e-3)
    assert caught, "a batch above the largest bucket warns"
    print(f"a batch of {MAX_BATCH + 8} ran eagerly: {caught[0].message}")
    print(served.stats())


if __name__ == "__main__":
    main()
