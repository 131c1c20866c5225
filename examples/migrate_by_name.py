"""Porting CUDA-graph programs to cugraphrt by changing names only (docs/migrating.md).

1. A torch.cuda program: warm up, `CUDAGraph.capture_begin()` / `capture_end()` on a side
   stream, a second graph sharing the first one's pool through `graph(..., pool=g.pool())`,
   replays with new data. It runs once with `torch.cuda`'s names and once with
   `cugraphrt_torch`'s: the code is the same function, the namespace is an argument.
2. A CuPy program: `Stream.begin_capture()` / `end_capture()`, `launch()`. It runs once with
   `cupy.cuda.Stream` and once with `cugraphrt.Stream`. With cugraphrt it may also capture a
   matrix product, which CuPy refuses inside a capture, and a first-time FFT whose plan then
   belongs to the graph (its work area in the graph's pool, out of CuPy's plan cache).

Both ports give the eager results, and cugraphrt's graphs report their pool's memory.

Run: python examples/migrate_by_name.py   (needs a CUDA GPU and a CUDA build of torch)
"""

from __future__ import annotations

import cugraphrt_torch
import cupy
import numpy as np
import torch

import cugraphrt


def torch_program(cuda) -> tuple[torch.Tensor, object]:
    """A torch.cuda graph program; ``cuda`` is ``torch.cuda`` or ``cugraphrt_torch``."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.GELU(),
                                torch.nn.Linear(512, 64)).cuda().eval()
    static_x = torch.randn(32, 256, device="cuda")
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.no_grad(), torch.cuda.stream(side):
        model(static_x)  # warm up on the capture stream
        g = cuda.CUDAGraph()
        g.capture_begin()
        hidden = model(static_x)
        g.capture_end()
        g2 = cuda.CUDAGraph()
        with cuda.graph(g2, pool=g.pool(), stream=side):  # shares g's memory
            scores = torch.softmax(hidden, dim=1)
    torch.cuda.current_stream().wait_stream(side)
    outputs = []
    for _ in range(3):
        batch = torch.randn(32, 256, device="cuda")
        static_x.copy_(batch)
        g.replay()  # on torch's current stream, in capture order
        g2.replay()
        with torch.no_grad():
            expected = torch.softmax(model(batch), dim=1)
        torch.testing.assert_close(scores, expected)
        outputs.append(scores.clone())
    return torch.stack(outputs), g.pool()


def cupy_program(Stream, *, extras: bool) -> cupy.ndarray:
    """A CuPy begin_capture program; ``Stream`` is ``cupy.cuda.Stream`` or ``cugraphrt.Stream``."""
    x = cupy.asarray(np.random.default_rng(1).standard_normal(4096))
    w = cupy.asarray(np.random.default_rng(2).standard_normal((64, 64)))
    cupy.sin(x) * 2 + 1  # warm up the kernels
    s = Stream(non_blocking=True)
    with s:
        s.begin_capture()
        y = cupy.sin(x) * 2 + 1
        if extras:
            m = w @ w.T  # CuPy raises NotImplementedError for cuBLAS inside a capture
            spectrum = cupy.fft.fft(x[:3000])  # its plan is created here: the graph's own
        g = s.end_capture()
    fresh = cupy.asarray(np.random.default_rng(3).standard_normal(4096))
    x[...] = fresh
    s.wait_event(cupy.cuda.get_current_stream().record())  # s is non-blocking: copy first
    g.launch(s)
    s.synchronize()
    cupy.testing.assert_allclose(y, cupy.sin(fresh) * 2 + 1)
    if extras:
        np.testing.assert_allclose(cupy.asnumpy(m), cupy.asnumpy(w) @ cupy.asnumpy(w).T,
                                   rtol=1e-10)
        np.testing.assert_allclose(cupy.asnumpy(spectrum),
                                   np.fft.fft(cupy.asnumpy(fresh)[:3000]), rtol=1e-8,
                                   atol=1e-8)
        print(f"cugraphrt.Stream: matmul and a new FFT plan captured; the graph's pool holds "
              f"{g.pool().stats().active_bytes} bytes")
    return y


def main() -> None:
    with_torch, _ = torch_program(torch.cuda)
    with_cugraphrt, pool = torch_program(cugraphrt_torch)
    torch.testing.assert_close(with_torch, with_cugraphrt)
    print(f"torch.cuda -> cugraphrt_torch: same results; pool {pool.stats().active_bytes} "
          f"bytes active in {pool.stats().live_graphs} graphs")

    cupy.matmul(cupy.ones((2, 2)), cupy.ones((2, 2)))  # warm up cuBLAS for the extras
    with_cupy = cupy_program(cupy.cuda.Stream, extras=False)
    with_cugraphrt_stream = cupy_program(cugraphrt.Stream, extras=False)
    cupy.testing.assert_array_equal(with_cupy, with_cugraphrt_stream)
    cupy_program(cugraphrt.Stream, extras=True)
    print("cupy.cuda.Stream -> cugraphrt.Stream: same results")


if __name__ == "__main__":
    main()
