"""zoo: does it graph my model? Every torchvision family and tiny transformers architectures
(:mod:`.zoo_models`, random weights, eval, no grad), each graphed four ways and compared with
eager on a fresh input:

* ``eager``: the model runs (1), or the reason it does not (then it leaves the counts);
* ``torch_graph``: ``torch.cuda.graph`` after 3 warm-ups on a side stream, in a pool of its
  own, inputs copied into the captured ones;
* ``cugraphrt``: ``cugraphrt_torch.graph_module(model, inputs)``, whole;
* ``cugraphrt_pieces``: the same, or where it cannot be whole, ``pieces=True`` (the value is
  the fraction of pieces graphed; a row beside it, unit ``share``, holds the share of the
  call's kernel time that ran in graph replays, from torch's profiler).

A system's cell is 1 when its outputs equal eager's within the dtype's rounding
(``torch.testing.assert_close``'s default tolerances), and an error naming why otherwise (a
capture refused, outputs that differ: their largest difference). Rounding, not bits, because
transformers takes another path while a stream captures: ``is_tracing()`` is true under
``torch.cuda.is_current_stream_capturing()``, and its attention then gets an explicit mask
where eager passes ``is_causal`` or none (another SDPA kernel, ~1e-7 apart), for
``torch.cuda.graph`` as for cugraphrt. A row beside the total counts the models equal bit for
bit. One row per model, one per family and a total counting the models graphed and equal; the
total's targets are the breadth issue's: of the models that run eagerly, at least 90% graphed
whole and 98% whole or in pieces. Runs only when named (``--only zoo``): a few minutes on an H200.
``CUGRAPHRT_ZOO_FAMILIES`` (comma-separated parts of family names, e.g. ``transformers`` or
``torchvision detection``) runs those families only.
"""

from __future__ import annotations

import gc
import os
import sys
from typing import Any

from .real_models import missing_package
from .spec import Context, RowBuilder, Target, Workload
from .timing import single
from .zoo_models import ZooModel, flatten_outputs, zoo_models

__all__ = ["ZOO", "SHARE", "graphed_share"]

SYSTEMS = ("eager", "torch_graph", "cugraphrt", "cugraphrt_pieces")
OURS = ("cugraphrt", "cugraphrt_pieces")
TOTAL = "total: models graphed and equal to eager"
SHARE = ": kernel time in graphs"
BITS = "bit for bit: models graphed and equal to eager to the bit"


def run_zoo(ctx: Context) -> None:
    missing = missing_package("torch", "torchvision", "transformers")
    if ctx.quick or missing or not ctx.selected:
        row = RowBuilder(TOTAL, "models", SYSTEMS, "eager", "cugraphrt")
        row.unavailable_all(missing or "runs only when named (--only zoo)")
        ctx.emit(row.build())
        return
    import torch

    counts: dict[str, dict[str, float]] = {}
    bits = dict.fromkeys(SYSTEMS, 0.0)
    for model in zoo_models(os.environ.get("CUGRAPHRT_ZOO_FAMILIES")):
        ctx.step(f"{model.family}: {model.name}")
        row = RowBuilder(f"{model.family}: {model.name}", "equal", SYSTEMS, "eager", "cugraphrt")
        family = counts.setdefault(model.family, dict.fromkeys(SYSTEMS, 0.0))
        with torch.no_grad():  # inference, and nothing left switched off for what follows
            outcome, exact, share = _graph_four_ways(torch, model, row)
        for system, value in outcome.items():
            family[system] += value > 0
            bits[system] += system in exact
        ctx.emit(row.build())
        if share is not None:
            ctx.emit(share.build())
        gc.collect()
        torch.cuda.empty_cache()
    total = dict.fromkeys(SYSTEMS, 0.0)
    for name, family in counts.items():
        row = RowBuilder(f"{name}: models graphed and equal to eager", "models", SYSTEMS,
                         "eager", "cugraphrt")
        for system, value in family.items():
            row.set(system, single(value))
            total[system] += value
        ctx.emit(row.build())
    row = RowBuilder(TOTAL, "models", SYSTEMS, "eager", "cugraphrt")
    for system, value in total.items():
        row.set(system, single(value))
    ctx.emit(row.build())
    row = RowBuilder(BITS, "models", SYSTEMS, "eager", "cugraphrt")
    for system, value in bits.items():
        row.set(system, single(value))
    ctx.emit(row.build())


def _graph_four_ways(torch, model: ZooModel, row: RowBuilder
                     ) -> tuple[dict[str, float], set[str], RowBuilder | None]:
    """Each system's value for ``model`` (1: equal to eager; 0: not, its cell an error; the
    pieces' value is the fraction of pieces graphed), the systems equal to the bit, and for
    a model graphed in pieces the row of its kernel time in graphs."""
    values = dict.fromkeys(SYSTEMS, 0.0)
    exact: set[str] = set()
    try:
        module, inputs = model.build(torch)
        expected, fresh = _eager(torch, module, inputs)
    except Exception as exc:  # noqa: BLE001 - reported in the cell, the zoo goes on
        for system in SYSTEMS:
            row.fail(system, exc if system == "eager" else RuntimeError("does not run eagerly"))
        return values, exact, None
    row.set("eager", single(1.0))
    values["eager"] = 1.0
    exact.add("eager")
    for system, attempt in (("torch_graph", _torch_graph), ("cugraphrt", _whole)):
        try:
            if _compare(torch, attempt(torch, module, inputs, fresh), expected):
                exact.add(system)
            values[system] = 1.0
            row.set(system, single(1.0))
        except Exception as exc:  # noqa: BLE001
            row.fail(system, exc)
    if values["cugraphrt"]:
        values["cugraphrt_pieces"] = 1.0
        row.set("cugraphrt_pieces", single(1.0))
        if "cugraphrt" in exact:
            exact.add("cugraphrt_pieces")
        return values, exact, None
    share = RowBuilder(f"{row.row.metric}{SHARE}", "share", SYSTEMS, "eager",
                       "cugraphrt_pieces")
    try:
        graphed, got = _pieces(torch, module, inputs, fresh)
        fraction = graphed.graphed_fraction()
        if _compare(torch, got, expected) and fraction > 0:
            exact.add("cugraphrt_pieces")
        values["cugraphrt_pieces"] = fraction if fraction > 0 else 0.0
        if fraction > 0:
            row.set("cugraphrt_pieces", single(fraction))
        else:
            row.fail("cugraphrt_pieces", RuntimeError("no piece is graphed"))
    except Exception as exc:  # noqa: BLE001
        row.fail("cugraphrt_pieces", exc)
        return values, exact, None
    try:
        kernels = _graphed_share(torch, lambda: graphed(*fresh))
        if kernels == 0 and fraction > 0:  # replays ran, yet no kernel was traced to one
            raise RuntimeError(f"the trace ties no kernel to a graph launch although "
                               f"{fraction:.0%} of the pieces replay")
        share.set("cugraphrt_pieces", single(kernels))
    except Exception as exc:  # noqa: BLE001 - the profiler's failure, not the model's
        share.fail("cugraphrt_pieces", exc)
    share.unavailable_all("only the pieces are measured")
    _log_pieces(row.row.metric, graphed.report())
    return values, exact, share


def _log_pieces(model: str, reports: list) -> None:
    """One log line per piece of a model graphed in pieces (stderr, beside the progress
    lines): whether it replays, how often, and why not, which the kernel-time share alone
    does not say."""
    for piece in reports:
        state = f"graphed, {piece.replays} replays" if piece.graphed else \
            f"not graphed ({piece.reason or 'no capture kept'})"
        print(f"cugraphrt bench: zoo: {model}: {piece.name}: {state}", file=sys.stderr)


def _eager(torch, module, inputs: tuple) -> tuple[tuple, tuple]:
    """Eager's outputs on a fresh input (and that input); refuses a model whose two eager
    runs differ (nothing could equal it)."""
    fresh = tuple(_like(torch, t) for t in inputs)
    module(*inputs)
    first = [t.clone() for t in flatten_outputs(torch, module(*fresh))]
    second = flatten_outputs(torch, module(*fresh))
    if not first or any(not torch.equal(a, b) for a, b in zip(first, second, strict=True)):
        raise RuntimeError("its eager outputs differ from run to run (or it has none)")
    return tuple(first), fresh


def _like(torch, tensor):
    gen = torch.Generator(tensor.device).manual_seed(1)
    if tensor.dtype.is_floating_point:
        return torch.rand(tensor.shape, dtype=tensor.dtype, device=tensor.device, generator=gen)
    high = max(int(tensor.max()) + 1, 2)
    return torch.randint(3 if high > 3 else 0, high, tensor.shape, dtype=tensor.dtype,
                         device=tensor.device, generator=gen)


def _torch_graph(torch, module, inputs: tuple, fresh: tuple) -> tuple:
    static = tuple(t.clone() for t in inputs)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            module(*static)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, pool=torch.cuda.graph_pool_handle()):
        out = module(*static)
    for target, value in zip(static, fresh, strict=True):
        target.copy_(value)
    graph.replay()
    return tuple(t.clone() for t in flatten_outputs(torch, out))


def _whole(torch, module, inputs: tuple, fresh: tuple) -> tuple:
    from cugraphrt_torch import graph_module

    graphed = graph_module(module, inputs)
    return tuple(t.clone() for t in flatten_outputs(torch, graphed(*fresh)))


def _pieces(torch, module, inputs: tuple, fresh: tuple) -> tuple[Any, tuple]:
    from cugraphrt_torch import graph_module

    graphed: Any = graph_module(module, inputs, pieces=True)
    return graphed, tuple(t.clone() for t in flatten_outputs(torch, graphed(*fresh)))


def _graphed_share(torch, call) -> float:
    """Of the kernel time of one ``call()`` on the device, the share graph replays ran, from a
    trace of torch's profiler (:func:`graphed_share`)."""
    import json
    import tempfile
    from pathlib import Path

    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        call()
        torch.cuda.synchronize()
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "trace.json"
        prof.export_chrome_trace(str(path))
        events = json.loads(path.read_text())["traceEvents"]
    return graphed_share(events)


def graphed_share(events: list[dict]) -> float:
    """Of the kernel time in a Chrome trace's ``events`` (torch's profiler), the share of the
    kernels a graph launch ran.

    CUPTI gives a kernel the ``correlation`` of the API call that launched it, and every
    kernel of a graph that of its ``cudaGraphLaunch`` (``cuGraphLaunch`` through the driver).
    A kernel whose launch the trace lacks counts as not graphed, so the share errs low.
    """
    launches = {event["args"]["correlation"] for event in events
                if event.get("cat") in ("cuda_runtime", "cuda_driver")
                and "GraphLaunch" in event.get("name", "")
                and "correlation" in event.get("args", {})}
    total = graphed = 0.0
    for event in events:
        if event.get("cat") == "kernel":
            took = float(event.get("dur", 0.0))
            total += took
            if event.get("args", {}).get("correlation") in launches:
                graphed += took
    if total <= 0:
        raise RuntimeError("the profiler recorded no kernel")
    return graphed / total


def _compare(torch, got: tuple, expected: tuple) -> bool:
    """True when ``got`` equals ``expected`` bit for bit, False when within the dtype's
    rounding; raises naming how they differ otherwise."""
    if len(got) != len(expected):
        raise RuntimeError(f"{len(got)} outputs, eager has {len(expected)}")
    exact = True
    for a, b in zip(got, expected, strict=True):
        if a.shape != b.shape:
            raise RuntimeError(f"an output of shape {tuple(a.shape)}, eager's "
                               f"{tuple(b.shape)}")
        if torch.equal(a, b):
            continue
        exact = False
        try:
            torch.testing.assert_close(a, b, equal_nan=True)
        except AssertionError:
            diff = (a.double() - b.double()).abs().max().item()
            raise RuntimeError(f"outputs differ from eager's (largest difference "
                               f"{diff:.3g})") from None
    return exact


ZOO = Workload(
    "zoo", "does it graph my model? torchvision's every family and tiny transformers "
    "architectures (random weights, eval): torch.cuda.graph, graph_module whole, and whole or "
    "in pieces, each against eager on a fresh input (1 = equal within the dtype's rounding)",
    SYSTEMS, "eager",
    (Target("cugraphrt", "eager", 0.90, "at_least", metric=TOTAL),
     Target("cugraphrt_pieces", "eager", 0.98, "at_least", metric=TOTAL)),
    run_zoo, own=OURS)
