"""graph_module(..., pieces=True): a module graphed in pieces around the statements that need
the host.

Some forwards cannot be captured whole: a statement reads a value on the host or makes a
shape from data (detection's non-maximum suppression, boxes per image, ``.item()``). The
compile backend already splits a program at such statements (dynamo's graph breaks) and
graphs every piece between them; this wraps it for a module: ``torch.compile`` with the
``"cugraphrt"`` backend and eager's kernels (``aot_eager``: the calls equal eager's), warmed up
and captured on the sample call, every later call replaying the pieces and running the
statements between them eagerly.
"""

from __future__ import annotations

import weakref
from typing import Any

import torch

from .._internals import compile as _compile
from ..compile._aot_graph import AotGraphReport, live_aot_graphs
from ..compile.dynamo import backend

__all__ = ["PiecewiseModule"]

#: Compilations per code object allowed while a PiecewiseModule compiles its sample call.
_RECOMPILES = 256


class PiecewiseModule:
    """A module's inference forward graphed in pieces: call it like the module.

    Made by :func:`cugraphrt_torch.graph_module` with ``pieces=True``. Each piece between two
    statements that need the host is captured on the sample call (after its warm-up) and
    replayed by later calls with inputs of the sample's shapes; other shapes compile and
    capture pieces of their own, as ``torch.compile`` does.

    Attributes
    ----------
    module : torch.nn.Module
    """

    def __init__(self, module: torch.nn.Module, sample_args: tuple, *,
                 num_warmup_iters: int) -> None:
        self.module = module
        before = {id(piece) for piece in live_aot_graphs()}
        # Eager's kernels (aot_eager), outputs copied: each call's results are its own and
        # equal eager's. warmup: eager runs of each piece before its capture.
        # The module's forward on a code object of its own where no hook needs the module's
        # __call__: dynamo keeps its compilations per code object, and with another module
        # of the class sharing them, each would re-record the other's pieces (their
        # parameters lie elsewhere) and report none of its own.
        self._compiled = torch.compile(
            _compile.own_forward(module) or module, backend=backend, dynamic=False,
            options={"compiler": "aot_eager", "warmup": max(1, num_warmup_iters)})
        # Dynamo keeps compilations per code object and, past its recompile limit (8), runs a
        # frame eagerly for good: every module of one class shares its forward's code, so
        # the ninth graph_module(..., pieces=True) of a class would graph nothing.
        with torch.no_grad(), _compile.recompile_limit(_RECOMPILES):
            for _ in range(max(1, num_warmup_iters) + 2):  # warm-ups, the capture, a replay
                self._compiled(*sample_args)
        self._pieces = [piece for piece in live_aot_graphs() if id(piece) not in before]
        # Dynamo keeps compiled code, and the pieces in it, for the life of the process:
        # their graphs and memory go when this module goes (at exit the driver frees them).
        weakref.finalize(self, _release, self._pieces).atexit = False

    def __call__(self, *args: Any) -> Any:
        with torch.no_grad():
            return self._compiled(*args)

    def report(self) -> list[AotGraphReport]:
        """One report per piece this module compiled on its sample call: whether it is
        graphed (replayed), or why it runs eagerly."""
        return [piece.report() for piece in self._pieces]

    def graphed_fraction(self) -> float:
        """The fraction of its pieces served by graph replays (1.0: every piece)."""
        reports = self.report()
        return sum(r.graphed for r in reports) / len(reports) if reports else 0.0

    def __repr__(self) -> str:
        reports = self.report()
        graphed = sum(r.graphed for r in reports)
        return (f"<cugraphrt_torch.PiecewiseModule of {type(self.module).__name__}: "
                f"{graphed} of {len(reports)} pieces graphed>")


def _release(pieces: list) -> None:
    for piece in pieces:
        piece.release()
