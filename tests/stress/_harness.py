"""The harness of generated programs: capture, replay with new inputs, compare with eager runs.

:func:`check_program` runs a :class:`~tests.stress._programs.Program` under capture (through
a *capturer*: cugraphrt's ``graph``/``make_graphed`` for CuPy, ``cugraphrt_torch`` for torch,
or :class:`FakeCapturer`, which re-runs the ops eagerly, on the CPU), replays it with new
inputs, then runs the same ops eagerly on the same inputs and compares. Random draws are
compared exactly: the generator is re-seeded before the replays and again before the eager
runs, and replay ``k`` must draw what eager run ``k`` draws.
"""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass, field

import numpy as np

from ._interpret import Machine
from ._programs import Program


def round_data(program: Program, round_index: int) -> list[np.ndarray]:
    """The inputs of one round (-1: the bucket sample); never zeros for floats."""
    rng = np.random.default_rng((program.seed, round_index + 1))
    arrays = []
    for number, shape in enumerate(program.inputs):
        if program.sizes and round_index >= 0 and program.batched[number]:
            shape = (program.sizes[round_index], *shape[1:])
        if program.is_float:
            arrays.append(np.asarray(rng.uniform(-2, 2, shape), dtype=program.dtype))
        else:
            arrays.append(np.asarray(rng.integers(-9, 10, shape), dtype=program.dtype))
    return arrays


def tolerance(program: Program) -> float:
    """Relative tolerance of float outputs (also applied to the output's largest magnitude,
    for cancellation): eager and replayed kernels agree to a few ulps per op (cuBLAS may pick
    another algorithm with another workspace), so 64 ulps per kernel op of the program, plus
    one; integers and bools compare exactly."""
    if not program.is_float:
        return 0.0
    return 64 * float(np.finfo(program.dtype).eps) * (program.kernel_ops() + 1)


def compare(got: np.ndarray, want: np.ndarray, rtol: float) -> str | None:
    """None when ``got`` matches ``want``, else what differs (shape, dtype or values)."""
    if got.shape != want.shape or got.dtype != want.dtype:
        return f"got {got.dtype}{list(got.shape)}, expected {want.dtype}{list(want.shape)}"
    if want.dtype.kind in "biu" or rtol == 0:
        bad = got != want
    else:
        g, w = got.astype(np.float64), want.astype(np.float64)
        finite = np.isfinite(w)
        scale = max(1.0, float(np.abs(w[finite]).max())) if finite.any() else 1.0
        with np.errstate(invalid="ignore"):
            close = np.abs(g - w) <= rtol * (scale + np.abs(w))
        bad = ~(close | (g == w) | (np.isnan(g) & np.isnan(w)))
    if not bad.any():
        return None
    where = tuple(int(i) for i in np.argwhere(bad)[0])
    return (f"{int(bad.sum())} of {bad.size} elements differ (rtol {rtol:.1e}); first at "
            f"{where}: got {got[where]!r}, expected {want[where]!r}")


class FakeCapturer:
    """cugraphrt's stand-in on the CPU: a capture runs its block once and a replay runs it
    again; a graphed callable is the function itself."""

    def pool(self):
        return None

    def capture(self, block, pool):
        block()
        return block

    def graphed(self, fn, sample, program: Program):
        fn(*sample)
        return fn

    def release(self) -> None:
        pass


@dataclass
class Tally:
    """What a run of generated programs covered, for the reliability figures."""

    programs: int = 0
    calls: int = 0
    compared: int = 0
    fresh: int = 0
    families: Counter = field(default_factory=Counter)
    dtypes: Counter = field(default_factory=Counter)
    started: float = field(default_factory=time.perf_counter)

    def describe(self) -> str:
        ops = ", ".join(f"{name} {n}" for name, n in sorted(self.families.items()))
        dtypes = ", ".join(f"{name} {n}" for name, n in sorted(self.dtypes.items()))
        return (f"{self.programs} programs ({dtypes}), {self.calls} replays, {self.compared} "
                f"arrays equal to eager runs, {self.fresh} draws fresh per replay, 0 "
                f"mismatches; ops: {ops}; {time.perf_counter() - self.started:.1f} s")


def check_program(program: Program, backend, capturer, tally: Tally | None = None) -> None:
    """Capture, replay with new inputs, compare with eager runs; AssertionError on a mismatch
    (its message holds the program: paste it into check_program to replay it)."""
    backend.manual_seed(program.seed)
    if program.mode in ("graph", "shared_pool"):
        got = _replay_stages(program, backend, capturer)
        calls = program.rounds * len(program.stage_ranges())
    else:
        got = _call_graphed(program, backend, capturer)
        calls = program.rounds
    backend.manual_seed(program.seed)
    rtol, problems = tolerance(program), []
    for r in range(program.rounds):
        inputs = [backend.from_host(a) for a in round_data(program, r)]
        want = Machine(program, backend, inputs).run().outputs()
        for register, g, w in zip(program.outputs, got[r], want, strict=True):
            message = compare(g, backend.to_host(w), rtol)
            if message:
                problems.append(f"round {r}, register {register}: {message}")
    fresh = _check_fresh(program, got, problems)
    if problems:
        raise AssertionError(f"{backend.name} {program.mode}: replays differ from eager runs:\n"
                             + "\n".join(problems[:8]) + f"\nprogram: {program!r}")
    if tally is not None:
        tally.programs += 1
        tally.calls += calls
        tally.compared += program.rounds * len(program.outputs)
        tally.fresh += fresh
        tally.families.update(program.families())
        tally.dtypes[program.dtype] += 1


def _replay_stages(program: Program, backend, capturer) -> list[list[np.ndarray]]:
    statics = [backend.from_host(a) for a in round_data(program, 0)]
    backend.warm_up(lambda: Machine(program, backend, statics).run())
    machine = Machine(program, backend, statics)
    pool = capturer.pool() if program.mode == "shared_pool" else None
    try:
        replays = [capturer.capture(lambda a=start, b=stop: machine.run(a, b), pool)
                   for start, stop in program.stage_ranges()]
        backend.manual_seed(program.seed)
        got = []
        for r in range(program.rounds):
            if r:
                for static, array in zip(statics, round_data(program, r), strict=True):
                    backend.copy_into(static, array)
            for replay in replays:  # in capture order, as a shared pool requires
                replay()
            got.append([backend.to_host(v) for v in machine.outputs()])
        return got
    finally:
        capturer.release()


def _call_graphed(program: Program, backend, capturer) -> list[list[np.ndarray]]:
    sample = [backend.from_host(a) for a in round_data(program, -1 if program.sizes else 0)]
    try:
        graphed = capturer.graphed(
            lambda *args: Machine(program, backend, args).run().outputs(), sample, program)
        backend.manual_seed(program.seed)
        got = []
        for r in range(program.rounds):
            # The first call passes the static inputs themselves (no copy), later ones new
            # arrays (copied in); bucket calls always pass arrays of their own size.
            args = (sample if r == 0 and not program.sizes
                    else [backend.from_host(a) for a in round_data(program, r)])
            got.append([backend.to_host(v) for v in graphed(*args)])
        return got
    finally:
        capturer.release()


def _check_fresh(program: Program, got: list, problems: list[str]) -> int:
    """Uniform and normal draws differ between replays, and uniform ones keep their bounds."""
    checked = 0
    for register in program.fresh_draws():
        k = program.outputs.index(register)
        first, second = got[0][k], got[1][k]
        checked += 1
        if np.array_equal(first, second):
            problems.append(f"register {register}: the draws of replay 1 repeat replay 0's")
        op = program.ops[register]
        if op.name == "uniform" and not (op.params[1] <= first.min() and
                                         first.max() <= op.params[2]):
            problems.append(f"register {register}: uniform draws outside {op.params[1:]}")
    return checked
