"""``cugraphrt bench --distributed`` without GPUs: the flag, the n/a rows and the target,
with torchrun replaced by canned results."""

from __future__ import annotations

import pytest

from cugraphrt.bench import runner, workloads_distributed
from cugraphrt.bench.spec import Context, Failed, NotAvailable
from cugraphrt.bench.timing import Summary


def test_the_flag_selects_the_distributed_workloads():
    args = runner.parse_args(["--distributed"])
    assert args.distributed and runner.selected_names(args) == {"ddp", "tp_decode", "dist_cg",
                                                                "generate_tp"}
    both = runner.parse_args(["--distributed", "--only", "replay"])
    assert runner.selected_names(both) == {"ddp", "tp_decode", "dist_cg", "generate_tp",
                                           "replay"}
    assert not runner.parse_args([]).distributed
    assert "ddp" in [w.name for w in runner.WORKLOADS]


def _rows(monkeypatch, gpus: int, *, quick=False, selected=True, launch=None):
    """The three distributed rows of one run (one Context), with torchrun replaced."""
    monkeypatch.setattr(workloads_distributed, "gpu_count", lambda: gpus)
    launches = []
    if launch is not None:
        monkeypatch.setattr(workloads_distributed, "_launch",
                            lambda: launches.append(1) or launch())
    ctx = Context(quick=quick, selected=selected)
    workloads_distributed.DDP.run(ctx)
    workloads_distributed.TP_DECODE.run(ctx)
    workloads_distributed.DIST_CG.run(ctx)
    assert len(launches) <= 1  # one launch fills every row
    return ctx.rows


def _row(monkeypatch, gpus: int, **kwargs):
    return _rows(monkeypatch, gpus, **kwargs)[0]


TP = {"eager": [900e-6, 910e-6], "torch_graph": [200e-6, 201e-6], "cugraphrt": [202e-6, 203e-6],
      "cugraphrt_watched": [206e-6, 207e-6]}
CG = {"eager_check_1": [12e-3, 13e-3], "replay_check_1": [3.4e-3, 3.5e-3],
      "while_loop": [1.7e-3, 1.8e-3]}


@pytest.mark.parametrize("gpus", [0, 1])
def test_fewer_than_two_gpus_is_na_with_the_reason(monkeypatch, gpus):
    def launch():
        raise AssertionError("torchrun must not start")

    row = _row(monkeypatch, gpus, launch=launch)
    for system in workloads_distributed.SYSTEMS:
        cell = row.cells[system]
        assert isinstance(cell, NotAvailable)
        assert cell.reason == (f"needs 2 GPUs and a CUDA build of torch (got {gpus} GPU(s))")


def test_quick_runs_skip_it_unless_selected(monkeypatch):
    row = _row(monkeypatch, 2, quick=True, selected=False, launch=lambda: {})
    assert all(isinstance(c, NotAvailable) and "--distributed" in c.reason
               for c in row.cells.values())


def test_measured_rows_and_the_speedup_target(monkeypatch):
    canned = {"ddp": {"ddp_eager": [300e-6, 310e-6, 305e-6],
                      "cugraphrt_step": [150e-6, 151e-6, 149e-6]}, "tp": TP, "cg": CG}
    row = _row(monkeypatch, 2, launch=lambda: canned)
    eager, graphed = row.cells["ddp_eager"], row.cells["cugraphrt_step"]
    assert isinstance(eager, Summary) and isinstance(graphed, Summary)
    assert eager.median == pytest.approx(305.0) and graphed.median == pytest.approx(150.0)
    report = runner.build_report([(workloads_distributed.DDP, [row], None)],
                                 [workloads_distributed.DDP], created="now", device="test",
                                 versions={}, quick=False, elapsed_s=1.0)
    (target,) = report.targets
    # the median of the per-round ratios 150/300, 151/310, 149/305
    assert target.status == "PASS" and target.ratio == pytest.approx(149 / 305)
    slow = {"ddp": {"ddp_eager": [300e-6], "cugraphrt_step": [250e-6]}, "tp": TP, "cg": CG}
    row = _row(monkeypatch, 2, launch=lambda: slow)
    report = runner.build_report([(workloads_distributed.DDP, [row], None)],
                                 [workloads_distributed.DDP], created="now", device="test",
                                 versions={}, quick=False, elapsed_s=1.0)
    assert report.targets[0].status == "MISS"


def test_a_failed_torchrun_is_an_error_cell(monkeypatch, capsys):
    def launch():
        raise RuntimeError("torchrun exited with status 1: NCCL error")

    row = _row(monkeypatch, 2, launch=launch)
    assert isinstance(row.cells["cugraphrt_step"], Failed)
    assert "NCCL error" in row.cells["cugraphrt_step"].message
    assert isinstance(row.cells["ddp_eager"], NotAvailable)


def test_the_tensor_parallel_row_and_its_two_targets(monkeypatch):
    canned = {"ddp": {"ddp_eager": [300e-6], "cugraphrt_step": [150e-6]}, "tp": TP, "cg": CG}
    _, row, _ = _rows(monkeypatch, 2, launch=lambda: canned)
    assert row.metric == "decode step" and row.systems == workloads_distributed.TP_SYSTEMS
    assert row.cells["cugraphrt_watched"].median == pytest.approx(206.5)
    report = runner.build_report([(workloads_distributed.TP_DECODE, [row], None)],
                                 [workloads_distributed.TP_DECODE], created="now",
                                 device="test", versions={}, quick=False, elapsed_s=1.0)
    by_reference = {t.reference: t for t in report.targets}
    assert by_reference["torch_graph"].status == "PASS"  # 202.5 / 200.5 <= 1.05
    assert by_reference["eager"].status == "PASS"  # 202.5 / 905 <= 1/3
    assert by_reference["torch_graph"].ratio == pytest.approx(202.5 / 200.5)


def test_a_hang_is_a_failed_cell_in_both_rows(monkeypatch):
    def launch():
        raise RuntimeError("torchrun hung: a rank reached the 420 s deadline")

    ddp, tp, cg = _rows(monkeypatch, 2, launch=launch)
    assert isinstance(ddp.cells["cugraphrt_step"], Failed)
    assert isinstance(cg.cells["while_loop"], Failed)
    assert isinstance(tp.cells["cugraphrt"], Failed) and "deadline" in tp.cells["cugraphrt"].message
    assert isinstance(tp.cells["eager"], NotAvailable)


def test_the_launch_reads_the_result_and_reports_a_hang(monkeypatch, capsys):
    from cugraphrt.bench import torchrun as launcher

    seen = {}

    def fake(target, args=(), **kwargs):
        seen.update(kwargs, target=target)
        return launcher.Launch(["torchrun"], 0, 'noise\nRESULT {"ddp": {}}\n', "", 12.0)

    monkeypatch.setattr(launcher, "torchrun", fake)
    monkeypatch.setattr(workloads_distributed, "gpu_count", lambda: 2)
    monkeypatch.delenv("CUGRAPHRT_WORLD", raising=False)
    assert workloads_distributed._launch() == {"ddp": {}}
    assert seen["target"] == "cugraphrt.bench.distributed_child" and seen["module"]
    assert seen["nproc"] == 2 and seen["deadline_s"] == workloads_distributed.DEADLINE_S
    hung = launcher.Launch(["torchrun"], 1, "", "", 460.0, timed_out=True,
                           stacks={"rank1": "Timeout (0:07:00)!\n  File x.py"})
    monkeypatch.setattr(launcher, "torchrun", lambda *a, **k: hung)
    with pytest.raises(RuntimeError, match="torchrun hung: a rank reached the 540 s deadline"):
        workloads_distributed._launch()
    assert "--- rank1: Python stacks ---" in capsys.readouterr().err


def test_the_launch_takes_one_rank_per_gpu(monkeypatch):
    from cugraphrt.bench import torchrun as launcher

    seen = {}

    def fake(target, args=(), **kwargs):
        seen.update(kwargs)
        return launcher.Launch(["torchrun"], 0, 'RESULT {"ddp": {}}\n', "", 1.0)

    monkeypatch.setattr(launcher, "torchrun", fake)
    monkeypatch.delenv("CUGRAPHRT_WORLD", raising=False)
    monkeypatch.setattr(workloads_distributed, "gpu_count", lambda: 4)
    workloads_distributed._launch()
    assert seen["nproc"] == 4
    monkeypatch.setenv("CUGRAPHRT_WORLD", "2")
    workloads_distributed._launch()
    assert seen["nproc"] == 2


def test_the_distributed_cg_row_and_its_target(monkeypatch):
    canned = {"ddp": {"ddp_eager": [300e-6], "cugraphrt_step": [150e-6]}, "tp": TP, "cg": CG}
    _, _, row = _rows(monkeypatch, 2, launch=lambda: canned)
    assert row.metric == "solve" and row.unit == "ms"
    assert row.systems == ("eager_check_1", "replay_check_1", "while_loop")
    assert row.cells["while_loop"].median == pytest.approx(1.75)
    report = runner.build_report([(workloads_distributed.DIST_CG, [row], None)],
                                 [workloads_distributed.DIST_CG], created="now",
                                 device="test", versions={}, quick=False, elapsed_s=1.0)
    (target,) = report.targets
    assert target.reference == "eager_check_1" and target.status == "PASS"
    assert target.ratio == pytest.approx(1.7 / 12, rel=0.05)


def _generate_tp_rows(monkeypatch, generate_tp):
    monkeypatch.setattr(workloads_distributed, "gpu_count", lambda: 2)
    canned = {"ddp": {"ddp_eager": [3e-4], "cugraphrt_step": [1e-4]}, "tp": TP, "cg": CG,
              "generate_tp": generate_tp}
    monkeypatch.setattr(workloads_distributed, "_launch", lambda: canned)
    ctx = Context(quick=False, selected=True)
    workloads_distributed.DDP.run(ctx)
    workloads_distributed.GENERATE_TP.run(ctx)
    return ctx.rows


def test_generate_tp_rows_read_their_metrics_and_targets(monkeypatch):
    from cugraphrt.bench.distributed_generate import (
        BATCHES,
        GENERATE_TP_SYSTEMS,
        NEW,
        SHORT_LABEL,
        per_token_metric,
        same_metric,
    )

    times = {"hf_eager": 30e-3, "torch_per_token": 4e-3, "torch_loop": 2.1e-3,
             "per_token": 4e-3, "cugraphrt": 2.2e-3, "cugraphrt_watched": 2.2e-3}
    # The short step: the Generator 0.95x the per-token loop, short of its 1.1x.
    short = {**times, "torch_per_token": 2.2e-3 / 0.95}
    keys = [(b, "", times) for b in BATCHES] + [(1, SHORT_LABEL, short)]
    canned = {}
    for batch, label, samples in keys:
        canned[per_token_metric(batch, label)] = {s: [samples[s], samples[s] * 1.01]
                                                  for s in GENERATE_TP_SYSTEMS}
        canned[same_metric(batch, label)] = {s: [float(NEW)] for s in GENERATE_TP_SYSTEMS}
    ddp, *rows = _generate_tp_rows(monkeypatch, canned)
    assert [r.metric for r in rows] == [m(b, label) for b, label, _ in keys
                                        for m in (per_token_metric, same_metric)]
    assert rows[-2].metric == "per token, batch 1, short step"
    per_token, same = rows[0], rows[1]
    assert per_token.cells["cugraphrt"].median == pytest.approx(2.2e-3 * 1.005 * 1e6)
    assert same.unit == "tokens" and same.cells["cugraphrt"].median == NEW
    report = runner.build_report([(workloads_distributed.GENERATE_TP, rows, None)],
                                 [workloads_distributed.GENERATE_TP], created="now",
                                 device="test", versions={}, quick=False, elapsed_s=1.0)
    by_reference = {(t.reference, t.metric): t.status for t in report.targets}
    assert by_reference[("hf_eager", per_token_metric(1))] == "PASS"      # 0.073x <= 0.33x
    assert by_reference[("torch_loop", per_token_metric(1))] == "PASS"   # 1.048x <= 1.10x
    assert by_reference[("hf_eager", same_metric(8))] == "PASS"
    assert by_reference[("hf_eager", same_metric(1, SHORT_LABEL))] == "PASS"
    # Against the per-token loop only the short step carries a verdict: on 12x1024 the
    # host's read per token is 1-2% of the step (information).
    assert ("torch_per_token", per_token_metric(1)) not in by_reference
    assert by_reference[("torch_per_token", per_token_metric(1, SHORT_LABEL))] == "MISS"


def test_a_failed_generate_tp_leaves_the_other_rows_standing(monkeypatch):
    ddp, *rows = _generate_tp_rows(monkeypatch, {"error": "RuntimeError: boom"})
    assert isinstance(ddp.cells["cugraphrt_step"], Summary)
    assert rows and all(isinstance(r.cells["cugraphrt"], Failed) for r in rows)
    assert "generate_tp failed on the ranks: RuntimeError: boom" in \
        rows[0].cells["cugraphrt"].message


def _no_device(monkeypatch):
    monkeypatch.setattr(workloads_distributed, "gpu_count", lambda: 2)
    monkeypatch.setattr(runner, "device_name", lambda: "Fake GPU")
    monkeypatch.setattr(runner, "_settle", lambda: None)


def test_one_run_launches_torchrun_once_for_all_its_distributed_workloads(monkeypatch):
    # The runner gives each workload a Context of its own; the launch (minutes, with the
    # generate_tp models) is kept in what they share, and a second run launches again.
    _no_device(monkeypatch)
    launches = []
    canned = {"ddp": {"ddp_eager": [3e-4], "cugraphrt_step": [1e-4]}, "tp": TP, "cg": CG,
              "generate_tp": {"error": "RuntimeError: not measured here"}}
    monkeypatch.setattr(workloads_distributed, "_launch",
                        lambda: launches.append(1) or canned)
    four = [workloads_distributed.DDP, workloads_distributed.TP_DECODE,
            workloads_distributed.DIST_CG, workloads_distributed.GENERATE_TP]
    names = frozenset(w.name for w in four)
    report = runner.run_workloads(four, quick=False, named=names)
    assert len(launches) == 1
    status = {(t.workload, t.reference): t.status for t in report.targets}
    assert status[("ddp", "ddp_eager")] == "PASS" and status[("dist_cg", "eager_check_1")]
    runner.run_workloads(four[:1], quick=False, named=names)
    assert len(launches) == 2


def test_a_failed_launch_fails_every_distributed_row_of_the_run_once(monkeypatch):
    _no_device(monkeypatch)
    launches = []

    def failing():
        launches.append(1)
        raise RuntimeError("boom")

    monkeypatch.setattr(workloads_distributed, "_launch", failing)
    two = [workloads_distributed.DDP, workloads_distributed.TP_DECODE]
    report = runner.run_workloads(two, quick=False, named=frozenset({"ddp", "tp_decode"}))
    assert len(launches) == 1
    errors = [(n.workload, n.system, n.message) for n in report.notes if n.status == "error"]
    assert errors == [("ddp", "cugraphrt_step", "RuntimeError: boom"),
                      ("tp_decode", "cugraphrt", "RuntimeError: boom")]


@pytest.mark.parametrize("world", [2, 4, 8])
def test_the_short_step_model_splits_over_every_world_the_bench_takes(world):
    from cugraphrt.bench.distributed_generate import short_hidden

    # causal_lm's heads are 64 wide and half of them key-value heads: hidden / 128 of those,
    # which tensor parallelism splits over the ranks.
    hidden = short_hidden(world)
    assert hidden % 128 == 0 and (hidden // 128) % world == 0
    assert short_hidden(2) == 256  # the width the two-GPU reports measured
