"""The spread of a ratio (paired bootstrap over interleaved repeats) and the verdicts decided
inside it (PASS~ / MISS~): computed, stored in the report, rendered, read back."""

from __future__ import annotations

import numpy as np
import pytest

from cugraphrt.bench import runner, spread
from cugraphrt.bench.records import BenchReport
from cugraphrt.bench.render import render_report, render_table
from cugraphrt.bench.spec import Row, RowBuilder, Target, Workload
from cugraphrt.bench.timing import MIN_ROUNDS, round_order, single, summarize


def _drifting(rng, n=40, ratio=1.10, noise=0.004):
    """Reference samples on a clock ramp (1.0 to 1.5) and the subject ``ratio`` times them,
    each round with a little noise of its own: what interleaving produces."""
    reference = np.linspace(1.0, 1.5, n) * (1 + noise * rng.standard_normal(n))
    subject = ratio * np.linspace(1.0, 1.5, n) * (1 + noise * rng.standard_normal(n))
    return subject.tolist(), reference.tolist()


def test_paired_rounds_cancel_a_common_drift():
    rng = np.random.default_rng(7)
    subject, reference = _drifting(rng)
    paired = spread.ratio_interval(subject, reference)
    apart = spread.ratio_interval(subject, reference[:-1])  # lengths differ: independent
    ratio = spread.ratio(summarize(subject), summarize(reference))
    quotient = np.median(subject) / np.median(reference)
    assert paired is not None and apart is not None
    assert paired[0] <= ratio <= paired[1] and apart[0] <= quotient <= apart[1]
    assert paired[0] <= 1.10 <= paired[1]  # the true ratio, within 0.5%
    assert abs(ratio - 1.10) < abs(quotient - 1.10)  # closer than the quotient of medians
    assert paired[1] - paired[0] < 0.02  # the ramp cancels round by round
    assert apart[1] - apart[0] > 4 * (paired[1] - paired[0])  # it does not, resampled apart


# ResNet-50 builds on an H100 (2026-11-25), ms, 15 interleaved rounds: torch's hand graph and
# cugraphrt_torch.graph_module. Both ran in a slow regime for seven rounds, then a fast one.
RESNET_TORCH = [35.3, 35.6, 34.0, 33.8, 34.6, 36.9, 40.3, 27.3, 26.7, 30.2, 25.3, 25.2, 25.1,
                24.4, 25.0]
RESNET_OURS = [35.0, 33.3, 33.7, 35.0, 36.9, 37.3, 39.2, 30.8, 25.8, 24.6, 24.8, 24.1, 24.5,
               25.3, 24.4]


def test_a_regime_change_both_systems_saw_cancels_round_by_round():
    ours, torch = summarize(RESNET_OURS), summarize(RESNET_TORCH)
    per_round = sorted(o / t for o, t in zip(RESNET_OURS, RESNET_TORCH, strict=True))
    assert spread.ratio(ours, torch) == pytest.approx(per_round[7])  # median of 15
    assert spread.ratio(ours, torch) == pytest.approx(0.980, abs=5e-4)
    # The quotient of medians depends on which regime each median fell in.
    quotients = [np.median(RESNET_OURS[k:]) / np.median(RESNET_TORCH[k:]) for k in range(3)]
    assert max(quotients) - min(quotients) > 0.07
    per_round_ratios = [spread.ratio(summarize(RESNET_OURS[k:]), summarize(RESNET_TORCH[k:]))
                        for k in range(3)]
    assert max(per_round_ratios) - min(per_round_ratios) < 0.005
    low, high = spread.ratio_interval(RESNET_OURS, RESNET_TORCH)
    assert 0.95 < low < 0.98 < high < 1.02
    apart_low, apart_high = spread.ratio_interval(RESNET_OURS, RESNET_TORCH[:-1])
    assert apart_high - apart_low > 5 * (high - low)


def test_ratio_of_cells_measured_apart_or_once_is_the_quotient_of_medians():
    apart = spread.ratio(summarize([4.0, 6.0, 5.0]), summarize([2.0, 2.5]))
    assert apart == pytest.approx(5.0 / 2.25)
    assert spread.ratio(single(3.0), single(2.0)) == pytest.approx(1.5)
    assert spread.ratio(single(3.0), single(0.0)) is None
    # paired rounds with a non-positive reference sample leave those rounds out
    skipped = spread.ratio(summarize([2.0, 9.0, 4.0]), summarize([1.0, 0.0, 2.0]))
    assert skipped == pytest.approx(2.0)
    assert spread.ratio(summarize([2.0, 3.0]), summarize([0.0, 0.0])) is None
    assert spread.paired([1.0, 2.0], [3.0, 4.0]) and not spread.paired([1.0], [2.0])
    assert not spread.paired([1.0, 2.0], [3.0, 4.0, 5.0])


def test_interval_is_deterministic_and_needs_two_samples():
    rng = np.random.default_rng(3)
    subject, reference = _drifting(rng, n=10)
    assert spread.ratio_interval(subject, reference) == spread.ratio_interval(subject, reference)
    assert spread.ratio_interval([2.0], [1.0]) is None
    assert spread.ratio_interval([2.0, 2.0, 2.0], [1.0, 1.0, 1.0]) == (2.0, 2.0)
    assert spread.ratio_interval([1.0, 1.0], [0.0, 0.0]) is None  # nothing to divide by


def test_inside_and_format():
    assert spread.inside(1.10, (1.08, 1.12)) and not spread.inside(1.15, (1.08, 1.12))
    assert not spread.inside(1.10, None)
    assert spread.format_interval((1.0812, 1.1234)) == "[1.08, 1.12]"
    assert spread.format_interval(None) == ""


def _report(subject, reference, threshold, direction="at_most") -> BenchReport:
    row = Row("launch", "us", "ref", "ours", ("ours", "ref"),
              {"ours": summarize(subject), "ref": summarize(reference)})
    workload = Workload("w", "fabricated", ("ours", "ref"), "ref",
                        (Target("ours", "ref", threshold, direction),), lambda ctx: None)
    return runner.build_report([(workload, [row], None)], [workload],
                               created="2026-01-01T00:00:00+00:00", device="Fake GPU",
                               versions={}, quick=False, elapsed_s=1.0)


@pytest.mark.parametrize("where, label", [
    (1.5, "PASS"),    # over the interval's top: the whole interval meets the bound
    (0.5, "PASS~"),   # between the median and the top
    (-0.5, "MISS~"),  # between the bottom and the median
    (-1.5, "MISS"),
])
def test_verdicts_say_when_they_were_decided_inside_the_spread(where, label):
    rng = np.random.default_rng(11)
    subject, reference = _drifting(rng, noise=0.01)
    ratio = spread.ratio(summarize(subject), summarize(reference))
    assert ratio == pytest.approx(float(np.median(np.divide(subject, reference))))
    low, high = spread.ratio_interval(subject, reference)
    assert low < ratio < high
    # ``where`` in half-widths of the interval on the ratio's side of it
    threshold = ratio + where * ((high - ratio) if where > 0 else (ratio - low))
    report = _report(subject, reference, threshold)
    (result,) = report.targets
    assert result.label == label
    assert (result.low, result.high) == (low, high) and result.ratio == pytest.approx(ratio)
    text = render_report(report)
    assert f"  {label:<5} w " in text
    assert ("~ : the target lies inside the ratio's 95% interval" in text) == label.endswith("~")
    again = BenchReport.model_validate_json(report.model_dump_json())
    assert again.targets[0].label == label


def test_at_least_targets_and_single_measurements():
    report = _report([3.0, 3.1, 2.9], [1.0, 1.0, 1.0], 2.95, direction="at_least")
    assert report.targets[0].label == "PASS~"
    single = _report([64.0], [64.0], 1.0, direction="at_least")  # a token count, read once
    (result,) = single.targets
    assert result.label == "PASS" and result.low is None and not result.within_spread


def test_table_shows_the_interval_beside_the_ratio_and_old_reports_still_render():
    rng = np.random.default_rng(5)
    report = _report(*_drifting(rng), 1.2)
    line = next(x for x in render_table(report).splitlines() if x.strip().startswith("launch"))
    low, high = spread.ratio_interval(
        report.record("w", "launch", "ours").samples, report.record("w", "launch", "ref").samples)
    ratio = report.targets[0].ratio
    assert line.rstrip().endswith(f"{ratio:.2f}x [{low:.2f}, {high:.2f}]")
    data = report.model_dump()
    for record in data["records"]:
        record.pop("samples")  # a report written before samples were kept
    for target in data["targets"]:
        for key in ("low", "high", "within_spread"):
            target.pop(key)
    old = BenchReport.model_validate(data)
    # without samples nothing is paired: the quotient of the medians
    quotient = (report.record("w", "launch", "ours").median
                / report.record("w", "launch", "ref").median)
    assert render_table(old).splitlines()[-1].rstrip().endswith(f"{quotient:.2f}x")


def test_measured_rows_keep_their_samples_round_by_round():
    rounds = MIN_ROUNDS + 1  # the warm-up round, then the floor of timed rounds
    values = {"ours": iter([2.0 + i for i in range(rounds)]),
              "ref": iter([1.0 + 0.5 * i for i in range(rounds)])}
    builder = RowBuilder("m", "s", ("ours", "ref"), "ref", "ours")
    builder.measure({name: (lambda it=it: next(it)) for name, it in values.items()},
                    repeats=3, scale=10.0, warmup=1)
    row = builder.build()
    assert row.cells["ours"].samples == tuple(10.0 * (2.0 + i) for i in range(1, rounds))
    assert row.cells["ref"].samples == tuple(10.0 * (1.0 + 0.5 * i) for i in range(1, rounds))


def test_the_host_goes_into_the_versions(tmp_path, monkeypatch):
    from cugraphrt.bench import host

    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("processor\t: 0\nmodel name\t: Intel(R) Xeon(R)  Platinum 8480+\n"
                       "processor\t: 1\nmodel name\t: Intel(R) Xeon(R)  Platinum 8480+\n")
    assert host.cpu_model(cpuinfo) == "Intel(R) Xeon(R) Platinum 8480+"
    assert host.cpu_model(tmp_path / "missing")  # falls back to platform, never empty
    assert host.describe_gpus(["NVIDIA H200", "NVIDIA H200"]) == "2x NVIDIA H200"
    assert host.describe_gpus(["H100", "A100", "H100"]) == "2x H100, 1x A100"
    assert host.describe_gpus([]) == "none"
    monkeypatch.setattr(host, "cpu_model", lambda: "Fake CPU")
    versions = runner.collect_versions()  # with or without a GPU: the cpu is named
    assert versions["cpu"] == "Fake CPU" and "python" in versions


def test_rows_measured_together_share_their_reference_samples(capsys):
    from cugraphrt.bench.spec import Failed, measure_together

    ticks = iter(range(1, 100))
    replay = RowBuilder("replay", "us", ("ours", "ref", "broken", "gone"), "ref", "ours")
    launcher = RowBuilder("launcher", "us", ("fast", "ref", "broken", "gone"), "ref", "fast")
    order: list[str] = []

    def batch(name):
        def run():
            order.append(name)
            if name == "broken":
                raise RuntimeError("no such kernel")
            return float(next(ticks))
        return run

    def no_setup():
        raise RuntimeError("set-up failed")

    batches = {name: batch(name) for name in ("ours", "ref", "fast", "broken")}
    batches["gone"] = replay.setup("gone", no_setup)  # None: its cell is in one row only
    measure_together((replay, launcher), batches, repeats=2, scale=1.0, warmup=1)
    # One rotation of every system of both rows per round, in that round's order; the
    # failed system left it in the first round.
    first = round_order(["ours", "ref", "fast", "broken"], 0)
    assert order[:4] == first
    later = [round_order(["ours", "ref", "fast"], i) for i in range(1, MIN_ROUNDS + 1)]
    assert order[4:] == [name for names in later for name in names]
    # Each system's samples are its ticks, round by round: rows share the reference's.
    ticks_of: dict[str, list[float]] = {name: [] for name in ("ours", "ref", "fast")}
    tick = 4  # the warm-up round took ticks 1-3 (the broken system raised before its own)
    for names in later:
        for name in names:
            ticks_of[name].append(float(tick))
            tick += 1
    rows = replay.build(), launcher.build()
    assert rows[0].cells["ref"].samples == rows[1].cells["ref"].samples == tuple(ticks_of["ref"])
    assert rows[0].cells["ours"].samples == tuple(ticks_of["ours"])
    assert rows[1].cells["fast"].samples == tuple(ticks_of["fast"])
    for row in rows:
        assert row.cells["broken"] == Failed("RuntimeError: no such kernel")
        assert row.cells["gone"] == Failed("RuntimeError: set-up failed")
    assert capsys.readouterr().err.count("broken failed") == 1  # one traceback, not two
