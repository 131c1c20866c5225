"""destroy_process_group() returns, and the process exits, with graphs holding collectives
still alive (torchrun script).

Modes (argv[1]):

* ``keep``: a cugraphrt graph holding an all-reduce (a module global) and a module graphed by
  make_graphed_callables with torch.distributed.nn collectives (it references itself, so
  only a garbage collection would free it) are alive when destroy_process_group() runs. It
  must return; both are released first, so replaying one raises ReplayError; freeing them
  afterwards is harmless.
* ``exit``: the same graphs, and the process ends without destroy_process_group(): the
  interpreter's exit releases them before torch's process-group destructor aborts the
  communicator, and the process exits with status 0.

Run with ``CUGRAPHRT_CHECK_COLLECTIVES=0`` (nothing recorded, nothing released), ``keep``
shows the hang this prevents: NCCL waits in destroy_process_group() for the graphs to die.
"""

from __future__ import annotations

import gc
import sys

import cugraphrt_torch
import torch
import torch.distributed as dist
import torch.distributed.nn.functional as dfn
from _dist import ok, setup
from cugraphrt_torch.distributed import capture_stream, check_capture

import cugraphrt

N = 1024
kept: list = []  # module-level: alive until the interpreter exits


class Reduced(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(32, 32)

    def forward(self, x):
        return dfn.all_reduce(self.linear(x)) * 2


def build(device) -> None:
    check_capture()
    x = torch.randn(N, device=device)
    stream = capture_stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(2):
            dist.all_reduce(x.clone())
    torch.cuda.current_stream().wait_stream(stream)
    g = cugraphrt.Graph()
    with cugraphrt_torch.graph(g):
        y = x * 3
        dist.all_reduce(y)
    g.replay(torch.cuda.current_stream())
    module = cugraphrt_torch.make_graphed_callables(
        Reduced().to(device), (torch.randn(8, 32, device=device, requires_grad=True),))
    out = module(torch.randn(8, 32, device=device, requires_grad=True))
    out.sum().backward()
    torch.cuda.synchronize()
    kept.extend([g, module])


if __name__ == "__main__":
    mode = sys.argv[1]
    rank, world, device = setup()
    gc.disable()  # no collection may free the graphed module behind the test's back
    build(device)
    ok("built")
    if mode == "keep":
        torch.cuda.synchronize()
        dist.barrier()
        dist.destroy_process_group()  # returns: the graphs are released first
        print(f"OK destroyed rank={rank}", flush=True)
        try:
            kept[0].replay()
        except cugraphrt.ReplayError:
            print(f"OK released rank={rank}", flush=True)
        kept.clear()
        gc.enable()
        gc.collect()
        print(f"OK freed rank={rank}", flush=True)
    else:
        torch.cuda.synchronize()
        ok("exiting")  # the graphs are alive and the group is not destroyed
