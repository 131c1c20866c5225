"""Real-model training workload: a torchvision ResNet-18 training step.

Systems, each on its own copy of one model (same weights) on one torch side stream: eager,
``torch.cuda.make_graphed_callables`` (the anchor) and cugraphrt_torch's
``make_graphed_callables``. A step is ``zero_grad(set_to_none=True)``, the graphed forward,
cross-entropy, backward through the graphed backward, and an SGD step (momentum 0.9), all
timed as wall time per step. Before timing, every system trains the same few steps on the
same batches from the same weights: its losses and its BatchNorm running statistics are
compared with eager's (rows of their own). ``gpu_floor`` is the device time of cugraphrt's
forward and backward graphs replayed back to back.
"""

from __future__ import annotations

import copy
import functools
from typing import Any

from .real_models import resnet
from .spec import Context, RowBuilder, Target, Workload, cycling, verify
from .timing import gpu_batch, host_batch, single
from .torch_common import (
    CAPTURE_BUILDS,
    CAPTURE_TARGET,
    WARMUP_ITERS,
    adapter_function,
    capture_batch,
    on_stream,
    reserved_growth,
)
from .workloads_real import (
    CAPTURE,
    MEMORY,
    MS,
    PER_CALL,
    ROTATION,
    US,
    MiB,
    run_torch_rows,
)

__all__ = ["REAL_RESNET18"]

SYSTEMS = ("torch_eager", "torch_graphed", "cugraphrt_torch", "gpu_floor")
GRAPHED = ("torch_graphed", "cugraphrt_torch")
BATCH, IMAGE, CLASSES = 32, 224, 1000
CHECK_STEPS = 3
#: Relative loss difference allowed after CHECK_STEPS steps: cuDNN's backward kernels may
#: accumulate in another order; a wrong gradient or a stale replay is off by far more.
LOSS_TOL = 1e-3
STEP_METRIC = f"{PER_CALL} train step b{BATCH}"
LOSS, STATS = "loss vs eager", "BN running stats vs eager"


class _Trainer:
    """A module and its SGD optimizer; a call is one training step on ``(x, labels)``."""

    def __init__(self, torch, module) -> None:
        self.module = module
        self.optimizer = torch.optim.SGD(module.parameters(), lr=0.01, momentum=0.9)
        self.loss_of = torch.nn.functional.cross_entropy

    def __call__(self, batch):
        x, labels = batch
        self.optimizer.zero_grad(set_to_none=True)
        loss = self.loss_of(self.module(x), labels)
        loss.backward()
        self.optimizer.step()
        return loss.detach()


def _agreement(torch, trainer: _Trainer, batches) -> tuple[list[float], Any]:
    """Losses of CHECK_STEPS steps and the BatchNorm running statistics after them."""
    losses = [float(trainer(batch)) for batch in batches[:CHECK_STEPS]]
    norms = [m for m in trainer.module.modules()
             if isinstance(m, torch.nn.modules.batchnorm._BatchNorm)]
    stats = torch.cat([t.flatten().float() for m in norms
                       for t in (m.running_mean, m.running_var)])
    return losses, stats


def run_resnet18(ctx: Context) -> None:
    """ResNet-18 training step: eager vs torch's and cugraphrt_torch's make_graphed_callables."""
    layout = {STEP_METRIC: ("us", SYSTEMS, "torch_graphed"),
              CAPTURE: ("ms", GRAPHED, "torch_graphed"),
              MEMORY: ("MiB", GRAPHED, "torch_graphed"),
              LOSS: ("rel", SYSTEMS[:3], "torch_eager"),
              STATS: ("abs", SYSTEMS[:3], "torch_eager")}
    run_torch_rows(ctx, layout, ("torchvision",), False, _train_rows)


def _train_rows(ctx: Context, torch, rows: dict[str, RowBuilder]) -> None:
    base = resnet(torch, "resnet18")
    batches = [(torch.randn(BATCH, 3, IMAGE, IMAGE, device="cuda"),
                torch.randint(0, CLASSES, (BATCH,), device="cuda")) for _ in range(ROTATION)]
    sample = (batches[0][0].clone(),)
    makers = {"torch_graphed": torch.cuda.make_graphed_callables,
              "cugraphrt_torch": adapter_function("make_graphed_callables")}

    def build(system: str, module):
        return makers[system](module, sample, num_warmup_iters=WARMUP_ITERS)

    step_row, memory = rows[STEP_METRIC], rows[MEMORY]
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with on_stream(torch, stream):
        _Trainer(torch, copy.deepcopy(base))(batches[0])  # cuDNN handles, kernels: untimed
        ctx.step("capture")
        modules = {"torch_eager": copy.deepcopy(base)}
        # Copied outside the memory delta: the copy's weights are not the graphs' pool.
        theirs = functools.partial(build, "torch_graphed", copy.deepcopy(base))
        built = step_row.setup("torch_graphed", functools.partial(reserved_growth, torch, theirs))
        if built is not None:
            modules["torch_graphed"] = built[0]
            memory.set("torch_graphed", single(built[1] / MiB))
        ours = step_row.setup("cugraphrt_torch",
                              lambda: build("cugraphrt_torch", copy.deepcopy(base)))
        graphs = None if ours is None else ours.forward.graphed
        if graphs is not None:
            modules["cugraphrt_torch"] = ours
            memory.set("cugraphrt_torch",
                       single(graphs.forward_graph.pool().stats().reserved_bytes / MiB))
        trainers = {system: _Trainer(torch, module) for system, module in modules.items()}
        ctx.step("check against eager")
        timed = _checked(torch, rows, trainers, batches)
        if graphs is not None and "cugraphrt_torch" in timed:
            replays = functools.partial(_replay_both, graphs.forward_graph,
                                        graphs.backward_graph)
            timed["gpu_floor"] = functools.partial(gpu_batch, replays, ROTATION,
                                                   stream.cuda_stream)
        else:
            step_row.unavailable("gpu_floor", "needs the cugraphrt_torch graphs")
        ctx.step("measure")
        step_row.measure(timed, ctx.repeats(full=15, quick=4), scale=US)
        del trainers, modules, timed, built, theirs, ours, graphs
        ctx.step("capture time")
        rows[CAPTURE].measure(
            {system: functools.partial(capture_batch, torch, lambda: copy.deepcopy(base),
                                       functools.partial(build, system), True)
             for system in GRAPHED}, CAPTURE_BUILDS, scale=MS, warmup=1)


def _replay_both(forward_graph, backward_graph) -> None:
    forward_graph.replay()
    backward_graph.replay()


def _checked(torch, rows: dict[str, RowBuilder], trainers: dict[str, _Trainer], batches):
    """Timed batches of the systems whose losses match eager's; the agreement rows filled."""
    losses, stats = _agreement(torch, trainers["torch_eager"], batches)
    rows[LOSS].set("torch_eager", single(0.0))
    rows[STATS].set("torch_eager", single(0.0))

    def check(system: str) -> None:
        mine, my_stats = _agreement(torch, trainers[system], batches)
        loss_error = max(abs(a - b) / abs(b) for a, b in zip(mine, losses, strict=True))
        rows[LOSS].set(system, single(loss_error))
        rows[STATS].set(system, single(float((my_stats - stats).abs().max())))
        if loss_error > LOSS_TOL:
            raise RuntimeError(f"losses differ from eager's by {loss_error:.1e} relative "
                               f"(tolerance {LOSS_TOL:.0e}): {mine} vs {losses}")

    return {system: functools.partial(host_batch, cycling(trainer, batches), ROTATION,
                                      include_sync=True)
            for system, trainer in trainers.items()
            if system == "torch_eager"
            or verify(rows[STEP_METRIC], system, functools.partial(check, system))}


REAL_RESNET18 = Workload(
    "real_resnet18", f"torchvision ResNet-18 training step (fp32, batch {BATCH}, "
    f"{IMAGE}x{IMAGE}, SGD): wall time per step; losses and BatchNorm statistics after "
    f"{CHECK_STEPS} steps against eager; gpu_floor = cugraphrt's forward + backward graphs",
    SYSTEMS, "torch_graphed",
    (Target("cugraphrt_torch", "torch_graphed", 1.05, metric=STEP_METRIC),
     Target("cugraphrt_torch", "torch_graphed", CAPTURE_TARGET, metric=CAPTURE)),
    run_resnet18, own=("cugraphrt_torch", "gpu_floor"))
