"""Systems in processes of their own, timed interleaved (cugraphrt.bench.children), on fake
child processes (tests/unit/bench_child.py)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from cugraphrt.bench import children
from cugraphrt.bench.timing import MIN_ROUNDS, MIN_WARMUP, round_order

ROOT = Path(__file__).resolve().parents[2]
CHILD = str(Path(__file__).with_name("bench_child.py"))


@pytest.fixture(autouse=True)
def _children_see_this_checkout(monkeypatch):
    paths = [str(ROOT), os.environ.get("PYTHONPATH", "")]
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(p for p in paths if p))


def _command(mode: str, name: str) -> list[str]:
    return [sys.executable, CHILD, mode, name]


def test_children_are_timed_round_by_round_in_a_shuffled_order():
    failures: list = []
    steps: list[str] = []
    results = children.run_interleaved(
        {"a": _command("ok", "a"), "b": _command("noisy", "b"), "c": _command("ok", "c")},
        repeats=3, warmup=0, on_error=lambda s, e: failures.append((s, e)), step=steps.append)
    assert failures == []
    assert {name: r.info["name"] for name, r in results.items()} == {"a": "a", "b": "b",
                                                                     "c": "c"}
    # At least MIN_ROUNDS timed rounds after MIN_WARMUP untimed ones, whatever was asked.
    rounds, warmup = MIN_ROUNDS, MIN_WARMUP
    assert all(len(r.samples) == rounds for r in results.values())
    # Samples are monotonic clock readings taken by each child when asked: each timed round
    # ran the three systems in that round's shuffled order, all of them before the next.
    orders = [round_order("abc", warmup + i) for i in range(rounds)]
    flat = [results[name].samples[i] for i in range(rounds) for name in orders[i]]
    assert flat == sorted(flat)
    assert len({tuple(order) for order in orders}) > 1  # not one fixed order
    assert steps[:3] == ["a: set-up", "b: set-up", "c: set-up"]
    assert steps[-1] == f"round {rounds + warmup}/{rounds + warmup}"


def test_a_child_failing_at_set_up_or_in_a_round_costs_its_system_only(capsys):
    failures: dict[str, BaseException] = {}
    results = children.run_interleaved(
        {"setup": _command("setup_crash", "s"), "ok": _command("ok", "o"),
         "round": _command("round_crash", "r")},
        repeats=3, warmup=0, on_error=lambda s, e: failures.__setitem__(s, e))
    assert set(results) == {"ok"} and len(results["ok"].samples) == MIN_ROUNDS
    assert isinstance(failures["setup"], children.ChildFailed)
    assert str(failures["setup"]) == ("the system's process exited with status 3: s: CUDA "
                                      "error: an illegal memory access was encountered")
    assert "exited with status 139: Segmentation fault" in str(failures["round"])
    assert "Segmentation fault" in capsys.readouterr().err  # the child's stderr, in full


def test_a_silent_child_times_out():
    failures: dict[str, BaseException] = {}
    results = children.run_interleaved(
        {"silent": _command("silent", "x")}, repeats=1,
        on_error=lambda s, e: failures.__setitem__(s, e), setup_timeout_s=2.0)
    assert results == {}
    assert str(failures["silent"]).startswith("the system's process timed out")


def test_hf_decode_holds_each_backend_to_the_numerics_it_keeps(monkeypatch):
    from cugraphrt.bench import runner, workloads_compile
    from cugraphrt.bench.spec import Context

    monkeypatch.setattr(workloads_compile, "missing_package", lambda *names: None)
    monkeypatch.setattr(workloads_compile, "_command",
                        lambda workload, system: _command("decode", system))
    monkeypatch.setattr(workloads_compile, "_REPEATS", 2)
    ctx = Context(quick=False)
    workloads_compile.HF_DECODE.run(ctx)
    rows = {row.metric: row for row in ctx.rows}
    assert set(rows) == {"step", "compile + capture", "memory", "same as eager",
                         "same as torch_compile"}
    eager_steps = {s: c.median for s, c in rows["same as eager"].cells.items()}
    assert eager_steps["cugraphrt_compile"] == 9 and eager_steps["cugraphrt_exact"] == 64
    assert eager_steps["cugraphrt_rounded"] == 64
    assert rows["same as torch_compile"].cells["cugraphrt_compile"].median == 64
    assert rows["step"].cells["cugraphrt_compile"].repeats == MIN_ROUNDS  # the floor
    report = runner.build_report([(workloads_compile.HF_DECODE, ctx.rows, None)],
                                 [workloads_compile.HF_DECODE], created="t", device="d",
                                 versions={}, quick=False, elapsed_s=1.0)
    tokens = {(t.system, t.reference): t.status for t in report.targets
              if t.metric.startswith("same as")}
    assert tokens == {("cugraphrt_compile", "torch_compile"): "PASS",
                      ("cugraphrt_aot_eager", "torch_eager"): "PASS",
                      ("cugraphrt_exact", "torch_eager"): "PASS",
                      ("cugraphrt_rounded", "torch_eager"): "PASS"}
