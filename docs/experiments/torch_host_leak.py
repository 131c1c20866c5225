"""Prints the host memory a torch capture cycle leaves behind, the bisection of
docs/reliability.md, "The torch host leak". Needs a GPU and torch::

    python docs/experiments/torch_host_leak.py [CYCLES]

Each variant captures ``y = x * 2 + 1`` and resets the graph, CYCLES times (300 by default)
after 20 untimed cycles; the figure is the growth of the process's resident memory per
cycle, read after ``malloc_trim`` so that freed heap pages do not count:

* ``CUDAGraph.capture_begin/end/reset``: torch's graph, begun and ended directly;
* ``torch.cuda.graph``: the same inside torch's context manager (which empties torch's
  pinned-host cache before every capture);
* ``cugraphrt_torch.graph``: cugraphrt's capture of torch work, which begins torch's
  capture with ``capture_begin`` and empties that cache at its own safe points.
"""

from __future__ import annotations

import ctypes
import gc
import os
import sys

import cugraphrt_torch
import torch

import cugraphrt

_libc = ctypes.CDLL("libc.so.6")
_PAGE = os.sysconf("SC_PAGE_SIZE")


def resident_bytes() -> int:
    gc.collect()
    _libc.malloc_trim(0)
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * _PAGE


def variants(x):
    side = torch.cuda.Stream()

    def bare():
        g = torch.cuda.CUDAGraph()
        with torch.cuda.stream(side):
            g.capture_begin()
            x * 2 + 1
            g.capture_end()
        g.reset()

    def context():
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            x * 2 + 1
        g.reset()

    def ours():
        g = cugraphrt.Graph()
        with cugraphrt_torch.graph(g):
            x * 2 + 1
        g.reset()

    return {"CUDAGraph.capture_begin/end/reset": bare, "torch.cuda.graph": context,
            "cugraphrt_torch.graph": ours}


def main(cycles: int = 300) -> None:
    x = torch.randn(1 << 16, device="cuda")
    x * 2 + 1
    torch.cuda.synchronize()
    print(f"| cycle ({cycles} cycles) | host memory per capture |")
    print("|---|---|")
    for name, cycle in variants(x).items():
        for _ in range(20):
            cycle()
        before = resident_bytes()
        for _ in range(cycles):
            cycle()
        torch.cuda.synchronize()
        grown = resident_bytes() - before
        print(f"| {name} | {grown / cycles / 1024:+.2f} KiB |")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 300)
