"""The warm-up of an inference capture: ``module(*args)`` run on the capture stream, from the
capture's pool, right before the capture (:func:`~cugraphrt_torch.capture.capture.warmed_graph`).

:func:`graph_module` captures its one shape this way, and a bucket family its first bucket
(the largest: what the warm-ups load, every smaller bucket's capture finds loaded).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

from cugraphrt import Graph, MemPool
from cugraphrt.errors import CaptureError

from .._internals import transformers as _transformers
from ..capture._errors import is_host_copy
from ..capture.capture import graph, warmed_graph

__all__ = ["Experts", "capture_module", "warmed_capture"]


def warmed_capture(cuda_graph: Graph, pool: MemPool | None, module, args: tuple,
                   iterations: int, stage_host_constants: bool = False) -> graph:
    """The capture of ``module(*args)`` into ``cuda_graph``, after ``iterations`` eager runs
    on the capture stream whose memory comes from the capture's pool: the capture reuses
    their activations, and the cuBLAS workspace they create is the graph's own. The caller
    sets the autograd and inference modes."""
    if iterations == 0:
        return graph(cuda_graph, pool=pool, stage_host_constants=stage_host_constants)

    def warm_up() -> None:
        for _ in range(iterations):
            module(*args)

    return warmed_graph(cuda_graph, pool, warm_up, stage_host_constants)


class Experts:
    """Which experts a module's captures run (one per :func:`graph_module` call, one per
    bucket family): the model's own, until a capture with them is refused; then
    transformers' ``batched_mm`` for that capture and every later one of the family, which
    need not be refused again to learn it."""

    def __init__(self) -> None:
        self.graph_safe = False


def capture_module(make_graph: Callable[[], Graph], pool: MemPool | None, module,
                   args: tuple, iterations: int,
                   experts: Experts | None = None) -> tuple[graph, Any]:
    """``module(*args)`` captured after its warm-ups (:func:`warmed_capture`): the capture
    and the outputs. Where the forward copies host data to the device, which capture refuses,
    it is captured again (into a new graph) with its host constants staged
    (``stage_host_constants``): a forward that passes needs nothing extra, and one that makes
    a constant on the host (``torch.tensor(0.0, device=...)``, an index list) is graphed
    whole. A pageable CPU tensor made before the capture stays refused, by name.

    A transformers mixture-of-experts model is captured with its own experts first:
    transformers' default, ``grouped_mm``, keeps its offsets on the device where torch's
    grouped GEMM runs (CUDA, compute capability 8.0 and up), and the replays then equal the
    model's eager calls. Where the capture is refused (``grouped_mm``'s fallback and the
    ``eager`` experts read routing on the host), it is warmed up and captured again with
    transformers' ``batched_mm`` experts, which read nothing on the host, with a
    UserWarning; the model's own implementation comes back after (eager calls keep it)."""
    experts = experts if experts is not None else Experts()
    if not experts.graph_safe:
        try:
            return _capture_module(make_graph, pool, module, args, iterations)
        except CaptureError as exc:
            refused = exc
    with _transformers.graph_safe_experts(module) as switched:
        if not experts.graph_safe:
            if not switched:  # no experts to switch: the refusal stands
                raise refused
            warnings.warn(
                f"{type(module).__name__}: a capture with the model's own mixture-of-experts "
                f"implementation was refused ({_first_line(refused)}); it is captured with "
                "transformers' batched_mm experts instead, and its replays equal eager calls "
                "with batched_mm", UserWarning, stacklevel=3)
            experts.graph_safe = True
        return _capture_module(make_graph, pool, module, args, iterations)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    line = text[0] if text else type(exc).__name__
    return line if len(line) <= 200 else line[:197] + "..."


def _capture_module(make_graph: Callable[[], Graph], pool: MemPool | None, module,
                    args: tuple, iterations: int) -> tuple[graph, Any]:
    session = warmed_capture(make_graph(), pool, module, args, iterations)
    try:
        with session:
            return session, module(*args)
    except CaptureError as exc:
        if not is_host_copy(exc):
            _hint_pieces(exc)
            raise
    session = warmed_capture(make_graph(), pool, module, args, iterations,
                             stage_host_constants=True)
    try:
        with session:
            return session, module(*args)
    except CaptureError as exc:
        _hint_pieces(exc)
        raise


def _hint_pieces(exc: CaptureError) -> None:
    """Add to the error (same type, same chain) that ``pieces=True`` graphs around it."""
    if exc.args and isinstance(exc.args[0], str) and "pieces=True" not in exc.args[0]:
        exc.args = (f"{exc.args[0]} To graph the rest of the module around such a "
                    f"statement, call graph_module(..., pieces=True).", *exc.args[1:])
