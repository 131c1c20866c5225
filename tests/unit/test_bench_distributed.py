"""``cugraphrt bench --distributed`` without GPUs: the flag, the n/a rows and the target,
with torchrun replaced by canned results."""

from __future__ import annotations

import pytest

from cugraphrt.bench import runner, workloads_distributed
from cugraphrt.bench.spec import Context, Failed, NotAvailable
from cugraphrt.bench.timing import Summary


def test_the_flag_selects_the_distributed_workloads():
    args = runner.parse_args(["--distributed"])
    assert args.distributed and runner.selected_names(args) == {"ddp"}
    both = runner.parse_args(["--distributed", "--only", "replay"])
    assert runner.selected_names(both) == {"ddp", "replay"}
    assert not runner.parse_args([]).distributed
    assert "ddp" in [w.name for w in runner.WORKLOADS]


def _row(monkeypatch, gpus: int, *, quick=False, selected=True, launch=None):
    monkeypatch.setattr(workloads_distributed, "gpu_count", lambda: gpus)
    if launch is not None:
        monkeypatch.setattr(workloads_distributed, "_launch", launch)
    ctx = Context(quick=quick, selected=selected)
    workloads_distributed.DDP.run(ctx)
    (row,) = ctx.rows
    return row


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
    canned = {"ddp_eager": [300e-6, 310e-6, 305e-6], "cugraphrt_step": [150e-6, 151e-6, 149e-6]}
    row = _row(monkeypatch, 2, launch=lambda: canned)
    eager, graphed = row.cells["ddp_eager"], row.cells["cugraphrt_step"]
    assert isinstance(eager, Summary) and isinstance(graphed, Summary)
    assert eager.median == pytest.approx(305.0) and graphed.median == pytest.approx(150.0)
    report = runner.build_report([(workloads_distributed.DDP, [row], None)],
                                 [workloads_distributed.DDP], created="now", device="test",
                                 versions={}, quick=False, elapsed_s=1.0)
    (target,) = report.targets
    assert target.status == "PASS" and target.ratio == pytest.approx(150 / 305)
    slow = {"ddp_eager": [300e-6], "cugraphrt_step": [250e-6]}
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
