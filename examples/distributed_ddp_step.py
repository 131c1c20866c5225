"""A whole data-parallel training step as one CUDA graph per rank.

Run with one process per GPU:

    torchrun --standalone --nproc-per-node 2 examples/distributed_ddp_step.py

Forward, backward, DDP's gradient all-reduce (NCCL) and a capturable Adam step are captured
once per rank; each later step is two copies and one replay. The same model trained with
eager DDP from the same seed checks every loss, bit for bit. See docs/distributed.md.
"""

from __future__ import annotations

import os

import cugraphrt_torch
import torch
import torch.distributed as dist
from cugraphrt_torch.distributed import capture_stream, check_capture
from torch.nn.parallel import DistributedDataParallel as DDP

import cugraphrt


def make_model(device):
    torch.manual_seed(0)  # the same initial weights on every rank
    return torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(),
                               torch.nn.Linear(256, 64)).to(device)


def train_step(model, opt, x, y):
    opt.zero_grad(set_to_none=True)
    loss = torch.nn.functional.mse_loss(model(x), y)
    loss.backward()  # DDP all-reduces the gradients here
    opt.step()
    return loss


def main() -> None:
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    torch.cuda.set_device(local_rank)
    device = torch.device("cuda", local_rank)
    dist.init_process_group("nccl", device_id=device)
    torch.backends.cuda.matmul.allow_tf32 = False
    check_capture()  # NCCL backend, no blocking wait, NCCL >= 2.9.6, this rank's GPU

    stream = capture_stream()
    with torch.cuda.stream(stream):  # DDP whose backward is captured is built on that stream
        graphed = DDP(make_model(device))
    eager = DDP(make_model(device))
    opt_g = torch.optim.Adam(graphed.parameters(), lr=1e-3, capturable=True)
    opt_e = torch.optim.Adam(eager.parameters(), lr=1e-3, capturable=True)
    gen = torch.Generator(device=device).manual_seed(dist.get_rank())
    data = [(torch.randn(32, 64, device=device, generator=gen),
             torch.randn(32, 64, device=device, generator=gen)) for _ in range(31)]

    # Warm-up: 11 real DDP steps (DDP's rule before a capture), on the capture stream.
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for x, y in data[:11]:
            train_step(graphed, opt_g, x, y)
            train_step(eager, opt_e, x, y)
    torch.cuda.current_stream().wait_stream(stream)

    static_x, static_y = data[11][0].clone(), data[11][1].clone()
    opt_g.zero_grad(set_to_none=True)  # the captured backward allocates .grad in the pool
    g = cugraphrt.Graph()
    with cugraphrt_torch.graph(g):
        static_loss = torch.nn.functional.mse_loss(graphed(static_x), static_y)
        static_loss.backward()
        opt_g.step()

    current = torch.cuda.current_stream()
    for step, (x, y) in enumerate(data[11:]):
        static_x.copy_(x)
        static_y.copy_(y)
        g.replay(current)  # every rank replays the same graph, in the same order
        expected = train_step(eager, opt_e, x, y)
        assert torch.equal(static_loss, expected), (step, static_loss.item(), expected.item())
    if dist.get_rank() == 0:
        print(f"{len(data) - 11} graphed steps on {dist.get_world_size()} rank(s), losses equal "
              f"to eager DDP's; last loss {static_loss.item():.6f}")
    dist.barrier()
    # `g` is still alive here: cugraphrt_torch releases graphs holding collectives before the
    # process group shuts down (NCCL would otherwise wait for them forever).
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
