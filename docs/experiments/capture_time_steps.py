"""Where a graph's build time goes: the figures of docs/performance.md, "Capture time".

``cugraphrt bench``'s ``capture_time`` row times whole builds (3 warm-ups, capture,
instantiate) of a 4x512 MLP: a hand-written ``torch.cuda.graph`` against
``cugraphrt_torch.graph_module``. This prints what the row cannot: the median wall time of
each step of both builds, timed by wrapping the functions that make them (torch's public
ones, and cugraphrt's own internals: the script measures the version it runs with).

Each build is timed as the bench times it (``capture_batch``: caches emptied and garbage
collected before the clock, model copy untimed), 30 builds a side after 3 untimed ones.
Nested steps include their children; ``xN`` is how often a step runs per build. Needs a CUDA
GPU and torch::

    python docs/experiments/capture_time_steps.py
    python docs/experiments/capture_time_steps.py --calls

``--calls`` counts instead the Python function calls each build makes (``cProfile``, 20
builds a side, nothing wrapped): a build runs once, with cold caches, so its host time
follows how much Python it runs more than any one step's cost.
"""

from __future__ import annotations

import collections
import copy
import cProfile
import functools
import pstats
import statistics
import sys
import time

import cugraphrt_torch
import torch
from cugraphrt_torch.capture import _alloc, _torch
from cugraphrt_torch.capture import capture as _capture_mod
from cugraphrt_torch.inference import module as _module

from cugraphrt._capture import graphs as _graphs
from cugraphrt._capture import stream_capture as _stream_capture
from cugraphrt._memory import pool as _pool
from cugraphrt.bench import torch_common

BUILDS = 30

_times: dict[str, list[float]] = collections.defaultdict(list)


def _wrap(owner, name: str, label: str) -> None:
    original = getattr(owner, name)

    @functools.wraps(original)
    def timed(*args, **kwargs):
        start = time.perf_counter()
        try:
            return original(*args, **kwargs)
        finally:
            _times[label].append(time.perf_counter() - start)

    setattr(owner, name, timed)


#: (owner, attribute, label): the steps, outermost first. Only what a build calls is timed.
STEPS = (
    (torch_common.HandGraph, "__init__", "torch: whole build"),
    (torch_common.HandGraph, "_capture", "torch: torch.cuda.graph block (after warm-ups)"),
    (torch.cuda.graphs.graph, "__enter__", "torch: graph.__enter__ (sync, empty_cache, begin)"),
    (torch.cuda.graphs.graph, "__exit__", "torch: graph.__exit__ (end, instantiate)"),
    (_module, "graph_module", "ours: whole build"),
    (_module, "validate_options", "ours: option validation (pydantic)"),
    (_module, "_sample_device", "ours: sample and module device check"),
    (_capture_mod.graph, "__enter__", "ours: graph.__enter__ (warm-ups, begin)"),
    (_capture_mod._TorchCapture, "__init__", "ours:   torch graph and MemPool for the pool"),
    (_pool.MemPool, "__init__", "ours:   cugraphrt private pool"),
    (_capture_mod._TorchCapture, "_start", "ours:   warm-ups + torch capture_begin"),
    (torch.cuda.CUDAGraph, "capture_begin", "both: CUDAGraph.capture_begin"),
    (_stream_capture, "_register", "ours:   CuPy allocator router"),
    (_capture_mod.graph, "__exit__", "ours: graph.__exit__ (end, instantiate, adopt)"),
    (_capture_mod._TorchCapture, "_finish", "ours:   torch capture_end + workspace clear"),
    (_stream_capture, "_finish", "ours:   pool and capture bookkeeping, deferred sweeps"),
    (_alloc, "_sweep", "ours:   sweep of released torch objects"),
    (_graphs.Graph, "_end", "ours:   core end (incl. the two above)"),
    (_capture_mod.Instantiate, "__call__", "ours:   instantiate (torch)"),
    (_module.GraphedModule, "__init__", "ours: call path set-up (copy-in, output check)"),
    (_torch, "drop_blas_workspaces", "ours: cuBLAS workspace clear"),
)


def count_calls(base, x) -> None:
    """Python calls per build, and the most frequent callees of cugraphrt's build."""
    builds = {"torch": lambda m: torch_common.HandGraph(torch, m, x),
              "ours": lambda m: cugraphrt_torch.graph_module(m, (x.clone(),),
                                                             num_warmup_iters=3)}
    runs = 20
    with torch.no_grad():
        for _ in range(3):
            for build in builds.values():
                build(copy.deepcopy(base))
        for side, build in builds.items():
            profile = cProfile.Profile()
            for _ in range(runs):
                model = copy.deepcopy(base)
                torch.cuda.synchronize()
                profile.enable()
                graphed = build(model)
                profile.disable()
                torch.cuda.synchronize()
                del graphed, model
            stats = pstats.Stats(profile).stats  # type: ignore[attr-defined]
            calls = sum(entry[1] for entry in stats.values()) / runs
            print(f"  {side}: {calls:.0f} Python calls per build")


def main() -> None:
    torch.manual_seed(0)
    base = torch_common.mlp(torch, (512,) * 5).cuda().eval()
    x = torch.randn(32, 512, device="cuda")
    with torch.no_grad():
        base(x)  # handles and kernels loaded, billed to neither build
    if "--calls" in sys.argv[1:]:
        print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}")
        count_calls(base, x)
        return

    def build_torch() -> float:
        model = copy.deepcopy(base)
        return torch_common.capture_batch(
            torch, lambda: model, lambda m: torch_common.HandGraph(torch, m, x))

    def build_ours() -> float:
        return torch_common.capture_batch(
            torch, lambda: copy.deepcopy(base),
            lambda m: cugraphrt_torch.graph_module(m, (x.clone(),), num_warmup_iters=3))

    for _ in range(3):
        build_torch()
        build_ours()
    for owner, name, label in STEPS:
        _wrap(owner, name, label)
    cugraphrt_torch.graph_module = _module.graph_module  # the wrapped one
    whole = {"torch": [], "ours": []}
    for _ in range(BUILDS):
        whole["torch"].append(build_torch())
        whole["ours"].append(build_ours())
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}; median of {BUILDS} "
          f"builds a side, ms (wrapped: each wrapper adds about a microsecond)")
    for side in ("torch", "ours"):
        print(f"  {side} build (capture_batch's clock): {statistics.median(whole[side]) * 1e3:.3f}")
    for _, _, label in STEPS:
        values = _times.get(label)
        if values:
            per_build = len(values) / BUILDS
            print(f"  {label:58s} {statistics.median(values) * 1e3:7.3f}  x{per_build:g}")


if __name__ == "__main__":
    main()
