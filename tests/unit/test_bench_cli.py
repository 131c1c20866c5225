"""``cugraphrt bench`` without a GPU: the no-GPU exit, argument parsing, the run loop on fake
workloads, table rendering, JSON records and target verdicts on fabricated data."""

from __future__ import annotations

import io
import json
import os
import re
import shutil
import subprocess
import sys
import types
from pathlib import Path

import pytest
from pydantic import ValidationError

from cugraphrt import cli
from cugraphrt.bench import runner
from cugraphrt.bench.records import BenchRecord, BenchReport
from cugraphrt.bench.render import format_value, render_report, render_table
from cugraphrt.bench.spec import (
    Context,
    Failed,
    NotAvailable,
    Row,
    RowBuilder,
    SystemUnavailable,
    Target,
    Workload,
    check_close,
    verify,
)
from cugraphrt.bench.timing import (
    MIN_ROUNDS,
    MIN_WARMUP,
    Summary,
    host_batch,
    interleave,
    round_order,
    summarize,
)

ROOT = Path(__file__).resolve().parents[2]
NO_GPU_MESSAGE = "cugraphrt bench: no CUDA GPU is available"


def _env_without_gpu() -> dict[str, str]:
    env = dict(os.environ)
    env["CUDA_VISIBLE_DEVICES"] = ""  # no device visible, even on the GPU machine
    paths = [str(ROOT), str(ROOT / "adapters"), env.get("PYTHONPATH", "")]
    env["PYTHONPATH"] = os.pathsep.join(p for p in paths if p)
    return env


# -- no GPU --------------------------------------------------------------------------------


def test_python_m_cugraphrt_bench_without_gpu_exits_2_with_plain_message():
    proc = subprocess.run([sys.executable, "-m", "cugraphrt", "bench", "--quick"], cwd=ROOT,
                          env=_env_without_gpu(), capture_output=True, text=True, timeout=120)
    assert proc.returncode == cli.NO_GPU_EXIT_CODE == 2
    assert proc.stderr.startswith(NO_GPU_MESSAGE)
    assert proc.stderr.count("\n") == 1  # one plain line, no traceback
    assert proc.stdout == ""


def test_console_script_without_gpu_exits_2():
    script = shutil.which("cugraphrt")
    if script is None:
        pytest.skip("the cugraphrt console script is not installed in this environment")
    proc = subprocess.run([script, "bench", "--quick"], env=_env_without_gpu(),
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert proc.stderr.startswith(NO_GPU_MESSAGE)


def test_cli_main_bench_quick_without_gpu(monkeypatch, capsys):
    monkeypatch.setattr(runner, "gpu_unavailable_reason",
                        lambda: "cupy.cuda.is_available() is False")
    assert cli.main(["bench", "--quick"]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err == (f"{NO_GPU_MESSAGE} (cupy.cuda.is_available() is False); run it on a "
                   f"machine with an NVIDIA GPU and its driver\n")


def test_versions_line_names_the_adapter_version():
    pytest.importorskip("torch")
    import cugraphrt_torch

    import cugraphrt

    versions = runner.collect_versions()  # the adapter is loaded: it gets a version
    assert versions["cugraphrt_torch"] == cugraphrt_torch.__version__ == cugraphrt.__version__


def test_importing_bench_does_not_import_torch():
    code = "import sys, cugraphrt.bench; print('torch' in sys.modules)"
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=_env_without_gpu(),
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "False"


# -- arguments -----------------------------------------------------------------------------


def test_parse_args_all_options(tmp_path):
    args = runner.parse_args(["--quick", "--only", "replay", "--only", "chain", "--json",
                              str(tmp_path / "r.json"), "--plot", str(tmp_path / "p.png"),
                              "--no-progress"])
    assert args.quick and args.no_progress and not args.list
    assert args.only == ["replay", "chain"]
    assert args.json == tmp_path / "r.json"
    assert args.plot == tmp_path / "p.png"


def test_parse_args_defaults():
    args = runner.parse_args([])
    assert not args.quick and args.only is None and args.json is None and args.plot is None


def test_parse_args_rejects_unknown_workload(capsys):
    with pytest.raises(SystemExit) as info:
        runner.parse_args(["--only", "nope"])
    assert info.value.code == 2
    assert "invalid choice: 'nope'" in capsys.readouterr().err


def test_every_issue_workload_is_registered_in_order():
    names = [w.name for w in runner.WORKLOADS]
    assert names == ["replay", "chain", "cupy_mlp", "torch_infer", "torch_train",
                     "pool_sharing", "capture_time", "pool_alloc", "serving", "many_shapes",
                     "cg_tolerance",
                     "hf_decode", "resnet50", "decode_until_eos", "generate", "generate_sampled",
                     "generate_architectures", "speculative", "rebind", "zoo", "moe_step", "ddp",
                     "tp_decode",
                     "dist_cg", "generate_tp",
                     "real_resnet50", "real_resnet18", "real_llama", "real_cg"]
    for workload in runner.WORKLOADS:
        for target in workload.targets:
            assert target.system in workload.systems or target.metric is not None


def test_list_works_without_gpu(capsys):
    assert runner.main(["--list"]) == 0
    out = capsys.readouterr().out
    assert [line.split()[0] for line in out.splitlines()] == [w.name for w in runner.WORKLOADS]


def test_plot_without_matplotlib_is_a_clear_error(monkeypatch, capsys, tmp_path):
    monkeypatch.setattr(runner, "gpu_unavailable_reason", lambda: None)
    monkeypatch.setattr(runner, "matplotlib_available", lambda: False)
    assert runner.main(["--plot", str(tmp_path / "p.png")]) == 1
    assert "pip install 'cugraphrt[plot]'" in capsys.readouterr().err


# -- fabricated rows and reports -----------------------------------------------------------


def _summary(median: float, spread: float = 0.1) -> Summary:
    return Summary(median, median - spread, median + spread, 10)


def _row(metric: str, cells: dict, reference: str = "ref", subject: str = "ours") -> Row:
    return Row(metric, "us", reference, subject, tuple(cells), dict(cells))


DEMO = Workload("demo", "a fabricated workload", ("ours", "ref", "torchy"), "ref",
                (Target("ours", "ref", 1.10), Target("ours", "torchy", 0.90)), lambda ctx: None)


def _demo_report() -> BenchReport:
    rows = [
        _row("fast", {"ours": _summary(2.14), "ref": _summary(2.0),
                      "torchy": NotAvailable("torch not installed")}),
        _row("slow", {"ours": _summary(3.0), "ref": _summary(2.0), "torchy": _summary(4.0)}),
        _row("broken", {"ours": Failed("RuntimeError: capture failed"), "ref": _summary(1.0),
                        "torchy": _summary(1.5)}),
    ]
    return runner.build_report([(DEMO, rows, None)], [DEMO], created="2026-01-01T00:00:00+00:00",
                               device="Fake GPU (sm_90)", versions={"cupy": "14.2.0"},
                               quick=True, elapsed_s=12.5)


def test_build_report_records_notes_and_layout():
    report = _demo_report()
    assert [r.metric for r in report.rows] == ["fast", "slow", "broken"]
    assert len(report.records) == 7
    rec = report.record("demo", "fast", "ours")
    assert (rec.median, rec.min, rec.max, rec.repeats, rec.unit) == (2.14, 2.04, 2.24, 10, "us")
    assert rec.device == "Fake GPU (sm_90)" and rec.versions == {"cupy": "14.2.0"}
    assert report.note("demo", "fast", "torchy").status == "n/a"
    assert report.note("demo", "broken", "ours").status == "error"
    assert report.failed


def test_report_json_round_trip_validates():
    report = _demo_report()
    text = report.model_dump_json(indent=2)
    again = BenchReport.model_validate_json(text)
    assert again == report
    data = json.loads(text)
    assert set(data["records"][0]) == {"workload", "system", "metric", "unit", "median", "min",
                                       "max", "repeats", "samples", "device", "versions"}


@pytest.mark.parametrize("change", [
    {"min": 3.0},                # min above the median
    {"max": 1.0},                # max below the median
    {"repeats": 0},
    {"extra_field": 1},
    {"samples": [2.0, 2.5]},     # two samples behind five repeats
])
def test_bench_record_rejects_inconsistent_values(change):
    fields = dict(workload="w", system="s", metric="m", unit="us", median=2.0, min=1.0,
                  max=3.0, repeats=5, device="d", versions={})
    fields.update(change)
    with pytest.raises(ValidationError):
        BenchRecord(**fields)


def test_table_marks_reference_ratio_and_unavailable_cells():
    report = _demo_report()
    table = render_table(report, {"demo": "a fabricated workload"})
    lines = table.splitlines()
    assert "demo: a fabricated workload" in lines
    header = next(line for line in lines if line.strip().startswith("metric"))
    assert header.split()[:5] == ["metric", "unit", "ours", "ref", "torchy"]
    fast = next(line for line in lines if line.strip().startswith("fast"))
    assert "2.14" in fast and "2.00*" in fast and "n/a (torch not installed)" in fast
    assert fast.rstrip().endswith("1.07x")
    slow = next(line for line in lines if line.strip().startswith("slow"))
    assert slow.rstrip().endswith("1.50x")
    broken = next(line for line in lines if line.strip().startswith("broken"))
    assert "error: RuntimeError: capture failed" in broken and broken.rstrip().endswith("-")
    # errors are repeated in full under the block
    assert "  [broken] ours: error: RuntimeError: capture failed" in lines


def test_long_unavailable_reason_is_cut_in_the_cell_and_given_in_full_below():
    reason = "cugraphrt_torch does not import: ModuleNotFoundError: No module named 'x'"
    rows = [_row("m", {"ours": NotAvailable(reason), "ref": _summary(1.0)})]
    report = runner.build_report([(DEMO, rows, None)], [DEMO], created="t", device="d",
                                 versions={}, quick=False, elapsed_s=1.0)
    table = render_table(report)
    assert f"  [m] ours: n/a ({reason})" in table.splitlines()
    row_line = next(line for line in table.splitlines() if line.strip().startswith("m "))
    assert "..." in row_line


def test_workload_left_out_as_a_whole_takes_one_line():
    reason = "skipped in --quick (run --only demo)"
    rows = [_row(m, {"ours": NotAvailable(reason), "ref": NotAvailable(reason)})
            for m in ("step", "memory")]
    report = runner.build_report([(DEMO, rows, None)], [DEMO], created="t", device="d",
                                 versions={}, quick=True, elapsed_s=1.0)
    lines = render_table(report, {"demo": "a fabricated workload"}).splitlines()
    block = lines[lines.index("demo: a fabricated workload"):]
    assert block == ["demo: a fabricated workload", f"  n/a ({reason})"]
    # Two reasons, or one measured cell, keep the full table.
    rows[1] = _row("memory", {"ours": NotAvailable("other"), "ref": NotAvailable(reason)})
    report = runner.build_report([(DEMO, rows, None)], [DEMO], created="t", device="d",
                                 versions={}, quick=True, elapsed_s=1.0)
    assert any(line.strip().startswith("metric") for line in render_table(report).splitlines())


def test_crashed_workload_shows_its_error_and_keeps_finished_rows():
    rows = [_row("first", {"ours": _summary(1.0), "ref": _summary(1.0)})]
    report = runner.build_report([(DEMO, rows, "ValueError: boom")], [DEMO], created="t",
                                 device="d", versions={}, quick=False, elapsed_s=1.0)
    table = render_table(report)
    assert "  error: ValueError: boom" in table.splitlines()
    assert "first" in table
    assert report.failed


def test_render_report_footer_and_quick_budget_warning():
    report = _demo_report().model_copy(update={"elapsed_s": 75.0})
    text = render_report(report, quick_budget_s=60.0)
    assert "device: Fake GPU (sm_90)" in text
    assert "versions: cupy 14.2.0" in text
    assert "warning: the --quick run took 75 s, over its 60 s budget" in text
    assert "warning" not in render_report(_demo_report(), quick_budget_s=60.0)
    timed = report.model_copy(update={"workload_s": {"a": 4.0, "b": 41.4, "c": 20.0, "d": 9.6}})
    assert ("warning: the --quick run took 75 s, over its 60 s budget (slowest: b 41 s, c 20 s, "
            "d 10 s)") in render_report(timed, quick_budget_s=60.0)
    again = BenchReport.model_validate_json(timed.model_dump_json())
    assert list(again.workload_s) == ["a", "b", "c", "d"]  # run order survives the JSON


@pytest.mark.parametrize("value, text", [
    (1234.5, "1,234"), (414.26, "414"), (12.345, "12.3"), (2.456, "2.46"), (0.1234, "0.123"),
    (0.0, "0"),
])
def test_format_value(value, text):
    assert format_value(value) == text


# -- targets -------------------------------------------------------------------------------


def test_targets_pass_miss_and_na():
    verdicts = {(t.metric, t.reference): t for t in _demo_report().targets}
    fast_ref = verdicts[("fast", "ref")]
    assert fast_ref.status == "PASS" and fast_ref.ratio == pytest.approx(1.07)
    slow_ref = verdicts[("slow", "ref")]
    assert slow_ref.status == "MISS" and slow_ref.ratio == pytest.approx(1.5)
    slow_torchy = verdicts[("slow", "torchy")]
    assert slow_torchy.status == "PASS" and slow_torchy.ratio == pytest.approx(0.75)
    fast_torchy = verdicts[("fast", "torchy")]
    assert fast_torchy.status == "N/A" and fast_torchy.ratio is None
    assert fast_torchy.note == "torchy: n/a (torch not installed)"
    assert verdicts[("broken", "ref")].note == "ours: error (RuntimeError: capture failed)"


def test_target_on_a_row_that_was_not_measured_is_na():
    workload = Workload("w", "", ("ours", "ref"), "ref",
                        (Target("ours", "ref", 1.0, metric="missing"),), lambda ctx: None)
    report = runner.build_report([(workload, [_row("other", {"ours": _summary(1.0),
                                                             "ref": _summary(1.0)})], None)],
                                 [workload], created="t", device="d", versions={}, quick=True,
                                 elapsed_s=1.0)
    (verdict,) = report.targets
    assert verdict.status == "N/A" and verdict.metric == "missing"
    assert verdict.note == "row not measured"


def test_target_bounds_are_inclusive_and_directional():
    assert Target("a", "b", 1.05).holds(1.05)
    assert not Target("a", "b", 1.05).holds(1.0501)
    assert Target("a", "b", 2.0, direction="at_least").holds(2.0)
    assert not Target("a", "b", 2.0, direction="at_least").holds(1.9)
    assert Target("a", "b", 0.9).describe() == "<= 0.90x"


def test_target_lines_in_text_output():
    text = render_report(_demo_report())
    lines = text.splitlines()
    assert any(line.split()[:2] == ["PASS", "demo"] and "ours / ref = 1.070x" in line
               and "(target <= 1.10x)" in line and line.endswith("[fast]") for line in lines)
    assert any(line.split()[:2] == ["MISS", "demo"] and "[slow]" in line for line in lines)
    assert any(line.split()[:1] == ["N/A"] and "torchy: n/a (torch not installed)" in line
               for line in lines)


# -- the run loop on fake workloads --------------------------------------------------------


def _fake_workloads():
    def good(ctx: Context) -> None:
        ctx.step("measuring")
        builder = RowBuilder("m", "us", ("ours", "ref"), "ref", "ours")
        builder.set("ours", _summary(1.0))
        builder.set("ref", _summary(2.0))
        ctx.emit(builder.build())

    def crashing(ctx: Context) -> None:
        builder = RowBuilder("before", "us", ("ours", "ref"), "ref", "ours")
        builder.set("ours", _summary(1.0))
        builder.set("ref", _summary(1.0))
        ctx.emit(builder.build())
        raise ValueError("boom")

    return (Workload("good", "fine", ("ours", "ref"), "ref", (Target("ours", "ref", 1.0),),
                     good),
            Workload("bad", "crashes", ("ours", "ref"), "ref", (), crashing))


@pytest.fixture
def fake_gpu(monkeypatch):
    monkeypatch.setattr(runner, "WORKLOADS", _fake_workloads())
    monkeypatch.setattr(runner, "gpu_unavailable_reason", lambda: None)
    monkeypatch.setattr(runner, "device_name", lambda: "Fake GPU (sm_90)")


def test_main_runs_continues_after_a_crash_and_writes_json(fake_gpu, tmp_path, capsys):
    path = tmp_path / "report.json"
    assert runner.main(["--json", str(path), "--no-progress"]) == 1
    out, err = capsys.readouterr()
    assert "good: fine" in out and "bad: crashes" in out
    assert "error: ValueError: boom" in out
    assert "PASS  good" in out
    assert "workload bad crashed" in err and "Traceback" in err
    report = BenchReport.model_validate_json(path.read_text())
    assert [(r.workload, r.metric) for r in report.rows] == [("good", "m"), ("bad", "before")]
    assert report.errors[0].workload == "bad"
    assert report.device == "Fake GPU (sm_90)"


def test_main_only_selects_and_exits_0(fake_gpu, tmp_path, capsys):
    path = tmp_path / "report.json"
    assert runner.main(["--only", "good", "--json", str(path), "--no-progress"]) == 0
    report = BenchReport.model_validate_json(path.read_text())
    assert {r.workload for r in report.records} == {"good"}
    assert report.targets[0].status == "PASS"


def test_json_is_written_after_each_workload_so_a_killed_run_keeps_its_rows(
        fake_gpu, monkeypatch, tmp_path):
    path = tmp_path / "report.json"
    seen = []

    class Killed(BaseException):
        """What a time limit's signal would do: nothing after it runs."""

    def killing(ctx: Context) -> None:
        seen.append(BenchReport.model_validate_json(path.read_text()))
        raise Killed

    workloads = (*_fake_workloads(), Workload("slow", "killed", ("ours", "ref"), "ref", (),
                                              killing))
    monkeypatch.setattr(runner, "WORKLOADS", workloads)
    with pytest.raises(Killed):
        runner.main(["--json", str(path), "--no-progress"])
    # On disk: the two workloads that finished, the crash and the target included.
    report = BenchReport.model_validate_json(path.read_text())
    assert [(r.workload, r.metric) for r in report.rows] == [("good", "m"), ("bad", "before")]
    assert report.errors[0].workload == "bad" and report.targets[0].status == "PASS"
    assert seen[0] == report


def test_unwritable_json_path_fails_the_run(fake_gpu, tmp_path, capsys):
    path = tmp_path / "missing-dir" / "report.json"
    assert runner.main(["--only", "good", "--json", str(path), "--no-progress"]) == 1
    assert "could not write" in capsys.readouterr().err


# -- building blocks -----------------------------------------------------------------------


def test_row_builder_turns_setup_failures_into_cells():
    builder = RowBuilder("m", "us", ("a", "b", "c", "d"), "a", "b")

    def unavailable():
        raise SystemUnavailable("torch not installed")

    def broken():
        raise RuntimeError("bad\nsecond line")

    assert builder.setup("a", lambda: 42) == 42
    assert builder.setup("b", unavailable) is None
    assert builder.setup("c", broken) is None
    row = builder.build()
    assert row.cells["b"] == NotAvailable("torch not installed")
    assert row.cells["c"] == Failed("RuntimeError: bad")
    assert row.cells["d"] == NotAvailable("not measured")
    assert "a" not in row.cells or isinstance(row.cells["a"], NotAvailable)


def test_row_builder_measure_interleaves_and_isolates_failures():
    order = []

    def make(name, value, fail_at=None):
        def batch():
            order.append(name)
            if fail_at is not None and order.count(name) == fail_at:
                raise RuntimeError(f"{name} failed")
            return value
        return batch

    builder = RowBuilder("m", "us", ("a", "b", "c"), "a", "b")
    builder.measure({"a": make("a", 1e-6), "b": make("b", 2e-6, fail_at=3), "c": None},
                    repeats=4, scale=1e6, warmup=1)
    row = builder.build()
    # One batch of each per round, in that round's order; b leaves at its third batch.
    expected = [name for i in range(2) for name in round_order(["a", "b"], i)]
    expected += [name for name in round_order(["a", "b"], 2)]
    assert order[:6] == expected
    assert row.cells["a"] == Summary(1.0, 1.0, 1.0, MIN_ROUNDS)  # 4 asked, the floor given
    assert row.cells["b"] == Failed("RuntimeError: b failed")
    assert row.cells["c"] == NotAvailable("not measured")


def test_interleave_drops_warmup_rounds_and_gives_every_row_the_floor():
    values = iter(range(100))
    samples = interleave({"x": lambda: next(values)}, repeats=3, warmup=2,
                         on_error=lambda name, exc: None)
    assert samples == {"x": list(range(2, 2 + MIN_ROUNDS))}
    values = iter(range(100))
    samples = interleave({"x": lambda: next(values)}, repeats=12, warmup=0,
                         on_error=lambda name, exc: None)
    assert samples == {"x": list(range(MIN_WARMUP, MIN_WARMUP + 12))}


def test_round_order_is_shuffled_per_round_and_the_same_on_every_call():
    names = ["a", "b", "c", "d"]
    orders = [round_order(names, i) for i in range(20)]
    assert all(sorted(order) == names for order in orders)
    assert len({tuple(order) for order in orders}) > 5
    assert orders == [round_order(names, i) for i in range(20)]  # every rank, every rerun
    assert names == ["a", "b", "c", "d"]  # the caller's list is left alone


def test_summarize_and_scale():
    s = summarize([3.0, 1.0, 2.0, 10.0])
    assert (s.median, s.min, s.max, s.repeats) == (2.5, 1.0, 10.0, 4)
    assert s.scaled(1e3) == Summary(2500.0, 1000.0, 10000.0, 4)
    with pytest.raises(ValueError, match="no samples"):
        summarize([])


def test_host_batch_synchronizes_around_the_batch():
    events = []
    per_call = host_batch(lambda: events.append("call"), 5, lambda: events.append("sync"))
    assert events == ["sync"] + ["call"] * 5 + ["sync"]
    assert per_call >= 0
    events.clear()
    host_batch(lambda: events.append("call"), 2, lambda: events.append("sync"),
               include_sync=True)
    assert events == ["sync", "call", "call", "sync"]


def test_check_close_and_verify():
    import numpy as np

    rng = np.random.default_rng(0)
    expected = rng.standard_normal(100)
    check_close(expected * (1 + 1e-7), expected, "same", tol=1e-6)
    with pytest.raises(RuntimeError, match="relative error"):
        check_close(expected + 1.0, expected, "shifted", tol=1e-3)
    with pytest.raises(RuntimeError, match="NaN"):
        check_close(np.full(100, np.nan), expected, "nan", tol=1e-3)
    builder = RowBuilder("m", "us", ("a", "b"), "a", "b")
    assert verify(builder, "a", lambda: None)
    assert not verify(builder, "b", lambda: check_close(expected + 1, expected, "b", tol=1e-3))
    assert isinstance(builder.build().cells["b"], Failed)


def test_progress_lines_when_not_a_terminal():
    stream = io.StringIO()
    progress = runner.Progress(2, stream=stream)
    progress.begin(0, "replay")
    progress.step("capture")  # a line with the seconds since the workload began
    progress.end("done")
    progress.close()
    lines = stream.getvalue().splitlines()
    assert lines[0] == "cugraphrt bench [1/2] replay ..."
    assert re.fullmatch(r"cugraphrt bench \[1/2\] replay: capture \(at \d+\.\d s\)", lines[1])
    assert lines[2].startswith("cugraphrt bench [1/2] replay done in ")
    assert len(lines) == 3


def test_progress_bar_redraws_on_a_terminal():
    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    stream = Terminal()
    progress = runner.Progress(4, stream=stream)
    progress.begin(1, "chain")
    progress.step("measure")
    progress.close()
    text = stream.getvalue()
    assert "\r[#####---------------] 2/4 chain: measure" in text
    assert text.endswith("\r")


def test_disabled_progress_prints_nothing():
    stream = io.StringIO()
    progress = runner.Progress(1, enabled=False, stream=stream)
    progress.begin(0, "x")
    progress.end("done")
    progress.close()
    assert stream.getvalue() == ""


def test_plot_is_written_when_matplotlib_is_installed(tmp_path):
    pytest.importorskip("matplotlib")
    from cugraphrt.bench.render import write_plot

    path = tmp_path / "bench.png"
    write_plot(_demo_report(), path)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_torch_workloads_without_torch_give_na_rows_not_crashes(monkeypatch):
    from cugraphrt.bench import workloads_torch

    def missing():
        raise SystemUnavailable("torch not installed")

    monkeypatch.setattr(workloads_torch, "torch_module", missing)
    workloads = [w for w in runner.WORKLOADS
                 if w.name in ("torch_infer", "torch_train", "capture_time")]
    results = []
    for workload in workloads:
        ctx = Context(quick=True)
        workload.run(ctx)
        results.append((workload, ctx.rows, None))
    pool_rows = workloads_torch.torch_pool_rows(Context(quick=True), (256, 512), (8, 8))
    rows = [row for _, rows, _ in results for row in rows] + pool_rows
    assert [r.metric for r in rows] == [
        "mlp 4x512 b32", "convnet b32", "cpu-bound 16x128 b8", "mlp 4x512 b32 fwd+bwd",
        "infer mlp 4x512 b32", "train mlp 4x512 b32", "torch mlp x8 reserved",
        "torch mlp x8 device"]
    for row in rows:
        assert set(row.cells) == set(row.systems)
        assert all(cell == NotAvailable("torch not installed") for cell in row.cells.values())
    report = runner.build_report(results, workloads, created="t", device="d", versions={},
                                 quick=True, elapsed_s=1.0)
    assert not report.failed
    assert "n/a (torch not installed)" in render_table(report)
    assert {t.status for t in report.targets} == {"N/A"}


def test_run_workloads_keeps_each_workloads_wall_time_in_run_order(monkeypatch):
    monkeypatch.setattr(runner, "device_name", lambda: "Fake GPU")
    monkeypatch.setattr(runner, "_settle", lambda: None)
    now = [100.0]  # a clock that moves only when a workload says so
    monkeypatch.setattr(runner, "perf_counter", lambda: now[0])

    def takes(seconds, error=None):
        def run(ctx):
            now[0] += seconds
            if error:
                raise ValueError(error)
        return run

    slow = Workload("slow", "demo", ("ours", "ref"), "ref", (), takes(2.5))
    crashing = Workload("crashing", "demo", ("ours", "ref"), "ref", (), takes(6.0, "boom"))
    seen = []
    report = runner.run_workloads([slow, crashing], quick=True,
                                  checkpoint=lambda partial: seen.append(dict(partial.workload_s)))
    assert report.workload_s == {"slow": 2.5, "crashing": 6.0}  # a crash is timed too
    assert list(report.workload_s) == ["slow", "crashing"]
    assert seen == [{"slow": 2.5}, {"slow": 2.5, "crashing": 6.0}]
    assert [e.workload for e in report.errors] == ["crashing"]
    assert report.elapsed_s == 8.5


def test_a_workloads_finished_rows_are_checkpointed_before_it_ends(monkeypatch):
    # A device call's time limit can cut a long workload (one architecture after another):
    # the rows it finished must be in the JSON already, with their verdicts.
    monkeypatch.setattr(runner, "device_name", lambda: "Fake GPU")
    monkeypatch.setattr(runner, "_settle", lambda: None)
    seen = []

    def run(ctx):
        for metric, ours in (("first", 0.5), ("second", 2.0)):
            row = RowBuilder(metric, "us", ("ours", "ref"), "ref", "ours")
            row.set("ref", _summary(1.0))
            row.set("ours", _summary(ours))
            ctx.emit(row.build())
        raise KeyboardInterrupt("cut")  # what a time limit's signal leaves: no end of run

    long = Workload("long", "demo", ("ours", "ref"), "ref",
                    (Target("ours", "ref", 1.0, metric="first"),
                     Target("ours", "ref", 1.0, metric="second")), run)
    with pytest.raises(KeyboardInterrupt):
        runner.run_workloads([long], quick=True, checkpoint=seen.append)
    assert [[r.metric for r in report.rows] for report in seen] == [["first"],
                                                                     ["first", "second"]]
    assert [[t.status for t in report.targets] for report in seen] == [
        ["PASS", "N/A"], ["PASS", "MISS"]]


# -- a broken install is an error; only a missing torch is n/a ------------------------------


def _adapter_workload():
    """Sets its adapter system up the way the torch workloads do (torch_common's lookup)."""
    from cugraphrt.bench.torch_common import adapter_function

    def run(ctx: Context) -> None:
        row = RowBuilder("m", "us", ("ref", "cugraphrt_torch"), "ref", "cugraphrt_torch")
        row.set("ref", _summary(1.0))
        graph_module = row.setup("cugraphrt_torch", lambda: adapter_function("graph_module"))
        if graph_module is not None:
            row.set("cugraphrt_torch", _summary(1.0))
        ctx.emit(row.build())

    return Workload("adapter", "needs cugraphrt_torch", ("ref", "cugraphrt_torch"), "ref",
                    (Target("cugraphrt_torch", "ref", 1.05),), run)


@pytest.fixture
def torch_with_cuda(monkeypatch):
    """A stand-in torch module that says it has a CUDA device."""
    fake = types.SimpleNamespace(__version__="9.9.9",
                                 cuda=types.SimpleNamespace(is_available=lambda: True))
    monkeypatch.setitem(sys.modules, "torch", fake)
    return fake


def test_a_broken_adapter_import_exits_non_zero(fake_gpu, monkeypatch, torch_with_cuda,
                                                 capsys):
    monkeypatch.setattr(runner, "WORKLOADS", (_adapter_workload(),))
    monkeypatch.setattr(runner, "_settle", lambda: None)
    monkeypatch.setitem(sys.modules, "cugraphrt_torch", None)  # its import raises
    assert runner.main(["--no-progress"]) == 1
    out, err = capsys.readouterr()
    assert "error: BrokenInstall: cugraphrt_torch does not import" in out
    assert "N/A   adapter" in out  # the target has no value, and the run failed
    assert "cugraphrt_torch failed on 'm'" in err and "Traceback" in err


def test_a_missing_torch_is_na_and_the_run_succeeds(fake_gpu, monkeypatch, capsys):
    monkeypatch.setattr(runner, "WORKLOADS", (_adapter_workload(),))
    monkeypatch.setattr(runner, "_settle", lambda: None)
    monkeypatch.setitem(sys.modules, "torch", None)  # as if not installed
    assert runner.main(["--no-progress"]) == 0
    assert "n/a (torch not installed)" in capsys.readouterr().out


def test_torch_that_does_not_import_is_an_error_not_na(monkeypatch):
    from cugraphrt.bench import torch_common

    monkeypatch.setitem(sys.modules, "torch", None)
    with pytest.raises(SystemUnavailable, match="torch not installed"):
        torch_common.torch_module()
    import builtins

    real_import = builtins.__import__

    def failing(name, *args, **kwargs):
        if name == "torch":
            raise OSError("libcudart.so.13: cannot open shared object file")
        return real_import(name, *args, **kwargs)

    monkeypatch.delitem(sys.modules, "torch")
    monkeypatch.setattr(builtins, "__import__", failing)
    with pytest.raises(torch_common.BrokenInstall, match="torch does not import: OSError"):
        torch_common.torch_module()


def test_the_targets_headline_counts_clear_verdicts_apart_from_those_inside_the_spread():
    from cugraphrt.bench.records import TargetResult
    from cugraphrt.bench.render import headline, render_targets

    def verdict(status, within=False, ratio=1.0, low=0.9, high=1.1):
        return TargetResult(workload="w", metric="m", system="s", reference="r",
                            threshold=1.0, direction="at_most", ratio=ratio, low=low,
                            high=high, within_spread=within, status=status)

    report = BenchReport(created="t", device="d", versions={}, quick=True, elapsed_s=1.0)
    report.targets = [verdict("PASS"), verdict("PASS"), verdict("PASS", within=True),
                      verdict("MISS", within=True), verdict("MISS"),
                      verdict("PASS", low=None, high=None),
                      TargetResult(workload="w", metric="m", system="s", reference="r",
                                   threshold=1.0, direction="at_most", ratio=None,
                                   status="N/A", note="r: n/a")]
    assert headline(report) == "3 PASS, 1 PASS~, 1 MISS~, 1 MISS, 1 N/A"
    lines = render_targets(report).splitlines()
    assert lines[0] == "targets: 3 PASS, 1 PASS~, 1 MISS~, 1 MISS, 1 N/A"
    assert "= 1.000x [0.900, 1.100] (target <= 1.00x)" in lines[1]
    assert "= 1.000x [one measurement] (target <= 1.00x)" in lines[6]


def test_moe_step_is_skipped_in_quick_and_held_to_eager():
    from cugraphrt.bench import workloads_moe as moe
    from cugraphrt.bench.spec import Context

    ctx = Context(quick=True)
    moe.run_moe_step(ctx)
    emitted = ctx.rows
    timed = [f"{step}, {arch}" for arch in moe.ARCHS for step in moe.STEPS]
    skips = [f"{moe.STEPS[0]}, {arch}: CUDA graphs Inductor skipped" for arch in moe.ARCHS]
    assert [row.metric for row in emitted] == timed + skips
    for row in emitted:
        assert set(row.cells) == set(moe.SYSTEMS)
        assert all("--only moe_step" in str(cell) or "not installed" in str(cell)
                   for cell in row.cells.values())
    # One target per timed row, each against eager (a system cugraphrt does not build); the
    # counts of skipped graphs are information.
    assert {(t.system, t.reference, t.metric) for t in moe.MOE_STEP.targets} == {
        ("cugraphrt", "eager", metric) for metric in timed}


def test_generate_architectures_picks_known_architectures_only():
    from cugraphrt.bench import workloads_architectures as arch

    assert arch.archs(None) == arch.archs("") == arch.DEFAULT_ARCHS
    assert arch.archs(" gemma3, gpt_oss ") == ("gemma3", "gpt_oss")
    with pytest.raises(ValueError, match="unknown architectures \\['llama4'\\]"):
        arch.archs("llama,llama4")
    # Five architectures, two of them with sliding windows and one a mixture of experts.
    assert len(arch.DEFAULT_ARCHS) == 5
    assert {"gemma3", "mistral"} <= set(arch.DEFAULT_ARCHS) and "mixtral" in arch.DEFAULT_ARCHS
