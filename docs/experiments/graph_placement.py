"""Where a graph's buffers land moves its replay: why ``torch_infer`` times several builds.

``cugraphrt bench``'s ``torch_infer`` row "cpu-bound 16x128 b8" (16 linear layers of width
128, batch 8) compares ``cugraphrt_torch.graph_module`` with a hand-written
``torch.cuda.CUDAGraph`` by wall time per call. This script builds that MLP's graph six
times, three a system, in alternating order, and prints for each build:

* the replay alone (no copy-in), wall time per call over 32 back-to-back replays, median of
  60 interleaved rounds: both systems' graphs hold the same kernels, so any difference here
  is where the build's buffers landed;
* the host time per full call (copy-in, replay, hand-out) without waiting for the device:
  what each system's call path costs, against the device work it issues.

The same for the 4x512 MLP at batch 32. Needs a CUDA GPU and torch::

    python docs/experiments/graph_placement.py

On an H200 (2026-11-29, torch 2.11, cugraphrt at dbb2451) the three torch builds of the
16x128 MLP replayed in 58.3 us each and the three cugraphrt builds in 55.7 to 58.4 us, while
a full call's host time was 12 us (torch) and 16 us (cugraphrt_torch) against 56 us of
device work: the row was device-bound, and its ratio was the builds' placements. With one
build a system, the torch graph (built first) had the faster placement in almost every
--quick report; the bench now times ``PLACEMENTS`` builds a system in turn
(``cugraphrt.bench.torch_common.graph_builds``).
"""

from __future__ import annotations

import copy
import statistics
import time

import cugraphrt_torch
import numpy as np
import torch

from cugraphrt.bench.torch_common import HandGraph, mlp

CALLS, ROUNDS, BUILDS = 32, 60, 3


def per_call(fn, wait: bool) -> float:
    """Microseconds per call of ``CALLS`` calls of ``fn``; ``wait``: until the device is done."""
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(CALLS):
        fn()
    if wait:
        torch.cuda.synchronize()
    elapsed = time.perf_counter() - start
    torch.cuda.synchronize()
    return elapsed / CALLS * 1e6


def builds(model, sample) -> dict[str, object]:
    """``BUILDS`` graphs a system, the first system alternating."""
    made: dict[str, object] = {}
    for index in range(BUILDS):
        order = ("torch", "cugraphrt") if index % 2 == 0 else ("cugraphrt", "torch")
        for system in order:
            made[f"{system} {index}"] = (
                HandGraph(torch, model, sample) if system == "torch"
                else cugraphrt_torch.graph_module(copy.deepcopy(model), (sample.clone(),)))
    return made


def main() -> None:
    for widths, shape in (((128,) * 17, (8, 128)), ((512,) * 5, (32, 512))):
        torch.manual_seed(0)
        model = mlp(torch, widths).cuda().eval()
        x = torch.randn(shape, device="cuda")
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.no_grad(), torch.cuda.stream(stream):
            model(x)
            made = builds(model, x)
            replay = {name: (g.graph.replay if name.startswith("torch")
                             else g._captured.launch) for name, g in made.items()}
            call = {name: (lambda g=g, x=x: g(x)) for name, g in made.items()}
            for name in made:
                for _ in range(50):
                    call[name]()
            times: dict[str, tuple[list[float], list[float]]] = {n: ([], []) for n in made}
            names, rng = list(made), np.random.default_rng(0)
            for _ in range(ROUNDS):
                rng.shuffle(names)
                for name in names:
                    times[name][0].append(per_call(replay[name], wait=True))
                    times[name][1].append(per_call(call[name], wait=False))
        print(f"{len(widths) - 1} layers of {widths[0]}, input {shape} (us per call, median "
              f"of {ROUNDS} rounds of {CALLS}):")
        for name, (replays, hosts) in times.items():
            print(f"  {name:12s} replay alone {statistics.median(replays):7.2f}   "
                  f"host per call {statistics.median(hosts):6.2f}")


if __name__ == "__main__":
    main()
