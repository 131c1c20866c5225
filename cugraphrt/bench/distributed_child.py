"""One rank of ``cugraphrt bench --distributed``: run under torchrun, prints the timings.

``python -m torch.distributed.run --standalone --nproc-per-node 2 -m
cugraphrt.bench.distributed_child`` (the parent, :mod:`cugraphrt.bench.workloads_distributed`,
starts it under a deadline). Every rank runs the same systems in the same order (their
collectives must pair up); rank 0 prints one ``RESULT {json}`` line: seconds per step, one
list of samples per system.

* ``ddp``: a data-parallel training step (MLP 8x256, batch 32 per rank, Adam): eager DDP
  against the whole step, DDP's all-reduce included, as one cugraphrt graph per rank.
* ``tp``: a decode step of a tensor-parallel Llama-style decoder over every rank
  (:mod:`cugraphrt.bench.tp_decoder`: 4 layers, bf16, two all-reduces per layer): eager,
  torch's own CUDA graph, cugraphrt, and cugraphrt with the hang watchdog on (what it
  costs).
* ``cg``: a conjugate-gradient solve to tolerance with the matrix split by rows
  (:mod:`cugraphrt.bench.dist_cg`, CuPy NCCL): eager with the host reading the residual
  after every iteration, a graph of one iteration replayed by that host loop, and the whole
  solve as one launch (``cugraphrt.while_loop``, both collectives inside its body).
* ``generate_tp``: greedy generation by a tensor-parallel transformers Llama
  (:mod:`cugraphrt.bench.distributed_generate`): its eager ``generate`` against the
  Generator, per token and in chunks with the all-reduces inside the device loop.

Each system's step is kept as a replay handle only (``functools.partial(g.replay, ...)``,
with ``g`` rebound per system), as user code keeps them. Both rows end by checking that the
graphs computed what eager does. ``--check`` runs the same code with one short round per
system and prints ``OK bench-child rank=<r>`` instead of timings: the regression test of
tests/distributed runs it.
"""

from __future__ import annotations

import functools
import json
import os
import sys
import time
from collections.abc import Callable
from typing import Any

from .distributed_generate import (
    LAYERS,
    NEW,
    SHORT_LABEL,
    SHORT_LAYERS,
    generate_tp,
    short_hidden,
)
from .timing import MIN_ROUNDS, MIN_WARMUP, round_order
from .tp_decoder import Dims, build

__all__ = ["main", "DDP_SYSTEMS", "TP_SYSTEMS"]

DDP_SYSTEMS = ("ddp_eager", "cugraphrt_step")
TP_SYSTEMS = ("eager", "torch_graph", "cugraphrt", "cugraphrt_watched")
CG_SYSTEMS = ("eager_check_1", "replay_check_1", "while_loop")
#: The CG system: unknowns, tolerance (about 60 iterations), solves per timed batch.
CG_N, CG_TOL, _CG_SOLVES = 1024, 1e-8, 5
_LAYERS, _WIDTH, _BATCH = 8, 256, 32
_STEPS, _WARMUP = 50, 11  # DDP needs 11 eager steps before its capture
_REPEATS = MIN_ROUNDS
_CHECK_STEPS, _CHECK_REPEATS = 3, 1  # --check: the same code, one short round
_CHECK_NEW, _CHECK_LAYERS = 8, 2  # --check: new tokens per generation, the TP model's layers
_TP = Dims()
_WATCHDOG_S = 120.0


def _interleaved(torch: Any, systems: dict[str, Callable[[], None]], loops: tuple[int, int],
                 before=None) -> dict[str, list[float]]:
    """Seconds per step of each system: one batch of ``steps`` each per round, in the
    bench's shuffled order (the same on every rank: their collectives must pair up), after
    an untimed round (``loops``: steps and timed rounds)."""
    steps, repeats = loops
    warmup = MIN_WARMUP
    samples: dict[str, list[float]] = {name: [] for name in systems}
    for round_index in range(warmup + repeats):
        for name in round_order(list(systems), round_index):
            if before is not None:
                before(name)
            torch.cuda.synchronize()
            start = time.perf_counter()
            for _ in range(steps):
                systems[name]()
            torch.cuda.synchronize()
            if round_index >= warmup:
                samples[name].append((time.perf_counter() - start) / steps)
    return samples


def _on_capture_stream(torch: Any, fn: Callable[[], None], count: int) -> None:
    from cugraphrt_torch.distributed import capture_stream

    stream = capture_stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(count):
            fn()
    torch.cuda.current_stream().wait_stream(stream)


def _ddp(torch: Any, device: Any, loops: tuple[int, int]) -> dict[str, list[float]]:
    import cugraphrt_torch
    from cugraphrt_torch.distributed import capture_stream
    from torch.nn.parallel import DistributedDataParallel

    import cugraphrt

    x = torch.randn(_BATCH, _WIDTH, device=device)
    y = torch.randn(_BATCH, _WIDTH, device=device)
    steps: dict[str, Callable[[], None]] = {}
    models: dict[str, Any] = {}
    for system in DDP_SYSTEMS:
        torch.manual_seed(0)
        layers: list[Any] = []
        for _ in range(_LAYERS):
            layers += [torch.nn.Linear(_WIDTH, _WIDTH), torch.nn.ReLU()]
        with torch.cuda.stream(capture_stream()):  # DDP built on the capture stream
            model = DistributedDataParallel(torch.nn.Sequential(*layers).to(device))
        opt = torch.optim.Adam(model.parameters(), lr=1e-4, capturable=True)

        def step(model=model, opt=opt) -> None:
            opt.zero_grad(set_to_none=True)
            torch.nn.functional.mse_loss(model(x), y).backward()
            opt.step()

        _on_capture_stream(torch, step, _WARMUP)
        steps[system] = step
        models[system] = model
        if system == "cugraphrt_step":
            opt.zero_grad(set_to_none=True)
            g = cugraphrt.Graph()
            with cugraphrt_torch.graph(g):
                torch.nn.functional.mse_loss(model(x), y).backward()
                opt.step()
            steps[system] = functools.partial(g.replay, torch.cuda.current_stream())
            steps[system]()  # the checked first replay
    samples = _interleaved(torch, steps, loops)
    # From the same weights, the graph took as many steps as eager plus its first replay.
    steps["ddp_eager"]()
    for (name, mine), theirs in zip(models["cugraphrt_step"].named_parameters(),
                                    models["ddp_eager"].parameters(), strict=True):
        torch.testing.assert_close(mine, theirs, rtol=1e-4, atol=1e-6,
                                   msg=lambda m, n=name: f"ddp {n}, graph vs eager: {m}")
    return samples


def _tp(torch: Any, rank: int, world: int, device: Any, loops: tuple[int, int]
        ) -> dict[str, list[float]]:
    import cugraphrt_torch
    from cugraphrt_torch.distributed import capture_stream

    import cugraphrt
    from cugraphrt.distributed.watchdog import set_collective_timeout

    decoders = {s: build(torch, _TP, rank=rank, world=world, device=device,
                         dtype=torch.bfloat16) for s in TP_SYSTEMS}
    x = torch.randn(_TP.batch, _TP.hidden, device=device, dtype=torch.bfloat16)
    steps: dict[str, Callable[[], Any]] = {"eager": functools.partial(decoders["eager"].step, x)}
    outs: dict[str, Any] = {}
    torch_graph = torch.cuda.CUDAGraph()
    for system in TP_SYSTEMS[1:]:
        decoder = decoders[system]
        _on_capture_stream(torch, functools.partial(decoder.step, x), 3)
        decoder.reset()
        if system == "torch_graph":
            with torch.cuda.graph(torch_graph, stream=capture_stream()):
                outs[system] = decoder.step(x)
            steps[system] = torch_graph.replay
            continue
        set_collective_timeout(_WATCHDOG_S if system == "cugraphrt_watched" else None)
        g = cugraphrt.Graph()
        with cugraphrt_torch.graph(g):
            outs[system] = decoder.step(x)
        steps[system] = functools.partial(g.replay, torch.cuda.current_stream())
        steps[system]()  # the first replay: checked, and sets the steady replay up
    set_collective_timeout(None)

    def before(name: str) -> None:  # every batch starts from an empty cache
        decoders[name].reset()

    samples = _interleaved(torch, steps, loops, before)
    # The replays computed what eager does (the same steps from position 0).
    decoders["eager"].reset()
    want = [decoders["eager"].step(x) for _ in range(4)]
    for system in TP_SYSTEMS[1:]:
        decoders[system].reset()
        for i in range(4):
            steps[system]()
            torch.testing.assert_close(outs[system].float(), want[i].float(), rtol=2e-2,
                                       atol=2e-2, msg=lambda m, s=system: f"{s}: {m}")
    torch_graph.reset()  # torch's own graph must go before its group: cugraphrt cannot see it
    return samples


def _cg(torch: Any, rank: int, world: int, device: Any, loops: tuple[int, int]
        ) -> dict[str, Any]:
    import cupy
    import torch.distributed as dist
    from cupy.cuda import nccl

    import cugraphrt
    from cugraphrt.distributed import Collectives

    from .dist_cg import DistributedCG, system

    uid = [nccl.get_unique_id() if rank == 0 else None]
    dist.broadcast_object_list(uid, src=0)
    with cupy.cuda.Device(device.index):
        coll = Collectives(nccl.NcclCommunicator(world, uid[0], rank))
        a, b = system(CG_N, seed=3)
        cg = DistributedCG(coll, a, b, CG_TOL)
        want = cg.solve_host()  # eager, and the collectives' warm-up
        want_x = cg.x.copy()
        one = cugraphrt.Graph()
        with cugraphrt.graph(one):
            cg.step()
        whole = cugraphrt.Graph()
        with cugraphrt.graph(whole):
            count = cg.solve_while_loop()
        solves: dict[str, Callable[[], Any]] = {"eager_check_1": cg.solve_host,
                  "replay_check_1": functools.partial(cg.solve_host, one.replay),
                  "while_loop": whole.replay}
        # Iterations and iterates equal to eager's, for both graphs, before any timing.
        for name in CG_SYSTEMS[1:]:
            got = solves[name]()
            cupy.cuda.get_current_stream().synchronize()
            iterations = int(count) if got is None else got
            if iterations != want or not bool((cg.x == want_x).all() if world <= 2 else
                                              cupy.allclose(cg.x, want_x, rtol=1e-12)):
                raise AssertionError(f"dist_cg {name}: {iterations} iterations (eager "
                                     f"{want}), iterates equal: {bool((cg.x == want_x).all())}")
        samples = _interleaved(torch, {n: solves[n] for n in CG_SYSTEMS},
                               (min(loops[0], _CG_SOLVES), loops[1]))
        del one, whole  # before the communicator goes (NCCL waits for graphs that hold it)
        coll.close()
    return samples


def main(check: bool = False) -> None:
    """Join the group, measure, report on rank 0 (``check``: every rank says OK), leave."""
    import torch
    import torch.distributed as dist
    from cugraphrt_torch.distributed import check_capture

    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    device = torch.device("cuda", local_rank)
    dist.init_process_group("nccl", device_id=device)
    check_capture()
    rank, world = dist.get_rank(), dist.get_world_size()
    loops = (_CHECK_STEPS, _CHECK_REPEATS) if check else (_STEPS, _REPEATS)
    results: dict[str, Any] = {"ddp": _ddp(torch, device, loops),
                               "tp": _tp(torch, rank, world, device, loops),
                               "cg": _cg(torch, rank, world, device, loops)}
    try:
        new = _CHECK_NEW if check else NEW
        results["generate_tp"] = generate_tp(torch, world, device, loops[1], new=new,
                                             layers=_CHECK_LAYERS if check else LAYERS)
        results["generate_tp"].update(generate_tp(
            torch, world, device, loops[1], new=new, layers=SHORT_LAYERS,
            hidden=short_hidden(world), batches=(1,), label=SHORT_LABEL))
    except Exception as exc:  # the other rows stand; this one shows the error
        if check:
            raise
        # Raised on every rank alike (a set-up or a check that fails the same everywhere);
        # a rank failing alone would leave the others' collectives unpaired until the
        # launch's deadline, which then reports every rank's stacks.
        results["generate_tp"] = {"error": f"{type(exc).__name__}: {exc}"}
    if check:
        print(f"OK bench-child rank={rank}", flush=True)
    elif rank == 0:
        print("RESULT " + json.dumps(results), flush=True)
    torch.cuda.synchronize()
    dist.barrier()
    dist.destroy_process_group()  # cugraphrt's graphs are released first


if __name__ == "__main__":
    main(check="--check" in sys.argv[1:])
