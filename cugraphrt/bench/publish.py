"""Render the recorded bench reports of ``docs/results/`` into ``docs/results.md``.

Every benchmark figure the documentation quotes comes from a report that ``cugraphrt bench
--json`` wrote and that ``docs/results/`` keeps. Its ``manifest.json`` lists them, newest
first, each with the commit and the command that ran it and a note. This module renders them
with the bench's own table (:func:`~cugraphrt.bench.render.render_report`; workloads are
titled by name: a report keeps no description, and today's would misdescribe an older run),
so the page cannot drift from the data: ``tests/unit/test_docs_results.py`` fails when the
committed page is not what the reports render. No GPU is needed::

    python -m cugraphrt.bench.publish            # rewrite docs/results.md (from the root)
    python -m cugraphrt.bench.publish --check    # exit 1 if it is out of date

To add a run: ``cugraphrt bench ... --json docs/results/DATE-WHAT-COMMIT-HOST.json``, an
entry at the top of the manifest, then the first command.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from pydantic import BaseModel, ConfigDict, TypeAdapter

from . import render
from .records import BenchReport

__all__ = ["Entry", "render_results", "main"]


class Entry(BaseModel):
    """One recorded run: a report of ``docs/results/`` and what the page says of it."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    file: str
    title: str
    commit: str
    command: str
    note: str = ""


def render_results(results: Path) -> str:
    """The page for the reports listed in ``results/manifest.json``."""
    entries = TypeAdapter(list[Entry]).validate_json((results / "manifest.json").read_text())
    lines = [
        "# Benchmark results",
        "",
        "<!-- Rendered by `python -m cugraphrt.bench.publish` from the reports in results/: "
        "edit the manifest or add a report, never this page. -->",
        "",
        "Every table below is a report that `cugraphrt bench --json` wrote, rendered by "
        "`python -m cugraphrt.bench.publish` as the bench prints it (no GPU needed). The "
        "reports are in `docs/results/`, listed in `results/manifest.json` with the "
        "commit and the command of each run; a test fails when this page is not what they "
        "render. A block is titled by its workload's name (a report keeps no description: "
        "today's would misdescribe an older run); what each workload measures and its "
        "targets: [performance.md](performance.md).",
    ]
    for entry in entries:
        report = BenchReport.model_validate_json((results / entry.file).read_text())
        lines += ["", f"## {entry.title}", "",
                  f"Report `results/{entry.file}`, commit `{entry.commit}`, command "
                  f"`{entry.command}`."]
        if entry.note:
            lines += ["", entry.note]
        lines += ["", "```text", render.render_report(report).rstrip(), "```"]
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    """Rewrite ``docs/results.md`` (or, with ``--check``, say whether it is up to date)."""
    parser = argparse.ArgumentParser(prog="python -m cugraphrt.bench.publish",
                                     description="Render docs/results/ into docs/results.md.")
    parser.add_argument("--check", action="store_true",
                        help="exit 1 when docs/results.md differs from the rendering")
    parser.add_argument("--docs", type=Path, default=Path("docs"),
                        help="the docs folder (default: docs/ of the current directory, a "
                             "checkout's root)")
    args = parser.parse_args(argv)
    page = args.docs / "results.md"
    text = render_results(args.docs / "results")
    if args.check:
        current = page.read_text() if page.exists() else ""
        if current != text:
            print(f"{page} is out of date: run python -m cugraphrt.bench.publish",
                  file=sys.stderr)
            return 1
        return 0
    page.write_text(text)
    print(f"wrote {page}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
