"""Generated programs: random CuPy and torch programs, replayed as graphs, equal eager runs.

Hypothesis draws small programs (``_generate.py``: element-wise ops, reductions, matmul,
views, in-place updates, random draws; shapes up to 64, a handful of ops) and each case runs
them through one way of graphing: a plain capture (``graph``), a graphed callable
(``make_graphed`` / ``cugraphrt_torch.graph_module``), shape buckets, or two or three graphs
in one shared pool replayed in capture order (with the pool-order checks on). Every program
is replayed with new inputs copied into its static inputs and compared with eager runs of
the same ops on the same inputs (``_harness.py``); random draws are compared exactly, after
re-seeding the generator. See docs/reliability.md, "Generated programs".

The programs are fixed by a seed per case (printed with the figures);
``CUGRAPHRT_PROGRAMS_SEED=<int>`` draws others. A failure prints the program (and hypothesis
shrinks it first); replay it with::

    from tests.stress._programs import Op, Program
    from tests.stress.test_generated_programs import check_cupy   # or check_torch
    check_cupy(Program(...))
"""

from __future__ import annotations

import gc
import os
import random
import zlib

import pytest
from hypothesis import HealthCheck, Phase, given, seed, settings

import cugraphrt
from tests.conftest import REQUIRE_GPU

from ._generate import programs
from ._harness import Tally, check_program
from ._interpret import CupyBackend, TorchBackend
from ._programs import MODES, Program

pytestmark = pytest.mark.gpu

#: Programs per mode and case: the normal run, and --stress (on top of the normal run).
CUPY_PROGRAMS = {"short": 50, "long": 500}
TORCH_PROGRAMS = {"short": 25, "long": 250}
#: inputs="rebind" (graphed and buckets ways): 3,000 programs under --stress (issue 37).
REBIND_CUPY_PROGRAMS = {"short": 40, "long": 1000}
REBIND_TORCH_PROGRAMS = {"short": 20, "long": 500}
REBIND_MODES = ("graphed", "buckets")
#: Torch keeps a reset graph's private segments cached until empty_cache (docs/reliability.md).
TORCH_EMPTY_CACHE_EVERY = 20


class CupyCapturer:
    """Captures with cugraphrt and releases every graph after its program.

    Half the graphs and graphed callables, drawn at random, are kept by nothing but the
    handle the program replays through (``g.replay``, the callable): the capturer drops its
    name and collects garbage before the first replay, and the graph goes with the handle
    (the lifetime rule of docs/concepts.md). The others it keeps and resets after the
    program, as before.
    """

    def __init__(self, seed: int = 0) -> None:
        self._graphs: list = []
        self._graphed: list = []
        self._draw = random.Random(seed)
        self.dropped = 0  # graphs and callables kept only by their replay handle

    def pool(self):
        return cugraphrt.graph_pool_handle()

    def _keep(self, graph, kept: list) -> None:
        if self._draw.random() < 0.5:
            kept.append(graph)
        else:
            self.dropped += 1
            gc.collect(1)  # a graph held only through a cycle would go now

    def capture(self, block, pool):
        g = cugraphrt.Graph()
        with cugraphrt.graph(g, pool=pool):
            block()
        self._keep(g, self._graphs)
        return g.replay

    def graphed(self, fn, sample, program: Program, inputs: str = "copy"):
        graphed = cugraphrt.make_graphed(fn, tuple(sample), num_warmup_iters=1, inputs=inputs,
                                         **_bucket_options(program))
        self._keep(graphed, self._graphed)
        return graphed

    def release(self) -> None:
        for g in self._graphs:
            g.reset()
        for graphed in self._graphed:
            if hasattr(graphed, "release"):
                graphed.release()  # every bucket's graph
            else:
                graphed.graph.reset()
        self._graphs.clear()
        self._graphed.clear()


class TorchCapturer(CupyCapturer):
    """Captures torch work with cugraphrt_torch (graph, graph_module)."""

    def __init__(self, seed: int = 0) -> None:
        super().__init__(seed)
        import cugraphrt_torch
        import torch

        class Forward(torch.nn.Module):
            def __init__(self, fn) -> None:
                super().__init__()
                self.fn = fn

            def forward(self, *args):
                return self.fn(*args)

        self.torch, self.adapter, self.module = torch, cugraphrt_torch, Forward
        self.programs = 0

    def capture(self, block, pool):
        g = cugraphrt.Graph()
        with self.adapter.graph(g, pool=pool):
            block()
        self._keep(g, self._graphs)
        return g.replay

    def graphed(self, fn, sample, program: Program, inputs: str = "copy"):
        graphed = self.adapter.graph_module(self.module(fn), tuple(sample), num_warmup_iters=1,
                                            inputs=inputs, **_bucket_options(program))
        self._keep(graphed, self._graphed)
        return graphed

    def release(self) -> None:
        super().release()
        self.programs += 1
        if self.programs % TORCH_EMPTY_CACHE_EVERY == 0:
            self.torch.cuda.empty_cache()


class Rebinding:
    """Wraps a capturer so that its graphed callables take ``inputs="rebind"``; counts the
    callables that rebind and those whose plan was incomplete (they copy, warning once)."""

    def __init__(self, capturer) -> None:
        self.inner = capturer
        self.rebound = self.copied = 0
        self.reasons: dict[str, int] = {}  # why a plan was incomplete -> how many callables

    def __getattr__(self, name):
        return getattr(self.inner, name)

    #: Why a generated program may copy: what it does with its inputs, not a gap of the plan.
    #: An output that views an input (a slice, a reshape) keeps the capture's buffer, and a
    #: view at an odd offset puts an unaligned address in a kernel. How many programs do so
    #: depends on what Hypothesis draws (its draws shift with the test order), so the check
    #: is on the reasons, not on a share.
    EXPLAINED = ("lies inside input", "at an unaligned offset", "share memory")

    def check(self) -> None:
        assert self.rebound, "no generated program rebinds"
        unexplained = {why: n for why, n in self.reasons.items()
                       if not any(reason in why for reason in self.EXPLAINED)}
        assert not unexplained, f"plans incomplete for a reason the program does not give: " \
                                f"{unexplained}"

    def graphed(self, fn, sample, program: Program):
        import warnings

        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            graphed = self.inner.graphed(fn, sample, program, inputs="rebind")
            if hasattr(graphed, "capture_all"):  # every bucket's plan made (and counted) now
                graphed.capture_all(progress=False)
        fell_back = [str(w.message) for w in caught if "falls back to copying" in str(w.message)]
        if fell_back:
            self.copied += 1
            why = fell_back[0].split("falls back to copying (", 1)[-1].split(");", 1)[0]
            self.reasons[why] = self.reasons.get(why, 0) + 1
        else:
            self.rebound += 1
        return graphed


def _bucket_options(program: Program) -> dict:
    if not program.sizes:
        return {}
    return dict(buckets=program.buckets,
                dynamic_dim=tuple(0 if batched else None for batched in program.batched))


def check_cupy(program: Program) -> None:
    """Run one program (a printed one, to replay a failure) with CuPy."""
    check_program(program, CupyBackend(), CupyCapturer())


def check_torch(program: Program) -> None:
    """Run one program (a printed one, to replay a failure) with torch."""
    check_program(program, TorchBackend("cuda"), TorchCapturer())


def _run_programs(label: str, mode: str, count: int, backend, capturer, figures) -> None:
    tally = Tally()
    case_seed = zlib.crc32(f"{label}/{mode}".encode()) + int(
        os.environ.get("CUGRAPHRT_PROGRAMS_SEED", "0"))

    @seed(case_seed)
    @settings(max_examples=count, deadline=None, database=None, print_blob=True,
              suppress_health_check=list(HealthCheck), report_multiple_bugs=False,
              phases=(Phase.generate, Phase.shrink))
    @given(program=programs(mode))
    def check(program: Program) -> None:
        check_program(program, backend, capturer, tally)

    before = cugraphrt.pool_checks_enabled()
    # Shared pools replay in capture order: the safety mode must agree (no PoolOrderError).
    cugraphrt.set_pool_checks(mode == "shared_pool")
    try:
        check()
    finally:
        cugraphrt.set_pool_checks(before)
    rebinding = (f"; inputs='rebind': {capturer.rebound} callables rebound, "
                 f"{capturer.copied} copied (incomplete plan: {capturer.reasons})"
                 if isinstance(capturer, Rebinding) else "")
    figures.add(f"generated programs/{label} {mode}",
                f"{tally.describe()}; {capturer.dropped} graphs or callables kept only by "
                f"their replay handle (seed {case_seed}){rebinding}")
    assert tally.programs >= count * 0.9, f"only {tally.programs} of {count} programs ran"
    assert capturer.dropped > 0, "no graph was kept only by its replay handle"


def _require_torch_cuda() -> None:
    torch = pytest.importorskip("torch", reason="the torch programs need torch")
    if not torch.cuda.is_available():
        if REQUIRE_GPU:
            pytest.fail("CUGRAPHRT_REQUIRE_GPU=1 but torch sees no CUDA device (a CPU build of "
                        "torch?)", pytrace=False)
        pytest.skip("needs a CUDA build of torch")


@pytest.mark.parametrize("mode", MODES)
def test_cupy_programs_replay_like_eager_runs(mode, level, figures):
    count = level.pick(short=CUPY_PROGRAMS["short"], long=CUPY_PROGRAMS["long"])
    _run_programs("cupy", mode, count, CupyBackend(), CupyCapturer(count), figures)


@pytest.mark.parametrize("mode", MODES)
def test_torch_programs_replay_like_eager_runs(mode, level, figures):
    _require_torch_cuda()
    count = level.pick(short=TORCH_PROGRAMS["short"], long=TORCH_PROGRAMS["long"])
    _run_programs("torch", mode, count, TorchBackend("cuda"), TorchCapturer(count), figures)


@pytest.mark.parametrize("mode", REBIND_MODES)
def test_cupy_programs_rebound_replay_like_eager_runs(mode, level, figures, monkeypatch):
    """inputs="rebind": each call's arrays are rebound (or, for an incomplete plan, copied)
    and the replays equal eager runs of the same program. The programs' arrays are small:
    every input is rebound, whatever its size (CUGRAPHRT_REBIND_MIN_BYTES=0)."""
    monkeypatch.setenv("CUGRAPHRT_REBIND_MIN_BYTES", "0")
    count = level.pick(short=REBIND_CUPY_PROGRAMS["short"], long=REBIND_CUPY_PROGRAMS["long"])
    capturer = Rebinding(CupyCapturer(count))
    _run_programs("cupy rebind", mode, count, CupyBackend(), capturer, figures)
    capturer.check()


@pytest.mark.parametrize("mode", REBIND_MODES)
def test_torch_programs_rebound_replay_like_eager_runs(mode, level, figures, monkeypatch):
    monkeypatch.setenv("CUGRAPHRT_REBIND_MIN_BYTES", "0")
    _require_torch_cuda()
    count = level.pick(short=REBIND_TORCH_PROGRAMS["short"],
                       long=REBIND_TORCH_PROGRAMS["long"])
    capturer = Rebinding(TorchCapturer(count))
    _run_programs("torch rebind", mode, count, TorchBackend("cuda"), capturer, figures)
    capturer.check()
