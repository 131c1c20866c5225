"""Graphed data-parallel training equals eager training bit for bit (torchrun script).

Parts (argv):

* ``step``: forward, backward, gradient all-reduce and a capturable Adam step captured as
  one graph per rank, against the same step run eagerly;
* ``callables``: DistributedDataParallel over a module graphed with make_graphed_callables,
  against eager DDP;
* ``ddp_step``: a whole DDP step (DDP's own bucketed all-reduce inside) captured as one
  graph, against eager DDP;
* ``static_graph``: the same with ``DistributedDataParallel(static_graph=True)``.

Every part trains two copies of one model from the same seed on the same per-rank batches
and compares every step's loss and the final parameters exactly.
"""

from __future__ import annotations

import copy
import sys

import cugraphrt_torch
import torch
import torch.distributed as dist
from _dist import ok, run_parts, same
from cugraphrt_torch.distributed import capture_stream, check_capture
from torch.nn.parallel import DistributedDataParallel as DDP

import cugraphrt

STEPS = 30
WARMUP = 11  # DDP needs eleven eager iterations before its backward can be captured
BATCH, WIDTH = 32, 64


def mlp(device) -> torch.nn.Module:
    torch.manual_seed(0)  # the same weights on every rank and for both copies
    return torch.nn.Sequential(torch.nn.Linear(WIDTH, 4 * WIDTH), torch.nn.GELU(),
                               torch.nn.Linear(4 * WIDTH, WIDTH)).to(device)


def batches(rank: int, device, count: int):
    generator = torch.Generator(device=device).manual_seed(100 + rank)
    return [(torch.randn(BATCH, WIDTH, device=device, generator=generator),
             torch.randn(BATCH, WIDTH, device=device, generator=generator))
            for _ in range(count)]


def adam(model) -> torch.optim.Optimizer:
    # capturable=True for both copies: the same kernels, so the same bits.
    return torch.optim.Adam(model.parameters(), lr=1e-3, capturable=True)


def manual_step(model, opt, x, y, world: int):
    """One data-parallel step with an explicit gradient all-reduce (average)."""
    loss = torch.nn.functional.mse_loss(model(x), y)
    loss.backward()
    for p in model.parameters():
        dist.all_reduce(p.grad)
        p.grad.div_(world)
    opt.step()
    return loss


def on_capture_stream(fn, count: int) -> None:
    stream = capture_stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for i in range(count):
            fn(i)
    torch.cuda.current_stream().wait_stream(stream)


def compare(losses_g, losses_e, model_g, model_e, check: str) -> None:
    for i, (lg, le) in enumerate(zip(losses_g, losses_e, strict=True)):
        same(lg, le, f"{check}: loss of step {i}")
    for (name, pg), pe in zip(model_g.named_parameters(), model_e.parameters(), strict=True):
        same(pg.detach(), pe.detach(), f"{check}: parameter {name} after {STEPS} steps")
    ok(check)


def part_step(rank: int, world: int, device) -> None:
    check_capture()
    model_e = mlp(device)
    model_g = copy.deepcopy(model_e)
    opt_e, opt_g = adam(model_e), adam(model_g)
    data = batches(rank, device, 3 + STEPS)

    def warm(i):  # real steps for both copies: Adam's state and NCCL come up
        for model, opt in ((model_e, opt_e), (model_g, opt_g)):
            opt.zero_grad(set_to_none=True)
            manual_step(model, opt, *data[i], world)

    on_capture_stream(warm, 3)
    static_x, static_y = data[3][0].clone(), data[3][1].clone()
    opt_g.zero_grad(set_to_none=True)  # backward allocates .grad from the graph's pool
    g = cugraphrt.Graph()
    with cugraphrt_torch.graph(g):
        static_loss = manual_step(model_g, opt_g, static_x, static_y, world)
    losses_g, losses_e = [], []
    current = torch.cuda.current_stream()
    for x, y in data[3:]:
        static_x.copy_(x)
        static_y.copy_(y)
        g.replay(current)
        losses_g.append(static_loss.detach().clone())
        opt_e.zero_grad(set_to_none=True)
        losses_e.append(manual_step(model_e, opt_e, x, y, world).detach())
    compare(losses_g, losses_e, model_g, model_e, "step")


def part_callables(rank: int, world: int, device) -> None:
    check_capture()
    inner_e = mlp(device)
    inner_g = copy.deepcopy(inner_e)
    sample = torch.randn(BATCH, WIDTH, device=device)
    cugraphrt_torch.make_graphed_callables(inner_g, (sample,))  # graph first, then wrap
    model_e, model_g = DDP(inner_e), DDP(inner_g)
    opt_e, opt_g = adam(model_e), adam(model_g)
    losses_g, losses_e = [], []
    for x, y in batches(rank, device, STEPS):
        for model, opt, losses in ((model_g, opt_g, losses_g), (model_e, opt_e, losses_e)):
            opt.zero_grad(set_to_none=True)
            loss = torch.nn.functional.mse_loss(model(x), y)
            loss.backward()
            opt.step()
            losses.append(loss.detach())
    compare(losses_g, losses_e, model_g, model_e, "callables")


def _whole_ddp_step(device, check: str, **ddp_options) -> None:
    check_capture()
    stream = capture_stream()
    with torch.cuda.stream(stream):  # DDP built on the capture stream (torch's rule)
        model_g = DDP(mlp(device), **ddp_options)
    model_e = DDP(mlp(device), **ddp_options)
    opt_e, opt_g = adam(model_e), adam(model_g)
    data = batches(dist.get_rank(), device, WARMUP + STEPS)

    def ddp_step(model, opt, x, y):
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        return loss

    def warm(i):
        for model, opt in ((model_e, opt_e), (model_g, opt_g)):
            opt.zero_grad(set_to_none=True)
            ddp_step(model, opt, *data[i])

    on_capture_stream(warm, WARMUP)
    static_x, static_y = data[WARMUP][0].clone(), data[WARMUP][1].clone()
    opt_g.zero_grad(set_to_none=True)
    g = cugraphrt.Graph()
    with cugraphrt_torch.graph(g):
        static_loss = ddp_step(model_g, opt_g, static_x, static_y)
    losses_g, losses_e = [], []
    current = torch.cuda.current_stream()
    for x, y in data[WARMUP:]:
        static_x.copy_(x)
        static_y.copy_(y)
        g.replay(current)
        losses_g.append(static_loss.detach().clone())
        opt_e.zero_grad(set_to_none=True)
        losses_e.append(ddp_step(model_e, opt_e, x, y).detach())
    compare(losses_g, losses_e, model_g, model_e, check)


def part_ddp_step(rank: int, world: int, device) -> None:
    _whole_ddp_step(device, "ddp_step")


def part_static_graph(rank: int, world: int, device) -> None:
    # static_graph=True: DDP learns the graph in its first iteration and delays that
    # iteration's all-reduce to a final callback; eleven warm-ups cover it too.
    _whole_ddp_step(device, "static_graph", static_graph=True)


if __name__ == "__main__":
    run_parts({"step": part_step, "callables": part_callables, "ddp_step": part_ddp_step,
               "static_graph": part_static_graph}, sys.argv[1:])
