"""Prints the host cost of one call of a graphed callable, the figure of docs/adapters.md.

A call's host work is the product's floor in Python: the copy-in checks, the overwrite-order
test, the replay, the hand-out. This measures it where the GPU cannot hide it: a graph of one
small kernel (it runs in a few microseconds, faster than the host issues calls), called
``CALLS`` times in a row with a fresh input (so every call copies), then one synchronize. The
result is host microseconds per call, the median of ``ROUNDS`` rounds, for:

* torch: ``static.copy_(x); g.replay()`` on a ``torch.cuda.CUDAGraph`` (the hand-written
  floor), and ``cugraphrt_torch.graph_module`` with the overwritten-output check on (its
  default) and off;
* CuPy: a memcpy into the static input plus ``Graph.launch()`` of CuPy's own graph
  (``Stream.begin_capture``; the hand-written floor), and ``cugraphrt.make_graphed``.

Only public names are used, so the same script measures any version of cugraphrt. Needs a
CUDA GPU and torch::

    python docs/experiments/call_path_cost.py
"""

from __future__ import annotations

import statistics
import time

CALLS = 2000
ROUNDS = 15


def _rounds(call, x, sync) -> float:
    """Median host microseconds per call of ``call(x)`` over the rounds."""
    for _ in range(200):
        call(x)
    sync()
    per_call = []
    for _ in range(ROUNDS):
        start = time.perf_counter()
        for _ in range(CALLS):
            call(x)
        sync()
        per_call.append((time.perf_counter() - start) / CALLS * 1e6)
    return statistics.median(per_call)


def torch_rows() -> list[tuple[str, float]]:
    import cugraphrt_torch
    import torch

    model = torch.nn.ReLU().cuda()
    x = torch.randn(64, 64, device="cuda")
    static = x.clone()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        model(static)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        model(static)

    def hand_written(value):
        static.copy_(value)
        graph.replay()

    rows = [("torch: static.copy_(x); CUDAGraph.replay()", _rounds(hand_written, x,
                                                                   torch.cuda.synchronize))]
    for check in (True, False):
        graphed = cugraphrt_torch.graph_module(model, x.clone(), check_outputs=check)
        rows.append((f"cugraphrt_torch.graph_module, check_outputs={check}",
                     _rounds(graphed, x, torch.cuda.synchronize)))
    return rows


def cupy_rows() -> list[tuple[str, float]]:
    import cupy

    import cugraphrt

    def relu(a):
        return cupy.maximum(a, 0)

    x = cupy.random.standard_normal((64, 64), dtype=cupy.float32)
    static = x.copy()
    relu(static)  # compile the kernel outside the capture
    stream = cupy.cuda.Stream(non_blocking=True)
    with stream:  # CuPy's own capture: the floor owes nothing to cugraphrt
        stream.begin_capture()
        relu(static)
        graph = stream.end_capture()
    stream.synchronize()

    def hand_written(value):
        static.data.copy_from_device_async(value.data, value.nbytes)
        graph.launch()

    sync = cupy.cuda.get_current_stream().synchronize
    graphed = cugraphrt.make_graphed(relu, (x.copy(),))
    return [("cupy: memcpy into the static input; cupy Graph.launch()",
             _rounds(hand_written, x, sync)),
            ("cugraphrt.make_graphed", _rounds(graphed, x, sync))]


def main() -> None:
    import cugraphrt

    print(f"cugraphrt {cugraphrt.__version__}: host microseconds per call (median of "
          f"{ROUNDS} rounds of {CALLS} calls, one 64x64 ReLU graph, a copied input)")
    print("| call | us |")
    print("| --- | --- |")
    for label, us in torch_rows() + cupy_rows():
        print(f"| {label} | {us:.2f} |")


if __name__ == "__main__":
    main()
