"""A tensor-parallel decode step as one CUDA graph per rank, checked and watched.

Run with one process per GPU:

    torchrun --standalone --nproc-per-node 2 examples/distributed_tp_decode.py

A Llama-style decoder split across the ranks (column- and row-parallel linears, an
all-reduce after attention and after the MLP of each layer, a KV cache indexed by a position
kept on the device) is captured once per rank. Before its first replay the ranks compare
the collectives they captured (a mismatch raises CaptureError on every rank instead of
hanging); with the collective timeout set, a replay stuck on a missing peer raises
CollectiveTimeoutError on the stuck rank instead of hanging. Every token is checked against
eager tensor parallelism. See docs/distributed.md.
"""

from __future__ import annotations

import os

import cugraphrt_torch
import torch
import torch.distributed as dist
from cugraphrt_torch.distributed import capture_stream, check_capture, set_collective_timeout

import cugraphrt
from cugraphrt.bench.tp_decoder import Dims, build


def main() -> None:
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    torch.cuda.set_device(local_rank)
    device = torch.device("cuda", local_rank)
    dist.init_process_group("nccl", device_id=device)
    check_capture()
    set_collective_timeout(60)  # before capturing: replays stuck for a minute raise
    rank, world = dist.get_rank(), dist.get_world_size()

    dims = Dims(layers=2, hidden=256, heads=8, ffn=704, batch=2, max_len=32)
    graphed = build(torch, dims, rank=rank, world=world, device=device, dtype=torch.float32)
    eager = build(torch, dims, rank=rank, world=world, device=device, dtype=torch.float32)
    static_x = torch.zeros(dims.batch, dims.hidden, device=device)

    stream = capture_stream()  # warm-up on the capture stream: cuBLAS, NCCL for these sizes
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(3):
            graphed.step(static_x)
    torch.cuda.current_stream().wait_stream(stream)
    graphed.reset()  # back to position 0, in place

    g = cugraphrt.Graph()
    with cugraphrt_torch.graph(g):
        static_out = graphed.step(static_x)  # one token, both all-reduces of every layer

    gen = torch.Generator(device=device).manual_seed(0)  # the same tokens on every rank
    current = torch.cuda.current_stream()
    for step in range(24):
        x = torch.randn(dims.batch, dims.hidden, device=device, generator=gen)
        static_x.copy_(x)
        g.replay(current)  # the first replay compares the ranks' collectives
        torch.testing.assert_close(static_out, eager.step(x), rtol=1e-5, atol=1e-5,
                                   msg=lambda m, step=step: f"token {step}: {m}")
    if rank == 0:
        print(f"24 decode steps on {world} rank(s) as graph replays, equal to eager tensor "
              f"parallelism; position {int(graphed.pos)}")
    dist.barrier()
    dist.destroy_process_group()  # `g` is released first (NCCL would wait for it forever)


if __name__ == "__main__":
    main()
