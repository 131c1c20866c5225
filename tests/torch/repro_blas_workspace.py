"""A graph's matmul workspace must survive torch clearing its cuBLAS workspace cache.

``torch.compile``'s CUDA graph trees call ``torch._C._cuda_clearCublasWorkspaces()`` around
every warm-up and recording, and ``torch.cuda.graph`` then calls ``empty_cache()``. A graph
whose split-K matmul used torch's cached workspace would replay into freed memory (an illegal
address on an H100 with torch 2.11). Exits 0 when the replay is right and nothing else was
written. Run: python tests/torch/repro_blas_workspace.py
"""

from __future__ import annotations

import cugraphrt_torch
import torch

import cugraphrt


def check(dtype: torch.dtype, m: int, k: int, n: int) -> None:
    a = torch.randn(m, k, device="cuda", dtype=dtype)
    b = torch.randn(k, n, device="cuda", dtype=dtype)
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        for _ in range(3):
            a @ b  # eager runs put a workspace for this stream into torch's cache
    torch.cuda.synchronize()
    graph = cugraphrt.Graph()
    with cugraphrt_torch.graph(graph, stream=stream):
        product = a @ b
    torch._C._cuda_clearCublasWorkspaces()  # what the graph trees do around each recording
    torch.cuda.empty_cache()  # what torch.cuda.graph does on entry
    fillers = [torch.full((1 << 22,), 7.0, device="cuda") for _ in range(8)]
    a.copy_(torch.randn_like(a))
    stream.wait_stream(torch.cuda.current_stream())  # the copy ran on the current stream
    graph.replay(stream=stream)
    torch.cuda.synchronize()
    expected = (a.double() @ b.double()).to(dtype)
    torch.testing.assert_close(product.float(), expected.float(), rtol=2e-2,
                               atol=2e-2 * k ** 0.5)
    assert all(bool((f == 7.0).all()) for f in fillers), "the replay wrote into other memory"


if __name__ == "__main__":
    check(torch.float32, 64, 1 << 20, 64)  # shapes whose matmuls split K over a workspace
    check(torch.bfloat16, 16, 1 << 21, 16)
    print("ok")
