"""Collectives inside captured graphs give eager's results on every replay (torchrun script).

Parts (argv): ``graph`` (torch.distributed in cugraphrt_torch.graph), ``callables`` (the
differentiable collectives of torch.distributed.nn in make_graphed_callables, forward and
backward), ``cupy`` (cugraphrt.distributed.Collectives in cugraphrt.graph). Every part
replays 100 times with fresh inputs and compares with the same work run eagerly.
"""

from __future__ import annotations

import sys

import cugraphrt_torch
import torch
import torch.distributed as dist
from _dist import ok, run_parts, same
from cugraphrt_torch.distributed import capture_stream, check_capture

import cugraphrt

REPLAYS = 100
N = 4096


def torch_step(x: torch.Tensor, rank: int, world: int):
    """One of each collective; ``x`` differs per rank."""
    summed = x * 2 + rank
    dist.all_reduce(summed)
    gathered = torch.empty(world * x.numel(), device=x.device)
    dist.all_gather_into_tensor(gathered, x)
    scattered = torch.empty(x.numel() // world, device=x.device)
    dist.reduce_scatter_tensor(scattered, x * 3)
    broadcast = x + 1
    dist.broadcast(broadcast, src=0)
    return summed, gathered, scattered, broadcast


def warm_up(fn, *args) -> None:
    """Three eager runs on the capture stream: NCCL communicators and kernels come up."""
    stream = capture_stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(3):
            fn(*args)
    torch.cuda.current_stream().wait_stream(stream)


def inputs(rank: int, device):
    generator = torch.Generator(device=device).manual_seed(1000 + rank)
    for _ in range(REPLAYS):
        yield torch.randn(N, device=device, generator=generator)


def part_graph(rank: int, world: int, device) -> None:
    check_capture()
    x = torch.randn(N, device=device)
    warm_up(torch_step, x, rank, world)
    g = cugraphrt.Graph()
    with cugraphrt_torch.graph(g):
        outputs = torch_step(x, rank, world)
    current = torch.cuda.current_stream()
    for i, new in enumerate(inputs(rank, device)):
        x.copy_(new)
        g.replay(current)
        expected = torch_step(new, rank, world)
        # Two ranks: a sum of two values is the same in any order, so bit for bit.
        for name, got, want in zip(("all_reduce", "all_gather", "reduce_scatter", "broadcast"),
                                   outputs, expected, strict=True):
            same(got, want, f"replay {i}: {name}", exact=world <= 2)
    # Checked once; from then on the replay is torch's own CUDAGraph.replay, nothing added
    # (the watchdog is off).
    assert isinstance(getattr(g._route._replay, "__self__", None), torch.cuda.CUDAGraph)
    ok("graph")


class Block(torch.nn.Module):
    """A linear layer whose output goes through the four differentiable collectives."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(64, 64)

    def forward(self, x):
        import torch.distributed.nn.functional as dfn

        world = dist.get_world_size()
        h = dfn.all_reduce(self.linear(x))
        gathered = torch.cat(dfn.all_gather(h), dim=0)
        scattered = torch.empty_like(h[: h.shape[0] // world])
        scattered = dfn.reduce_scatter(scattered, list(gathered.chunk(world * world)[:world]))
        return dfn.broadcast(scattered * 2, src=0) + h[: scattered.shape[0]]


def part_callables(rank: int, world: int, device) -> None:
    check_capture()
    torch.manual_seed(0)
    eager = Block().to(device)
    graphed = Block().to(device)
    graphed.load_state_dict(eager.state_dict())
    sample = torch.randn(8 * world, 64, device=device, requires_grad=True)
    cugraphrt_torch.make_graphed_callables(graphed, (sample,))
    generator = torch.Generator(device=device).manual_seed(2000 + rank)
    for i in range(REPLAYS):
        data = torch.randn(8 * world, 64, device=device, generator=generator)
        results = []
        for model in (graphed, eager):
            x = data.clone().requires_grad_(True)
            model.zero_grad(set_to_none=True)
            out = model(x)
            (out * out).sum().backward()
            results.append((out.detach().clone(), x.grad.clone(), model.linear.weight.grad.clone()))
        for name, got, want in zip(("output", "input grad", "weight grad"), *results,
                                   strict=True):
            same(got, want, f"call {i}: {name}", exact=False)
    ok("callables")


def part_cupy(rank: int, world: int, device) -> None:
    import cupy
    from cupy.cuda import nccl

    from cugraphrt.distributed.collectives import Collectives

    uid = [nccl.get_unique_id() if rank == 0 else None]
    dist.broadcast_object_list(uid, src=0)
    with cupy.cuda.Device(device.index):
        coll = Collectives(nccl.NcclCommunicator(world, uid[0], rank))
        x = cupy.random.standard_normal(N, dtype=cupy.float32)

        def step(x):
            summed = coll.all_reduce(x * 2 + rank)
            gathered = coll.all_gather(x)
            scattered = coll.reduce_scatter(x * 3)
            broadcast = coll.broadcast(x + 1, root=0)
            return summed, gathered, scattered, broadcast

        step(x)  # warm-up: Collectives refuses a capture of what never ran eagerly
        cupy.cuda.get_current_stream().synchronize()
        g = cugraphrt.Graph()
        with cugraphrt.graph(g):
            outputs = step(x)
        rng = cupy.random.default_rng(3000 + rank)
        for i in range(REPLAYS):
            new = rng.standard_normal(N, dtype=cupy.float32)
            x[...] = new
            g.replay()
            expected = step(new)
            for name, got, want in zip(("all_reduce", "all_gather", "reduce_scatter",
                                        "broadcast"), outputs, expected, strict=True):
                if not bool((got == want).all()):
                    raise AssertionError(f"replay {i}: cupy {name} differs from eager")
        cupy.cuda.get_current_stream().synchronize()
    ok("cupy")


if __name__ == "__main__":
    run_parts({"graph": part_graph, "callables": part_callables, "cupy": part_cupy},
              sys.argv[1:])
