"""Data-parallel training on 2 GPUs: eager DDP against the whole step as one graph per rank.

``cugraphrt bench --distributed`` (or ``--only ddp``) starts this module under torchrun,
``python -m torch.distributed.run --standalone --nproc-per-node 2 -m
cugraphrt.bench.workloads_distributed``; rank 0 prints one JSON line of step times. The model
is launch-bound on purpose (a small MLP: 8 layers of 256, batch 32), the case graphs exist
for: per step, eager DDP launches ~100 kernels and an all-reduce per gradient bucket from
Python, the graph launches once. n/a with fewer than 2 GPUs or without torch; skipped in
``--quick`` unless selected.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

from .spec import Context, RowBuilder, Target, Workload
from .timing import summarize

__all__ = ["DDP", "WORLD", "gpu_count"]

WORLD = 2
SYSTEMS = ("ddp_eager", "cugraphrt_step")
_LAYERS, _WIDTH, _BATCH = 8, 256, 32
_STEPS, _REPEATS, _WARMUP = 50, 7, 11  # DDP needs 11 eager steps before its capture


# -- the child processes: one per rank --------------------------------------------------------
def _model(torch, device):
    torch.manual_seed(0)
    layers = []
    for _ in range(_LAYERS):
        layers += [torch.nn.Linear(_WIDTH, _WIDTH), torch.nn.ReLU()]
    return torch.nn.Sequential(*layers).to(device)


def _time_steps(torch, step) -> list[float]:
    samples = []
    for _ in range(_REPEATS):
        torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(_STEPS):
            step()
        torch.cuda.synchronize()
        samples.append((time.perf_counter() - start) / _STEPS)
    return samples


def _child() -> None:
    import cugraphrt_torch
    import torch
    import torch.distributed as dist
    from cugraphrt_torch.distributed import capture_stream, check_capture
    from torch.nn.parallel import DistributedDataParallel

    import cugraphrt

    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    device = torch.device("cuda", local_rank)
    dist.init_process_group("nccl", device_id=device)
    check_capture()
    x = torch.randn(_BATCH, _WIDTH, device=device)
    y = torch.randn(_BATCH, _WIDTH, device=device)
    results = {}
    for system in SYSTEMS:
        stream = capture_stream()
        with torch.cuda.stream(stream):  # DDP built on the capture stream (torch's rule)
            model = DistributedDataParallel(_model(torch, device))
        opt = torch.optim.Adam(model.parameters(), lr=1e-4, capturable=True)

        def step(model=model, opt=opt):
            opt.zero_grad(set_to_none=True)
            loss = torch.nn.functional.mse_loss(model(x), y)
            loss.backward()
            opt.step()
            return loss

        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for _ in range(_WARMUP):
                step()
        torch.cuda.current_stream().wait_stream(stream)
        run = step
        if system == "cugraphrt_step":
            opt.zero_grad(set_to_none=True)
            g = cugraphrt.Graph()
            with cugraphrt_torch.graph(g):
                loss = torch.nn.functional.mse_loss(model(x), y)
                loss.backward()
                opt.step()
            current = torch.cuda.current_stream()

            def run(g=g, current=current):
                g.replay(current)
        results[system] = _time_steps(torch, run)
    if dist.get_rank() == 0:
        print("RESULT " + json.dumps(results), flush=True)
    dist.barrier()
    dist.destroy_process_group()


# -- the parent: the row ----------------------------------------------------------------------
def gpu_count() -> int:
    """CUDA GPUs torch sees (0 without torch or CUDA)."""
    try:
        import torch
    except Exception:  # noqa: BLE001 - no torch: no distributed workload
        return 0
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def _launch() -> dict:
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone",
               f"--nproc-per-node={WORLD}", "-m", "cugraphrt.bench.workloads_distributed"]
    env = {k: v for k, v in os.environ.items()
           if k not in ("TORCH_NCCL_BLOCKING_WAIT", "NCCL_BLOCKING_WAIT")}
    done = subprocess.run(command, capture_output=True, text=True, timeout=900, env=env)
    for line in done.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[7:])
    print(f"cugraphrt bench: ddp under torchrun failed:\n{done.stderr[-4000:]}", file=sys.stderr)
    tail = (done.stderr.strip().splitlines() or [f"exit status {done.returncode}"])[-1]
    raise RuntimeError(f"torchrun exited with status {done.returncode}: {tail}")


def _run(ctx: Context) -> None:
    row = RowBuilder("step", "us", SYSTEMS, "ddp_eager", "cugraphrt_step")
    gpus = gpu_count()
    if ctx.quick and not ctx.selected:
        row.unavailable_all("skipped in --quick (run --distributed)")
    elif gpus < WORLD:
        row.unavailable_all(f"needs {WORLD} GPUs and a CUDA build of torch (got {gpus} GPU(s))")
    else:
        ctx.step(f"ddp: torchrun, {WORLD} ranks")
        results = row.setup("cugraphrt_step", _launch)
        if results is not None:
            for system in SYSTEMS:
                row.set(system, summarize(results[system]).scaled(1e6))
        else:
            row.unavailable("ddp_eager", "torchrun failed (see the cugraphrt_step cell)")
    ctx.emit(row.build())


DDP = Workload(
    "ddp", f"data-parallel training step on {WORLD} GPUs (torchrun, NCCL): MLP {_LAYERS}x"
    f"{_WIDTH}, batch {_BATCH} per rank, Adam; eager DDP vs the whole step (DDP's all-reduce "
    f"included) as one cugraphrt graph per rank", SYSTEMS, "ddp_eager",
    (Target("cugraphrt_step", "ddp_eager", 1 / 1.5, metric="step"),), _run)

if __name__ == "__main__":
    _child()
