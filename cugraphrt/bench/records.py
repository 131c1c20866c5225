"""Pydantic models of a benchmark run: what ``--json`` writes and the table is rendered from.

A report holds the measured numbers (:class:`BenchRecord`, one per table cell with a value),
the rows' layout (:class:`RowInfo`), the cells without a value (:class:`CellNote`: a system
that is not available, or one that failed), workloads that crashed (:class:`WorkloadError`)
and the targets' verdicts (:class:`TargetResult`). Everything the text table shows can be
rebuilt from the report alone.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

__all__ = [
    "BenchRecord",
    "RowInfo",
    "CellNote",
    "WorkloadError",
    "TargetResult",
    "BenchReport",
]


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


class BenchRecord(_Model):
    """One measured cell: a system's statistics for one metric of one workload.

    Attributes
    ----------
    workload : str
        Workload name (``replay``, ``chain``, ...).
    system : str
        The column: what was measured (``cugraphrt``, ``cupy_graph``, ``torch_compile``...).
    metric : str
        The row label inside the workload (``graph launch``, ``mlp 4x512 b32``...).
    unit : str
        ``us`` or ``ms`` (time per call), or ``MiB`` (memory).
    median, min, max : float
        Statistics over the repeats, in ``unit``.
    repeats : int
        Number of samples behind the statistics (1 for a single measurement such as a
        memory size).
    samples : list of float
        The samples, in ``unit``, in the order measured: round by round for interleaved
        systems, so the i-th samples of a row's systems were taken side by side (empty in
        reports written before they were kept).
    device : str
        The GPU the run used.
    versions : dict of str to str
        Versions of the software involved (cugraphrt, CuPy, CUDA, torch...).
    """

    workload: str
    system: str
    metric: str
    unit: str
    median: float
    min: float
    max: float
    repeats: int = Field(ge=1)
    samples: list[float] = []
    device: str
    versions: dict[str, str]

    @model_validator(mode="after")
    def _ordered(self) -> BenchRecord:
        # A tiny tolerance: the median of floats scaled to a unit can round past min or max.
        slack = 1e-9 * max(abs(self.max), abs(self.min), 1.0)
        if not (self.min - slack <= self.median <= self.max + slack):
            raise ValueError(
                f"statistics out of order (got min={self.min}, median={self.median}, "
                f"max={self.max}); expected min <= median <= max"
            )
        if self.samples and len(self.samples) != self.repeats:
            raise ValueError(f"{len(self.samples)} samples behind {self.repeats} repeats (got "
                             f"both); expected one sample per repeat, or none")
        return self


class RowInfo(_Model):
    """The layout of one table row.

    Attributes
    ----------
    workload, metric, unit : str
        As in :class:`BenchRecord`.
    reference : str
        The system the ratio column divides by.
    subject : str
        The system whose ratio to ``reference`` the ratio column shows.
    systems : list of str
        The row's columns, in display order.
    """

    workload: str
    metric: str
    unit: str
    reference: str
    subject: str
    systems: list[str]


class CellNote(_Model):
    """A cell without a value.

    Attributes
    ----------
    status : {"n/a", "error"}
        ``n/a``: the system is not available here (not installed, skipped in ``--quick``,
        failed to compile). ``error``: the system failed while being measured; the run's
        exit code is then 1.
    message : str
        The reason, shown in the cell.
    """

    workload: str
    metric: str
    system: str
    status: Literal["n/a", "error"]
    message: str


class WorkloadError(_Model):
    """A workload that crashed outside any one system's measurement."""

    workload: str
    message: str


class TargetResult(_Model):
    """The verdict of one target on one row.

    Attributes
    ----------
    ratio : float or None
        ``system / reference`` as :func:`cugraphrt.bench.spread.ratio` takes it (the
        median over rounds of interleaved samples); None when either cell has no value.
    low, high : float or None
        The ratio's 95% paired bootstrap interval over the repeats
        (:mod:`cugraphrt.bench.spread`); None for single measurements.
    within_spread : bool
        The threshold lies inside ``[low, high]``: the verdict was decided inside the
        spread (shown as ``PASS~`` / ``MISS~``), by noise as much as by the system.
    status : {"PASS", "MISS", "N/A"}
        ``N/A`` when the ratio could not be computed (``note`` says why).
    """

    workload: str
    metric: str
    system: str
    reference: str
    threshold: float = Field(gt=0)
    direction: Literal["at_most", "at_least"]
    ratio: float | None
    low: float | None = None
    high: float | None = None
    within_spread: bool = False
    status: Literal["PASS", "MISS", "N/A"]
    note: str = ""

    @property
    def label(self) -> str:
        """``PASS``, ``MISS`` or ``N/A``, with ``~`` when decided inside the spread."""
        return self.status + ("~" if self.within_spread else "")


class BenchReport(_Model):
    """Everything one ``cugraphrt bench`` run measured.

    Attributes
    ----------
    created : str
        ISO 8601 time (UTC) at which the run started.
    elapsed_s : float
        Wall time of the whole run.
    quick : bool
        Whether ``--quick`` was given.
    workload_s : dict of str to float
        Wall seconds of each workload that ran, in run order (empty in reports written
        before they were kept).
    """

    created: str
    device: str
    versions: dict[str, str]
    quick: bool
    elapsed_s: float = Field(ge=0)
    workload_s: dict[str, float] = {}
    rows: list[RowInfo] = []
    records: list[BenchRecord] = []
    notes: list[CellNote] = []
    errors: list[WorkloadError] = []
    targets: list[TargetResult] = []

    def record(self, workload: str, metric: str, system: str) -> BenchRecord | None:
        """The record of one cell, or None if the cell has no value."""
        for rec in self.records:
            if (rec.workload, rec.metric, rec.system) == (workload, metric, system):
                return rec
        return None

    def note(self, workload: str, metric: str, system: str) -> CellNote | None:
        """The note of one cell without a value, or None."""
        for note in self.notes:
            if (note.workload, note.metric, note.system) == (workload, metric, system):
                return note
        return None

    @property
    def failed(self) -> bool:
        """Whether a workload crashed or a system failed while being measured."""
        return bool(self.errors) or any(n.status == "error" for n in self.notes)
