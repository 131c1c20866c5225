"""What a workload declares and what it hands back: targets, rows, cells and the run context.

A workload is a name, a description, its columns (systems), its reference system, its targets
and a ``run(ctx)`` function. ``run`` builds rows with :class:`RowBuilder` and hands each to
``ctx.emit`` as soon as it is complete, so the rows finished before a crash still reach the
table.
"""

from __future__ import annotations

import functools
import itertools
import sys
import traceback
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from . import timing
from .timing import Summary

__all__ = [
    "SystemUnavailable",
    "NotAvailable",
    "Failed",
    "Cell",
    "Row",
    "RowBuilder",
    "Target",
    "Workload",
    "Context",
    "describe",
    "keep",
    "measure_together",
    "cycling",
    "cycling_calls",
    "rotating",
    "prepared",
    "check_close",
    "verify",
]


class SystemUnavailable(Exception):
    """Raised while setting a system up when it cannot run here; the cell shows n/a."""


@dataclass(frozen=True)
class NotAvailable:
    """A cell whose system cannot run here (not installed, skipped in --quick)."""

    reason: str


@dataclass(frozen=True)
class Failed:
    """A cell whose system raised while being set up or measured."""

    message: str


Cell = Summary | NotAvailable | Failed


@dataclass
class Row:
    """One table row: a metric of a workload and a cell per system."""

    metric: str
    unit: str
    reference: str
    subject: str
    systems: tuple[str, ...]
    cells: dict[str, Cell]


def describe(exc: BaseException, limit: int = 300) -> str:
    """``Type: first line of the message``, shortened to ``limit`` characters."""
    text = str(exc).strip().splitlines()
    message = f"{type(exc).__name__}: {text[0]}" if text else type(exc).__name__
    return message if len(message) <= limit else message[: limit - 3] + "..."


class RowBuilder:
    """Collects the cells of one row; setup and measurement failures become cells.

    Parameters
    ----------
    metric : str
        Row label.
    unit : str
        Unit of the values stored with :meth:`set`.
    systems : tuple of str
        The row's columns, in display order.
    reference, subject : str
        The ratio column shows ``subject / reference``.
    """

    def __init__(self, metric: str, unit: str, systems: tuple[str, ...], reference: str,
                 subject: str) -> None:
        self.row = Row(metric, unit, reference, subject, tuple(systems), {})

    def setup(self, system: str, factory: Callable[..., object]):
        """Call ``factory``; on failure record the cell and return None.

        :class:`SystemUnavailable` makes the cell n/a; any other exception makes it an
        error (the run's exit code becomes 1).
        """
        try:
            return factory()
        except SystemUnavailable as exc:
            self.unavailable(system, str(exc))
        except Exception as exc:  # noqa: BLE001 - one system's failure must not end the row
            self.fail(system, exc)
        return None

    def unavailable(self, system: str, reason: str) -> None:
        """Mark ``system`` n/a for ``reason``."""
        self.row.cells[system] = NotAvailable(reason)

    def unavailable_all(self, reason: str) -> None:
        """Mark every system without a cell yet n/a for ``reason``."""
        for system in self.row.systems:
            self.row.cells.setdefault(system, NotAvailable(reason))

    def fail(self, system: str, exc: BaseException) -> None:
        """Mark ``system`` failed with ``exc``; its traceback goes to stderr."""
        self.row.cells[system] = Failed(describe(exc))
        # The cell holds one line; whoever reads the run needs the whole story.
        print(f"cugraphrt bench: {system} failed on {self.row.metric!r}:", file=sys.stderr)
        traceback.print_exception(type(exc), exc, exc.__traceback__, file=sys.stderr)

    def set(self, system: str, summary: Summary) -> None:
        """Store a measured cell (already in the row's unit)."""
        self.row.cells[system] = summary

    def measure(self, batches: Mapping[str, Callable[[], float] | None], repeats: int, *,
                scale: float, warmup: int = 2) -> None:
        """Time the systems interleaved (see :func:`timing.interleave`) and store the cells.

        Systems whose entry is None (their setup failed) are skipped; ``scale`` converts
        seconds to the row's unit.
        """
        live = {name: batch for name, batch in batches.items() if batch is not None}
        samples = timing.interleave(live, repeats, warmup=warmup, on_error=self.fail)
        for name, values in samples.items():
            self.set(name, timing.summarize(values).scaled(scale))

    def fail_once(self, system: str, exc: BaseException, others: Sequence[RowBuilder]) -> None:
        """Mark ``system`` failed here (with its traceback) and in ``others`` (without)."""
        self.fail(system, exc)
        for other in others:
            if other is not self and system in other.row.systems:
                other.row.cells[system] = self.row.cells[system]

    def build(self) -> Row:
        """The row; systems never set up are marked n/a."""
        for system in self.row.systems:
            self.row.cells.setdefault(system, NotAvailable("not measured"))
        return self.row


@dataclass(frozen=True)
class Target:
    """A performance target: ``system / reference`` must stay on one side of ``threshold``.

    Attributes
    ----------
    system, reference : str
        Columns of the ratio.
    threshold : float
        The bound on the row's ratio (:func:`cugraphrt.bench.spread.ratio`).
    direction : {"at_most", "at_least"}
        ``at_most`` for lower-is-better metrics (every metric of this benchmark).
    metric : str or None
        The row it applies to; None for every row of the workload.
    """

    system: str
    reference: str
    threshold: float
    direction: Literal["at_most", "at_least"] = "at_most"
    metric: str | None = None

    def holds(self, ratio: float) -> bool:
        """Whether ``ratio`` meets the target."""
        if self.direction == "at_most":
            return ratio <= self.threshold
        return ratio >= self.threshold

    def describe(self) -> str:
        """The bound as text, e.g. ``<= 1.05x``."""
        sign = "<=" if self.direction == "at_most" else ">="
        return f"{sign} {self.threshold:.2f}x"


@dataclass(frozen=True)
class Workload:
    """A benchmark workload: one block of the table.

    Attributes
    ----------
    name : str
        What ``--only`` selects.
    description : str
        One line shown above the block.
    systems : tuple of str
        Columns, in display order.
    reference : str
        Default reference of its rows (a row may override it).
    targets : tuple of Target
    run : callable
        ``run(ctx)``: measures and emits rows.
    own : tuple of str
        The systems cugraphrt builds (its graphs, its pools, bounds read from them). A
        target's reference is never one of them: a ratio of cugraphrt to itself is printed
        as information, without a verdict (docs/performance.md, "Targets").

    Raises
    ------
    ValueError
        For a target whose reference is one of ``own``, or that names a system the workload
        does not have.
    """

    name: str
    description: str
    systems: tuple[str, ...]
    reference: str
    targets: tuple[Target, ...]
    run: Callable[[Context], None]
    own: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        for target in self.targets:
            unknown = {target.system, target.reference} - set(self.systems)
            if unknown:
                raise ValueError(f"{self.name}: a target names systems it does not have "
                                 f"(got {sorted(unknown)})")
            if target.reference in self.own:
                raise ValueError(f"{self.name}: the target {target.system} / "
                                 f"{target.reference} compares cugraphrt with itself (got "
                                 f"reference {target.reference!r}, one of own={self.own}); "
                                 f"reference a system cugraphrt does not build")


@dataclass
class Context:
    """What a running workload sees: the mode, progress reporting and the row sink.

    Attributes
    ----------
    quick : bool
        ``--quick``: fewer repeats, slowest variants skipped.
    selected : bool
        The run names this workload (``--only``, ``--real``): ``--quick`` then shortens what
        it would otherwise skip.
    rows : list of Row
        Rows emitted so far by the current workload.
    emitted : callable
        Called after each emitted row: the runner rewrites its JSON then, so a long workload
        cut short (a device call's time limit) keeps the rows it finished.
    shared : dict
        The same dict for every workload of one run: one measurement that fills several
        workloads' rows (the distributed launch) is kept here, not repeated per workload.
    """

    quick: bool = False
    selected: bool = False
    progress: Callable[[str], None] = field(default=lambda detail: None)
    rows: list[Row] = field(default_factory=list)
    emitted: Callable[[], None] = field(default=lambda: None)
    shared: dict[str, Any] = field(default_factory=dict)

    def repeats(self, full: int, quick: int) -> int:
        """The repeat count for the current mode."""
        return quick if self.quick else full

    def emit(self, row: Row) -> None:
        """Hand a finished row to the runner."""
        self.rows.append(row)
        self.emitted()

    def step(self, detail: str) -> None:
        """Report progress inside the workload (shown on the progress bar)."""
        self.progress(detail)


def measure_together(rows: Sequence[RowBuilder], batches: Mapping[str, Callable[[], float] | None],
                     repeats: int, *, scale: float, warmup: int = 2) -> None:
    """Time the systems of several rows in one interleaved rotation (A, B, C, A, B, C, ...).

    Each system's cell goes to every row that lists it, so rows that share a reference
    divide by the same samples, taken in the same rounds as their subjects. A system whose
    entry is None failed its set-up in one row: that cell is copied to the others.
    """
    for name, batch in batches.items():
        holders = [row for row in rows if name in row.row.systems]
        done = next((row.row.cells[name] for row in holders if name in row.row.cells), None)
        if batch is None and done is not None:
            for row in holders:
                row.row.cells.setdefault(name, done)

    def fail(name: str, exc: BaseException) -> None:
        holders = [row for row in rows if name in row.row.systems]
        holders[0].fail_once(name, exc, holders)

    live = {name: batch for name, batch in batches.items() if batch is not None}
    samples = timing.interleave(live, repeats, warmup=warmup, on_error=fail)
    for name, values in samples.items():
        summary = timing.summarize(values).scaled(scale)
        for row in rows:
            if name in row.row.systems:
                row.set(name, summary)


def keep(fn: Callable[..., float], *args: object) -> Callable[[], float]:
    """``fn`` bound to ``args``: the batch holds them (arrays a graph reads and writes must
    outlive its replays, or their memory could be handed to other arrays meanwhile)."""
    return functools.partial(fn, *args)


def cycling(fn: Callable[[object], object], inputs: Sequence[object]) -> Callable[[], object]:
    """A no-argument call of ``fn`` on the next of ``inputs``, round and round.

    Rotating inputs keeps caches and skipped copies from flattering a system: a graph whose
    caller passed the static input itself would skip its copy-in.
    """
    source = itertools.cycle(inputs)
    return lambda: fn(next(source))


def rotating(batches: Sequence[Callable[[], float]]) -> Callable[[], float]:
    """One system's batch over several builds of it: each sample times the next build, so
    that a row's median reads a typical build rather than one build's placement in memory
    (why it matters: ``torch_common.PLACEMENTS``)."""
    source = itertools.cycle(batches)
    return lambda: next(source)()


def cycling_calls(fn: Callable[..., object], inputs: Sequence[tuple]) -> Callable[[], object]:
    """:func:`cycling` for calls of several arguments: ``fn(*args)`` on the next of
    ``inputs``, argument tuples."""
    source = itertools.cycle(inputs)
    return lambda: fn(*next(source))


def prepared(before: Callable[[], None], batch: Callable[[], float]) -> Callable[[], float]:
    """A timed batch that runs ``before()`` first: outside ``batch``'s clock, which starts
    after its own synchronization (:func:`timing.host_batch`)."""
    def run() -> float:
        before()
        return batch()
    return run


def check_close(actual, expected, what: str, tol: float) -> None:
    """Raise unless ``actual`` matches ``expected`` to a relative 2-norm error of ``tol``.

    Parameters
    ----------
    actual, expected : array_like
        Host arrays (NumPy); compared in float64.
    what : str
        Names the result in the error message.
    tol : float
        Largest allowed ``||actual - expected|| / ||expected||``.

    Raises
    ------
    RuntimeError
        On a NaN or infinity, a shape mismatch or an error above ``tol``.
    """
    import numpy as np

    a = np.asarray(actual, dtype=np.float64)
    e = np.asarray(expected, dtype=np.float64)
    if a.shape != e.shape:
        raise RuntimeError(f"{what}: result has shape {a.shape}, eager has {e.shape}")
    if not np.isfinite(a).all():
        raise RuntimeError(f"{what}: result holds NaN or infinity (eager does not)")
    error = float(np.linalg.norm(a - e) / max(float(np.linalg.norm(e)), 1e-30))
    if error > tol:
        raise RuntimeError(f"{what}: result differs from eager (relative error {error:.2e}, "
                           f"tolerance {tol:.0e}); the timings would compare different work")


def verify(row: RowBuilder, system: str, check: Callable[[], object]) -> bool:
    """Run ``check``; if it raises, the system's cell records the failure and it is not timed.

    Returns
    -------
    bool
        Whether the check passed.
    """

    def passed() -> bool:
        check()
        return True

    return row.setup(system, passed) is True
