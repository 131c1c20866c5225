"""The child process of :mod:`cugraphrt.bench.family_memory`: one family built, two readings.

``python -m cugraphrt.bench.family_child WORKLOAD SYSTEM`` sets up the workload's model,
empties every cache, builds ``SYSTEM``'s family and prints ``MEMORY {"build": bytes,
"emptied": bytes}`` (:func:`cugraphrt.bench.family_memory.readings`).
"""

from __future__ import annotations

import gc
import json
import sys
from collections.abc import Callable
from typing import Any

from .family_memory import PREFIX, readings

__all__ = ["FAMILIES", "main"]


def _many_shapes(torch) -> dict[str, Callable[[], Any]]:
    from .workloads_shapes import _Family, _ours, _TorchGraphs

    family = _Family(torch)
    family.rewind(0)
    return {"cugraphrt": lambda: _ours(family), "torch_graphs": lambda: _TorchGraphs(torch, family)}


def _serving(torch) -> dict[str, Callable[[], Any]]:
    from .torch_common import adapter_function, convnet
    from .workloads_serving import BUCKETS, IMAGE, MAX_BATCH, HandBuckets

    graph_module = adapter_function("graph_module")
    torch.manual_seed(0)
    model = convnet(torch).cuda().eval()
    sample = torch.randn(MAX_BATCH, 3, IMAGE, IMAGE, device="cuda")
    model(sample)  # cuDNN handle and kernels, as the workload loads them before its builds

    def bucketed():
        family = graph_module(model, (sample.clone(),), buckets="pow2")
        family.capture_all(progress=False)
        return family

    return {"bucketed": bucketed,
            "torch_buckets": lambda: HandBuckets(torch, model, sample, BUCKETS)}


#: workload -> (torch -> {system: build}); the set-up runs before the first reading.
FAMILIES: dict[str, Callable[[Any], dict[str, Callable[[], Any]]]] = {
    "many_shapes": _many_shapes, "serving": _serving}


def _child(workload: str, system: str) -> dict[str, int]:
    import cupy
    import torch

    import cugraphrt

    from .torch_common import on_stream

    def empty() -> None:
        gc.collect()
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        cugraphrt.empty_cache()

    def free() -> int:
        torch.cuda.synchronize()
        return int(cupy.cuda.runtime.memGetInfo()[0])

    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.no_grad(), on_stream(torch, stream):
        return readings(FAMILIES[workload](torch)[system], empty, free)


def main(argv: list[str]) -> int:
    if len(argv) != 2 or argv[0] not in FAMILIES:
        print(f"usage: python -m cugraphrt.bench.family_child {{{','.join(FAMILIES)}}} "
              f"SYSTEM", file=sys.stderr)
        return 2
    print(PREFIX + json.dumps(_child(*argv)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
