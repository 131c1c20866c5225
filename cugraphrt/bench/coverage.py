"""docs/coverage.md from a zoo report: which models cugraphrt graphs, and why not the others.

    cugraphrt bench --only zoo --json zoo.json
    python -m cugraphrt.bench.coverage zoo.json > docs/coverage.md

The page has the counts per family (eager, ``torch.cuda.graph``, ``graph_module`` whole, whole
or in pieces), the zoo's targets as the run judged them, and one line per model that is not
graphed whole, with the reason its cell gave.
"""

from __future__ import annotations

import sys
from collections import defaultdict
from pathlib import Path

from .records import BenchReport
from .workloads_zoo import SHARE

__all__ = ["render", "main"]

_SYSTEMS = ("eager", "torch_graph", "cugraphrt", "cugraphrt_pieces")
_HEADERS = ("runs eagerly", "torch.cuda.graph", "graph_module whole", "whole or in pieces")
_SUFFIX = ": models graphed and equal to eager"


def render(report: BenchReport) -> str:
    """The page for ``report`` (a run that included the zoo)."""
    values = {(r.metric, r.system): r.median for r in report.records if r.workload == "zoo"}
    notes = {(n.metric, n.system): n.message for n in report.notes if n.workload == "zoo"}
    models = [r.metric for r in report.rows if r.workload == "zoo" and r.unit == "equal"]
    if not models:
        raise ValueError("the report has no zoo rows: run cugraphrt bench --only zoo --json")
    lines = ["# Coverage: does it graph my model?", "",
             f"`cugraphrt bench --only zoo` on {report.device} ({report.created}; "
             + ", ".join(f"{k} {v}" for k, v in sorted(report.versions.items())) + "). "
             "Each model is run eagerly, then graphed by `torch.cuda.graph`, by "
             "`cugraphrt_torch.graph_module` whole, and whole or with `pieces=True`, each "
             "compared with eager on a fresh input: equal within the dtype's rounding "
             "(`torch.testing.assert_close`'s tolerances; the models equal to the bit are "
             "counted below the table), docs/torch.md, \"Does it graph my model?\".", "",
             "| family | " + " | ".join(_HEADERS) + " |",
             "| --- |" + " ---: |" * len(_HEADERS)]
    families = [r.metric[: -len(_SUFFIX)] for r in report.rows
                if r.workload == "zoo" and r.metric.endswith(_SUFFIX)
                and not r.metric.startswith("total")]
    for family in families + ["total"]:
        metric = f"{family}{_SUFFIX}" if family != "total" else next(
            r.metric for r in report.rows if r.workload == "zoo" and r.metric.startswith("total"))
        cells = [_count(values.get((metric, s))) for s in _SYSTEMS]
        lines.append(f"| {family} | " + " | ".join(cells) + " |")
    bits = next((r.metric for r in report.rows
                 if r.workload == "zoo" and r.metric.startswith("bit for bit")), None)
    if bits is not None:
        lines += ["", "Equal to eager bit for bit: " + ", ".join(
            f"{header} {_count(values.get((bits, s)))}" for header, s in
            zip(_HEADERS, _SYSTEMS, strict=True)) + ". transformers models take another "
            "path while a stream captures (an explicit attention mask: `is_tracing()` is "
            "true under `torch.cuda.is_current_stream_capturing()`), so their graphs, "
            "`torch.cuda.graph`'s as cugraphrt's, round differently from eager."]
    lines += ["", "Targets (of the models that run eagerly):", ""]
    for target in report.targets:
        if target.workload == "zoo":
            ratio = "n/a" if target.ratio is None else f"{target.ratio:.3f}"
            sign = "<=" if target.direction == "at_most" else ">="
            lines.append(f"- `{target.system}` / `{target.reference}` = {ratio} "
                         f"({sign} {target.threshold:.2f}): {target.status}")
    lines += ["", "## Not graphed whole", ""]
    by_family: dict[str, list[str]] = defaultdict(list)
    for model in models:
        if values.get((model, "cugraphrt")) == 1.0:
            continue
        family, name = model.split(": ", 1)
        if values.get((model, "eager")) != 1.0:
            by_family[family].append(f"- `{name}`: does not run eagerly here "
                                     f"({notes.get((model, 'eager'), 'no reason recorded')})")
            continue
        pieces = values.get((model, "cugraphrt_pieces"))
        share = values.get((f"{model}{SHARE}", "cugraphrt_pieces"))  # runs from 2026-11-29 on
        kernels = "" if share is None else f", {share:.0%} of its kernel time in graphs"
        how = (f"in pieces ({pieces:.0%} of its pieces graphed{kernels})" if pieces else
               f"not in pieces either ({notes.get((model, 'cugraphrt_pieces'), '?')})")
        by_family[family].append(f"- `{name}`: {how}; whole: "
                                 f"{notes.get((model, 'cugraphrt'), 'no reason recorded')}")
    if not by_family:
        lines.append("Every model that runs eagerly is graphed whole.")
    for family, entries in by_family.items():
        lines += [f"### {family}", "", *entries, ""]
    return "\n".join(lines).rstrip() + "\n"


def _count(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.0f}"


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m cugraphrt.bench.coverage REPORT.json", file=sys.stderr)
        return 2
    report = BenchReport.model_validate_json(Path(args[0]).read_text())
    sys.stdout.write(render(report))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
