"""``cugraphrt bench``: run the workloads, print the table and the targets' verdicts.

The run loop gives each workload a :class:`~cugraphrt.bench.spec.Context`; whatever rows it
emitted before a crash are kept, the crash becomes an error line in its block, and the next
workload runs. The rows become a :class:`~cugraphrt.bench.records.BenchReport`, from which
the table (:mod:`cugraphrt.bench.render`), the JSON file and the plot are all produced.
"""

from __future__ import annotations

import argparse
import functools
import gc
import importlib.util
import os
import sys
import traceback
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime, timezone
from pathlib import Path
from time import perf_counter
from typing import Any

from cugraphrt._exit_codes import NO_GPU_EXIT_CODE

from . import render, spread
from .host import collect_versions, device_name
from .records import BenchRecord, BenchReport, CellNote, RowInfo, TargetResult, WorkloadError
from .spec import Context, Failed, NotAvailable, Row, Workload, describe
from .timing import Summary

__all__ = ["main", "WORKLOADS", "REAL_NAMES", "DISTRIBUTED_NAMES", "parse_args",
           "selected_names", "run_workloads", "build_report", "evaluate_targets", "Progress",
           "QUICK_BUDGET_S"]

#: What ``--quick`` aims at: the whole run within this many seconds on an H100 (the footer
#: warns when a run takes longer; docs/performance.md, "--quick", says where time went).
QUICK_BUDGET_S = 60.0


def _workloads() -> tuple[Workload, ...]:
    from .workloads_alloc import POOL_ALLOC
    from .workloads_architectures import GENERATE_ARCHITECTURES
    from .workloads_compile import HF_DECODE, RESNET50
    from .workloads_control import CG_TOLERANCE, DECODE_UNTIL_EOS
    from .workloads_cupy import CHAIN, CUPY_MLP, POOL_SHARING, REPLAY
    from .workloads_generate import GENERATE
    from .workloads_moe import MOE_STEP
    from .workloads_rebind import REBIND
    from .workloads_sampled import GENERATE_SAMPLED
    from .workloads_serving import SERVING
    from .workloads_shapes import MANY_SHAPES
    from .workloads_speculative import SPECULATIVE
    from .workloads_torch import CAPTURE_TIME, TORCH_INFER, TORCH_TRAIN
    from .workloads_zoo import ZOO

    return (REPLAY, CHAIN, CUPY_MLP, TORCH_INFER, TORCH_TRAIN, POOL_SHARING, CAPTURE_TIME,
            POOL_ALLOC, SERVING, MANY_SHAPES, CG_TOLERANCE, HF_DECODE, RESNET50,
            DECODE_UNTIL_EOS, GENERATE, GENERATE_SAMPLED, GENERATE_ARCHITECTURES, SPECULATIVE,
            REBIND, ZOO, MOE_STEP,
            *_distributed_workloads(), *_real_workloads())


def _real_workloads() -> tuple[Workload, ...]:
    from .workloads_real import REAL_LLAMA, REAL_RESNET50
    from .workloads_real_cg import REAL_CG
    from .workloads_real_train import REAL_RESNET18

    return (REAL_RESNET50, REAL_RESNET18, REAL_LLAMA, REAL_CG)


def _distributed_workloads() -> tuple[Workload, ...]:
    from .workloads_distributed import DDP, DIST_CG, GENERATE_TP, TP_DECODE

    return (DDP, TP_DECODE, DIST_CG, GENERATE_TP)


#: Every workload, in run order.
WORKLOADS: tuple[Workload, ...] = _workloads()
#: What ``--real`` selects: the real-model workloads, side by side with their anchors.
REAL_NAMES: tuple[str, ...] = tuple(w.name for w in _real_workloads())
#: What ``--distributed`` selects: the multi-GPU workloads (torchrun, every GPU).
DISTRIBUTED_NAMES: tuple[str, ...] = tuple(w.name for w in _distributed_workloads())


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    """Parse ``cugraphrt bench`` arguments (``argv`` excludes the ``bench`` word)."""
    names = [w.name for w in WORKLOADS]
    parser = argparse.ArgumentParser(
        prog="cugraphrt bench",
        description="Benchmarks of cugraphrt against CuPy, PyTorch and torch.compile: a table "
                    "of medians, ratios to each row's reference, and PASS/MISS per target.")
    parser.add_argument("--quick", action="store_true",
                        help=f"fewer repeats, slowest variants skipped; aims at "
                             f"{QUICK_BUDGET_S:.0f} s on an H100 (the footer warns, naming the "
                             f"slowest workloads, when a run takes longer)")
    parser.add_argument("--only", action="append", metavar="NAME", choices=names,
                        help="run only this workload (repeatable); one of: " + ", ".join(names))
    parser.add_argument("--real", action="store_true",
                        help="run the real-model workloads (" + ", ".join(REAL_NAMES) + "; "
                             "needs torchvision and transformers: pip install "
                             "'cugraphrt[bench]'), with the --only ones if given")
    parser.add_argument("--distributed", action="store_true",
                        help="run the multi-GPU workloads (" + ", ".join(DISTRIBUTED_NAMES)
                             + "; started under torchrun on 2 GPUs, n/a with fewer), with the "
                               "--only ones if given")
    parser.add_argument("--json", metavar="PATH", type=Path,
                        help="write the records (a BenchReport) as JSON")
    parser.add_argument("--plot", metavar="PATH.png", type=Path,
                        help="write a bar chart of the ratios (needs matplotlib: "
                             "pip install 'cugraphrt[plot]')")
    parser.add_argument("--list", action="store_true", help="list the workloads and exit")
    parser.add_argument("--no-progress", action="store_true",
                        help="no progress bar on stderr")
    return parser.parse_args(list(argv) if argv is not None else None)


def gpu_unavailable_reason() -> str | None:
    """None when CuPy sees a CUDA GPU, else why not."""
    try:
        import cupy
    except Exception as exc:  # noqa: BLE001
        return f"CuPy does not import: {describe(exc)}"
    try:
        if cupy.cuda.is_available():
            return None
        return "cupy.cuda.is_available() is False"
    except Exception as exc:  # noqa: BLE001
        return describe(exc)


def matplotlib_available() -> bool:
    """Whether ``--plot`` can work (matplotlib is the optional extra ``cugraphrt[plot]``)."""
    return importlib.util.find_spec("matplotlib") is not None


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``cugraphrt bench``.

    Returns
    -------
    int
        0 when every workload ran, 1 when one crashed or a system failed (or an output could
        not be written), 2 without a CUDA GPU.
    """
    args = parse_args(argv)
    if args.list:
        for workload in WORKLOADS:
            print(f"{workload.name:<13} {workload.description}")
        return 0
    reason = gpu_unavailable_reason()
    if reason is not None:
        print(f"cugraphrt bench: no CUDA GPU is available ({reason}); run it on a machine "
              f"with an NVIDIA GPU and its driver", file=sys.stderr)
        return NO_GPU_EXIT_CODE
    if args.plot is not None and not matplotlib_available():
        print("cugraphrt bench: --plot needs matplotlib, which is not installed; install it "
              "with: pip install 'cugraphrt[plot]'", file=sys.stderr)
        return 1
    named = selected_names(args)
    selected = [w for w in WORKLOADS if not named or w.name in named]
    progress = Progress(len(selected), enabled=not args.no_progress)
    # The JSON is rewritten after every workload: a run cut short (a time limit, a kill)
    # still leaves what it measured.
    checkpoint = (None if args.json is None else
                  lambda partial: _write_outputs(partial, args.json, None, quiet=True))
    report = run_workloads(selected, quick=args.quick, progress=progress, named=named,
                           checkpoint=checkpoint)
    print(render.render_report(report, {w.name: w.description for w in WORKLOADS},
                               quick_budget_s=QUICK_BUDGET_S))
    written = _write_outputs(report, args.json, args.plot)
    return 1 if report.failed or not written else 0


def selected_names(args: argparse.Namespace) -> frozenset[str]:
    """The workloads named by ``--only``, ``--real`` and ``--distributed``; empty means every
    workload."""
    return (frozenset(args.only or ()) | frozenset(REAL_NAMES if args.real else ())
            | frozenset(DISTRIBUTED_NAMES if args.distributed else ()))


def _write_outputs(report: BenchReport, json_path: Path | None, plot_path: Path | None,
                   quiet: bool = False) -> bool:
    ok = True
    if json_path is not None:
        try:
            # Through a temporary file and a rename: a kill mid-write (a time limit during
            # a checkpoint) leaves the last whole report, never half of one.
            partial = json_path.with_name(json_path.name + ".partial")
            partial.write_text(report.model_dump_json(indent=2) + "\n")
            os.replace(partial, json_path)
        except OSError as exc:
            if not quiet:  # the final write reports it
                print(f"cugraphrt bench: could not write {json_path} ({exc})",
                      file=sys.stderr)
            ok = False
    if plot_path is not None:
        try:
            render.write_plot(report, plot_path)
        except Exception as exc:  # noqa: BLE001 - the table is printed already
            print(f"cugraphrt bench: could not write the plot {plot_path} ({describe(exc)})",
                  file=sys.stderr)
            ok = False
    return ok


# -- running -------------------------------------------------------------------------------


def run_workloads(workloads: Sequence[Workload], *, quick: bool,
                  progress: Progress | None = None,
                  named: frozenset[str] = frozenset(),
                  checkpoint: Callable[[BenchReport], object] | None = None) -> BenchReport:
    """Run ``workloads`` in order and assemble the report.

    A workload that raises keeps the rows it emitted; its error goes into the report.
    ``named`` are the workloads the command line selected by name (see
    :attr:`Context.selected`). ``checkpoint`` receives the report of the workloads run so
    far after each one.
    """
    progress = progress or Progress(len(workloads), enabled=False)
    created = datetime.now(timezone.utc).isoformat(timespec="seconds")
    start = perf_counter()
    device = device_name()
    results: list[tuple[Workload, list[Row], str | None]] = []
    seconds: dict[str, float] = {}

    def save(running: tuple[Workload, list[Row], str | None] | None = None) -> None:
        if checkpoint is not None:
            done = results if running is None else [*results, running]
            checkpoint(build_report(done, workloads, created=created, device=device,
                                    versions=collect_versions(), quick=quick,
                                    elapsed_s=perf_counter() - start, workload_s=seconds))

    shared: dict[str, Any] = {}  # what one measurement gives several workloads (Context)
    for index, workload in enumerate(workloads):
        progress.begin(index, workload.name)
        began = perf_counter()
        ctx = Context(quick=quick, selected=workload.name in named, progress=progress.step,
                      shared=shared)
        # A workload's finished rows are saved as they come (a cut run keeps them).
        ctx.emitted = functools.partial(save, (workload, ctx.rows, None))
        error = None
        try:
            workload.run(ctx)
        except Exception as exc:  # noqa: BLE001 - report it, run the next workload
            error = describe(exc, limit=500)
            progress.interrupt()
            print(f"cugraphrt bench: workload {workload.name} crashed:", file=sys.stderr)
            traceback.print_exc()
        results.append((workload, ctx.rows, error))
        progress.end("crashed" if error else "done")
        _settle()
        seconds[workload.name] = perf_counter() - began
        save()
    progress.close()
    return build_report(results, workloads, created=created, device=device,
                        versions=collect_versions(), quick=quick,
                        elapsed_s=perf_counter() - start, workload_s=seconds)


def _settle() -> None:
    # One workload's garbage and in-flight work must not be billed to the next.
    gc.collect()
    try:
        import cupy

        import cugraphrt

        cupy.cuda.runtime.deviceSynchronize()
        cugraphrt.empty_cache()
    except Exception:  # noqa: BLE001 - a broken context shows up in the next workload
        pass


def build_report(results, workloads: Sequence[Workload], *, created: str, device: str,
                 versions: dict[str, str], quick: bool, elapsed_s: float,
                 workload_s: Mapping[str, float] | None = None) -> BenchReport:
    """Turn the workloads' rows into a :class:`BenchReport` and evaluate the targets.

    Parameters
    ----------
    results : list of (Workload, list of Row, str or None)
        Per workload, its rows and its crash message.
    workload_s : mapping of str to float, optional
        Wall seconds of each workload run.
    """
    report = BenchReport(created=created, device=device, versions=versions, quick=quick,
                         elapsed_s=elapsed_s, workload_s=dict(workload_s or {}))
    for workload, rows, error in results:
        for row in rows:
            _add_row(report, workload.name, row)
        if error is not None:
            report.errors.append(WorkloadError(workload=workload.name, message=error))
    report.targets = evaluate_targets([w for w, _, _ in results], report)
    return report


def _add_row(report: BenchReport, workload: str, row: Row) -> None:
    report.rows.append(RowInfo(workload=workload, metric=row.metric, unit=row.unit,
                               reference=row.reference, subject=row.subject,
                               systems=list(row.systems)))
    for system in row.systems:
        cell = row.cells.get(system, NotAvailable("not measured"))
        where = {"workload": workload, "metric": row.metric, "system": system}
        if isinstance(cell, Summary):
            report.records.append(BenchRecord(
                **where, unit=row.unit, median=cell.median, min=cell.min, max=cell.max,
                repeats=cell.repeats, samples=list(cell.samples), device=report.device,
                versions=report.versions))
        elif isinstance(cell, Failed):
            report.notes.append(CellNote(**where, status="error", message=cell.message))
        else:
            report.notes.append(CellNote(**where, status="n/a", message=cell.reason))


def evaluate_targets(workloads: Sequence[Workload], report: BenchReport) -> list[TargetResult]:
    """PASS/MISS (or N/A) of every target of ``workloads`` on the rows it applies to."""
    results = []
    for workload in workloads:
        rows = [r for r in report.rows if r.workload == workload.name]
        for target in workload.targets:
            matched = [r for r in rows if target.metric in (None, r.metric)
                       and target.system in r.systems and target.reference in r.systems]
            base: dict[str, Any] = {"workload": workload.name, "system": target.system,
                    "reference": target.reference, "threshold": target.threshold,
                    "direction": target.direction}
            if not matched:
                crashed = any(e.workload == workload.name for e in report.errors)
                results.append(TargetResult(
                    **base, metric=target.metric or "*", ratio=None, status="N/A",
                    note="the workload crashed" if crashed else "row not measured"))
            for row in matched:
                results.append(_verdict(report, target, row.metric, base))
    return results


def _verdict(report: BenchReport, target, metric: str, base: dict) -> TargetResult:
    subject = report.record(base["workload"], metric, target.system)
    reference = report.record(base["workload"], metric, target.reference)
    if subject is None or reference is None:
        missing = target.system if subject is None else target.reference
        note = report.note(base["workload"], metric, missing)
        why = f"{note.status} ({note.message})" if note else "no value"
        return TargetResult(**base, metric=metric, ratio=None, status="N/A",
                            note=f"{missing}: {why}")
    ratio = spread.ratio(subject, reference)
    if ratio is None:
        return TargetResult(**base, metric=metric, ratio=None, status="N/A",
                            note=f"{target.reference} is {reference.median}")
    interval = spread.ratio_interval(subject.samples, reference.samples)
    low, high = interval if interval is not None else (None, None)
    return TargetResult(**base, metric=metric, ratio=ratio, low=low, high=high,
                        within_spread=spread.inside(target.threshold, interval),
                        status="PASS" if target.holds(ratio) else "MISS")


# -- progress ------------------------------------------------------------------------------


class Progress:
    """A progress bar on stderr: redrawn in place on a terminal, a line per workload and per
    step else.

    Parameters
    ----------
    total : int
        Number of workloads.
    enabled : bool
        False prints nothing.
    stream : file, optional
        Defaults to ``sys.stderr``.
    """

    WIDTH = 20

    def __init__(self, total: int, *, enabled: bool = True, stream=None) -> None:
        self.total = max(total, 1)
        self.enabled = enabled
        self.stream = stream if stream is not None else sys.stderr
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self.start = perf_counter()
        self.index, self.name, self.detail = 0, "", ""
        self._workload_start = self.start
        self._shown = 0

    def begin(self, index: int, name: str) -> None:
        """A workload starts."""
        self.index, self.name, self.detail = index, name, ""
        self._workload_start = perf_counter()
        if self.enabled and not self.tty:
            self._line(f"[{index + 1}/{self.total}] {name} ...")
        self._draw()

    def step(self, detail: str) -> None:
        """A step inside the current workload: redrawn on a terminal; else a line with the
        seconds since the workload began, so that a log shows where a long one spends them."""
        self.detail = detail
        if self.enabled and not self.tty:
            seconds = perf_counter() - self._workload_start
            self._line(f"[{self.index + 1}/{self.total}] {self.name}: {detail} "
                       f"(at {seconds:.1f} s)")
        self._draw()

    def end(self, status: str) -> None:
        """The current workload finished with ``status``."""
        seconds = perf_counter() - self._workload_start
        if self.enabled and not self.tty:
            self._line(f"[{self.index + 1}/{self.total}] {self.name} {status} in "
                       f"{seconds:.1f} s")
        self.index += 1
        self.detail = status
        self._draw()

    def interrupt(self) -> None:
        """Clear the bar so that other stderr output starts on a clean line."""
        if self.enabled and self.tty and self._shown:
            self.stream.write("\r" + " " * self._shown + "\r")
            self.stream.flush()
            self._shown = 0

    def close(self) -> None:
        """Clear the bar at the end of the run."""
        self.interrupt()

    def _draw(self) -> None:
        if not (self.enabled and self.tty):
            return
        filled = self.WIDTH * self.index // self.total
        bar = "#" * filled + "-" * (self.WIDTH - filled)
        text = (f"[{bar}] {min(self.index + 1, self.total)}/{self.total} {self.name}"
                f"{': ' + self.detail if self.detail else ''}  {perf_counter() - self.start:.0f} s")
        self.stream.write("\r" + text.ljust(self._shown))
        self.stream.flush()
        self._shown = len(text)

    def _line(self, text: str) -> None:
        print(f"cugraphrt bench {text}", file=self.stream, flush=True)
