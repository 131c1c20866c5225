"""Text and plot output of a :class:`~cugraphrt.bench.records.BenchReport`.

The table has a block per workload: a row per metric, a column per system (medians over
repeats, the row's reference marked ``*``), and a ratio column, the row's subject (the
cugraphrt system) over its reference. Cells without a value read ``n/a (reason)`` or
``error: ...``; long messages are cut in the cell and given in full under the block.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import cast

from . import spread
from .records import BenchRecord, BenchReport, RowInfo

__all__ = ["render_report", "render_table", "render_targets", "headline", "format_value",
           "plot_rows", "write_plot"]

#: Longest cell text; longer n/a or error messages are cut and repeated under the block.
CELL_WIDTH = 40


def format_value(value: float) -> str:
    """A median in at least three significant digits, without exponents."""
    magnitude = abs(value)
    if magnitude >= 1000:
        return f"{value:,.0f}"
    if magnitude >= 100:
        return f"{value:.0f}"
    if magnitude >= 10:
        return f"{value:.1f}"
    if magnitude >= 1:
        return f"{value:.2f}"
    return f"{value:.3g}"


def render_report(report: BenchReport, descriptions: Mapping[str, str] | None = None, *,
                  quick_budget_s: float | None = None) -> str:
    """The whole text output: table, targets, and a footer with device and versions."""
    parts = [render_table(report, descriptions or {}), render_targets(report)]
    versions = ", ".join(f"{k} {v}" for k, v in report.versions.items())
    mode = " (--quick)" if report.quick else ""
    footer = [f"device: {report.device}", f"versions: {versions}",
              f"run: {report.created}, {report.elapsed_s:.1f} s{mode}"]
    if report.quick and quick_budget_s is not None and report.elapsed_s > quick_budget_s:
        footer.append(f"warning: the --quick run took {report.elapsed_s:.0f} s, over its "
                      f"{quick_budget_s:.0f} s budget{_slowest(report)}")
    parts.append("\n".join(footer))
    return "\n\n".join(p for p in parts if p)


def _slowest(report: BenchReport, count: int = 3) -> str:
    """`` (slowest: a 31 s, b 22 s, c 9 s)``: where a run's time went, or ``""`` when the
    report has no per-workload times."""
    slowest = sorted(report.workload_s.items(), key=lambda item: -item[1])[:count]
    if not slowest:
        return ""
    return " (slowest: " + ", ".join(f"{name} {s:.0f} s" for name, s in slowest) + ")"


def _workload_order(report: BenchReport) -> list[str]:
    names: list[str] = []
    for name in [r.workload for r in report.rows] + [e.workload for e in report.errors]:
        if name not in names:
            names.append(name)
    return names


def render_table(report: BenchReport, descriptions: Mapping[str, str] | None = None) -> str:
    """A block per workload: metric, unit, a column per system, ratio."""
    descriptions = descriptions or {}
    blocks = []
    for name in _workload_order(report):
        rows = [r for r in report.rows if r.workload == name]
        title = f"{name}: {descriptions[name]}" if name in descriptions else name
        lines = [title]
        footnotes: list[str] = []
        skipped = _one_reason(report, rows)
        if skipped is not None:
            # A workload left out as a whole (--quick, a missing package) takes one line,
            # not a table of identical cells.
            lines.append(f"  n/a ({skipped})")
        elif rows:
            lines += _block(report, rows, footnotes)
        lines += [f"  error: {e.message}" for e in report.errors if e.workload == name]
        lines += footnotes
        blocks.append("\n".join(lines))
    if not blocks:
        return "no workload ran"
    legend = ("medians over repeats; * = the row's reference; ratio = subject / reference, "
              "the median over rounds of the two measured side by side [95% interval over "
              "the repeats]")
    return legend + "\n\n" + "\n\n".join(blocks)


def _one_reason(report: BenchReport, rows: list[RowInfo]) -> str | None:
    """The reason when every cell of the workload is n/a for one reason, else None."""
    reasons = set()
    for row in rows:
        for system in row.systems:
            note = report.note(row.workload, row.metric, system)
            if report.record(row.workload, row.metric, system) is not None or note is None \
                    or note.status != "n/a":
                return None
            reasons.add(note.message)
    return reasons.pop() if len(reasons) == 1 else None


def _block(report: BenchReport, rows: list[RowInfo], footnotes: list[str]) -> list[str]:
    columns: list[str] = []
    for row in rows:
        columns += [s for s in row.systems if s not in columns]
    subjects = sorted({r.subject for r in rows})
    header = ["metric", "unit", *columns, f"{'|'.join(subjects)} / *"]
    table = [header]
    for row in rows:
        cells = [_cell(report, row, system, footnotes) if system in row.systems else ""
                 for system in columns]
        table.append([row.metric, row.unit, *cells, _ratio(report, row)])
    widths = [max(len(line[i]) for line in table) for i in range(len(header))]
    return ["  " + "  ".join(text.ljust(w) for text, w in zip(line, widths, strict=False)).rstrip()
            for line in table]


def _cell(report: BenchReport, row: RowInfo, system: str, footnotes: list[str]) -> str:
    record = report.record(row.workload, row.metric, system)
    if record is not None:
        return format_value(record.median) + ("*" if system == row.reference else "")
    note = report.note(row.workload, row.metric, system)
    if note is None:
        return "n/a (not measured)"
    text = f"n/a ({note.message})" if note.status == "n/a" else f"error: {note.message}"
    if len(text) <= CELL_WIDTH and note.status == "n/a":
        return text
    footnotes.append(f"  [{row.metric}] {system}: {text}")
    return text if len(text) <= CELL_WIDTH else text[: CELL_WIDTH - 3] + "..."


def _ratio(report: BenchReport, row: RowInfo) -> str:
    subject = report.record(row.workload, row.metric, row.subject)
    reference = report.record(row.workload, row.metric, row.reference)
    if subject is None or reference is None:
        return "-"
    ratio = spread.ratio(subject, reference)
    if ratio is None:
        return "-"
    interval = spread.ratio_interval(subject.samples, reference.samples)
    text = f"{ratio:.2f}x"
    return f"{text} {spread.format_interval(interval)}" if interval else text


def headline(report: BenchReport) -> str:
    """The verdicts counted apart: clear passes, passes and misses inside the spread,
    clear misses and targets without a value, e.g. ``18 PASS, 3 PASS~, 0 MISS~, 1 MISS,
    2 N/A``."""
    labels = [t.label for t in report.targets]
    return ", ".join(f"{labels.count(label)} {label}"
                     for label in ("PASS", "PASS~", "MISS~", "MISS", "N/A"))


def render_targets(report: BenchReport) -> str:
    """A PASS / MISS / N/A line per target and row, with the measured ratio and its
    interval (``[one measurement]`` for a row measured once, a memory size), under a
    headline that counts the verdicts (:func:`headline`)."""
    if not report.targets:
        return ""
    lines = [f"targets: {headline(report)}"]
    for t in report.targets:
        sign = "<=" if t.direction == "at_most" else ">="
        bound = f"(target {sign} {t.threshold:.2f}x)"
        ratio = f"= {t.ratio:.3f}x " if t.ratio is not None else ""
        if t.low is not None and t.high is not None:
            ratio += spread.format_interval((t.low, t.high), digits=3) + " "
        elif t.ratio is not None:
            ratio += "[one measurement] "
        line = (f"  {t.label:<5} {t.workload:<13} {t.system} / {t.reference} {ratio}{bound}"
                f"  [{t.metric}]")
        lines.append(line + (f": {t.note}" if t.note else ""))
    if any(t.within_spread for t in report.targets):
        lines.append(f"  ~ : the target lies inside the ratio's {spread.LEVEL:.0%} interval over "
                     f"the repeats: the verdict is decided by noise as much as by the system; "
                     f"rerun before reading a change into it (docs/performance.md)")
    return "\n".join(lines)


def plot_rows(report: BenchReport) -> list[RowInfo]:
    """The rows the plot shows: those whose reference has a positive value to divide by
    (an agreement row whose reference is eager's own 0 has no ratios)."""
    rows = []
    for row in report.rows:
        reference = report.record(row.workload, row.metric, row.reference)
        if reference is not None and reference.median > 0:
            rows.append(row)
    return rows


def write_plot(report: BenchReport, path: Path | str) -> None:
    """A bar chart: per row, each system's ratio to the row's reference (log scale), the
    ratio the table prints (:func:`spread.ratio`).

    Raises
    ------
    ImportError
        Without matplotlib (``pip install 'cugraphrt[plot]'``).
    """
    import matplotlib

    matplotlib.use("Agg")  # files only: no display on a GPU server
    import matplotlib.pyplot as plt

    rows = plot_rows(report)
    systems: list[str] = []
    for row in rows:
        systems += [s for s in row.systems if s not in systems]
    fig, ax = plt.subplots(figsize=(max(8.0, 1.1 * len(rows)), 5.5))
    width = 0.8 / max(len(systems), 1)
    for i, system in enumerate(systems):
        xs, heights = [], []
        for j, row in enumerate(rows):
            value = report.record(row.workload, row.metric, system)
            # plot_rows keeps only rows with a reference record
            reference = cast(BenchRecord,
                             report.record(row.workload, row.metric, row.reference))
            height = None if value is None else spread.ratio(value, reference)
            if height is not None and height > 0:
                xs.append(j - 0.4 + width * (i + 0.5))
                heights.append(height)
        if xs:
            ax.bar(xs, heights, width, label=system)
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.set_yscale("log")
    ax.set_xticks(range(len(rows)))
    ax.set_xticklabels([f"{r.workload}\n{r.metric}" for r in rows], rotation=45, ha="right",
                       fontsize=7)
    ax.set_ylabel("ratio to the row's reference (lower is better)")
    ax.set_title(f"cugraphrt bench, {report.device}, {report.created[:10]}")
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
