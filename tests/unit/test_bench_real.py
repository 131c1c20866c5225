"""The real-model workloads without a GPU: ``--real`` selection, clean n/a rows where a package
or the GPU is missing, ``--quick`` skips, target lines and plot rows on fabricated numbers, and
the training check (losses, BatchNorm statistics) on CPU modules."""

from __future__ import annotations

import copy

import pytest

from cugraphrt.bench import runner, workloads_real, workloads_real_train
from cugraphrt.bench.real_models import equal_steps, missing_package
from cugraphrt.bench.render import plot_rows, render_report, render_table
from cugraphrt.bench.spec import (
    Context,
    Failed,
    NotAvailable,
    RowBuilder,
    SystemUnavailable,
    Target,
    Workload,
)
from cugraphrt.bench.timing import Summary
from tests.conftest import NO_GPU_REASON

TORCH_REAL = ("real_resnet50", "real_resnet18", "real_llama")


def _workload(name: str) -> Workload:
    return next(w for w in runner.WORKLOADS if w.name == name)


def _run(name: str, *, quick: bool = True, selected: bool = False) -> list:
    ctx = Context(quick=quick, selected=selected)
    _workload(name).run(ctx)
    return ctx.rows


# -- selection -----------------------------------------------------------------------------


def test_real_workloads_are_registered_last_and_named_by_real():
    assert runner.REAL_NAMES == ("real_resnet50", "real_resnet18", "real_llama", "real_cg")
    assert [w.name for w in runner.WORKLOADS][-4:] == list(runner.REAL_NAMES)
    assert len({w.name for w in runner.WORKLOADS}) == len(runner.WORKLOADS)


@pytest.mark.parametrize("argv, named", [
    ([], frozenset()),
    (["--real"], frozenset(runner.REAL_NAMES)),
    (["--real", "--only", "replay"], frozenset(runner.REAL_NAMES) | {"replay"}),
    (["--only", "real_cg"], frozenset({"real_cg"})),
])
def test_selected_names(argv, named):
    assert runner.selected_names(runner.parse_args(argv)) == named


@pytest.fixture
def fake_real(monkeypatch):
    """Fake workloads, two of them 'real'; each records what its Context said."""
    seen: dict[str, tuple[bool, bool]] = {}

    def workload(name: str) -> Workload:
        def run(ctx: Context) -> None:
            seen[name] = (ctx.quick, ctx.selected)
            row = RowBuilder("m", "us", ("ours", "ref"), "ref", "ours")
            row.set("ours", Summary(1.0, 1.0, 1.0, 3))
            row.set("ref", Summary(1.0, 1.0, 1.0, 3))
            ctx.emit(row.build())
        return Workload(name, name, ("ours", "ref"), "ref", (Target("ours", "ref", 1.05),), run)

    monkeypatch.setattr(runner, "WORKLOADS", tuple(map(workload, ("plain", "r1", "r2"))))
    monkeypatch.setattr(runner, "REAL_NAMES", ("r1", "r2"))
    monkeypatch.setattr(runner, "gpu_unavailable_reason", lambda: None)
    monkeypatch.setattr(runner, "device_name", lambda: "Fake GPU (sm_90)")
    return seen


def test_real_runs_only_the_real_workloads_and_marks_them_selected(fake_real, capsys):
    assert runner.main(["--real", "--quick", "--no-progress"]) == 0
    assert fake_real == {"r1": (True, True), "r2": (True, True)}
    out = capsys.readouterr().out
    assert "PASS  r1" in out and "PASS  r2" in out and "plain" not in out


def test_a_plain_quick_run_runs_everything_unselected(fake_real, capsys):
    assert runner.main(["--quick", "--no-progress"]) == 0
    assert fake_real == {name: (True, False) for name in ("plain", "r1", "r2")}


def test_real_with_only_adds_the_named_workload(fake_real, capsys):
    assert runner.main(["--real", "--only", "plain", "--no-progress"]) == 0
    assert fake_real == {name: (False, True) for name in ("plain", "r1", "r2")}


# -- n/a without packages, GPU, or in --quick ----------------------------------------------


def _assert_all_na(rows, reason: str) -> None:
    assert rows
    for row in rows:
        assert set(row.cells) == set(row.systems)
        assert all(cell == NotAvailable(reason) for cell in row.cells.values()), row.cells


@pytest.mark.parametrize("name, package", [
    ("real_resnet50", "torchvision"), ("real_resnet18", "torchvision"),
    ("real_llama", "transformers")])
def test_missing_package_makes_every_cell_na(monkeypatch, name, package):
    monkeypatch.setattr(workloads_real, "missing_package",
                        lambda *names: f"{package} not installed" if package in names else None)
    rows = _run(name, selected=True)
    _assert_all_na(rows, f"{package} not installed")
    workload = _workload(name)
    report = runner.build_report([(workload, rows, None)], [workload], created="t",
                                 device="d", versions={}, quick=True, elapsed_s=1.0)
    assert not report.failed
    assert {t.status for t in report.targets} == {"N/A"}
    assert f"n/a ({package} not installed)" in render_table(report)


@pytest.mark.parametrize("name", TORCH_REAL)
def test_without_a_cuda_torch_every_cell_is_na(monkeypatch, name):
    def no_cuda():
        raise SystemUnavailable("torch 2.13.0+cpu has no CUDA device")

    monkeypatch.setattr(workloads_real, "missing_package", lambda *names: None)
    monkeypatch.setattr(workloads_real, "torch_module", no_cuda)
    _assert_all_na(_run(name, selected=True), "torch 2.13.0+cpu has no CUDA device")


@pytest.mark.skipif(NO_GPU_REASON is None, reason="a GPU is present (the GPU tests run these)")
@pytest.mark.parametrize("name", TORCH_REAL)
def test_this_machine_gives_na_rows_not_crashes(name):
    # Whatever is missing here (a package, the GPU), the rows come back n/a, never an error.
    for row in _run(name, quick=False):
        assert all(isinstance(cell, NotAvailable) for cell in row.cells.values()), row.cells


@pytest.mark.parametrize("name, in_quick", [
    ("real_resnet50", True), ("real_resnet18", False), ("real_llama", False)])
def test_quick_skips_the_slow_ones_unless_selected(monkeypatch, name, in_quick):
    reached = []

    def no_cuda():
        reached.append(name)
        raise SystemUnavailable("no CUDA device")

    monkeypatch.setattr(workloads_real, "missing_package", lambda *names: None)
    monkeypatch.setattr(workloads_real, "torch_module", no_cuda)
    rows = _run(name, quick=True, selected=False)
    if in_quick:
        _assert_all_na(rows, "no CUDA device")
    else:
        _assert_all_na(rows, "skipped in --quick (run --real)")
        assert not reached
    _assert_all_na(_run(name, quick=True, selected=True), "no CUDA device")


def test_missing_package_names_the_first_absent_one():
    assert missing_package("pytest", "no_such_package_xyz", "other_absent_abc") == \
        "no_such_package_xyz not installed"
    assert missing_package("pytest") is None


def test_equal_steps_counts_leading_decode_steps_after_the_prefill():
    assert equal_steps([5, 1, 2, 3], [5, 1, 2, 3]) == 3
    assert equal_steps([5, 1, 9, 3], [5, 1, 2, 3]) == 1
    assert equal_steps([5, 9, 2, 3], [5, 1, 2, 3]) == 0
    with pytest.raises(ValueError):
        equal_steps([5, 1], [5, 1, 2])


# -- targets and plot on fabricated numbers ------------------------------------------------


def _summary(value: float) -> Summary:
    return Summary(value, value * 0.99, value * 1.01, 10)


def _fabricated_rows(workload: Workload, values: dict[str, dict[str, float]]):
    rows = []
    for metric, cells in values.items():
        systems = tuple(cells)
        reference = workload.reference if workload.reference in systems else systems[0]
        row = RowBuilder(metric, "us", systems, reference, "cugraphrt_torch")
        for system, value in cells.items():
            row.set(system, _summary(value))
        rows.append(row.build())
    return rows


def test_real_targets_render_pass_and_miss_lines():
    resnet = _workload("real_resnet50")
    llama = _workload("real_llama")
    train = _workload("real_resnet18")
    results = [
        (resnet, _fabricated_rows(resnet, {
            "per call fp16 b8": {"torch_eager": 5270, "torch_graph": 1141,
                                 "cugraphrt_torch": 1135, "gpu_floor": 1120},
            "capture + warm-ups": {"torch_graph": 60.0, "cugraphrt_torch": 45.0},
            "pool reserved": {"torch_graph": 90.0, "cugraphrt_torch": 88.0}}), None),
        (llama, _fabricated_rows(llama, {
            "per call decode step": {"torch_eager": 24800, "torch_graph": 1531,
                                     "cugraphrt_torch": 1700, "gpu_floor": 1500},
            "capture + warm-ups": {"torch_graph": 120.0, "cugraphrt_torch": 110.0}}), None),
        (train, _fabricated_rows(train, {
            "per call train step b32": {"torch_eager": 6000, "torch_graphed": 3132,
                                        "cugraphrt_torch": 3137}}), None),
    ]
    report = runner.build_report(results, [w for w, _, _ in results], created="t",
                                 device="NVIDIA H100 (sm_90)", versions={}, quick=False,
                                 elapsed_s=60.0)
    lines = render_report(report).splitlines()

    def line(status: str, workload: str, metric: str) -> str:
        found = [x for x in lines if x.split()[:2] == [status, workload]
                 and x.endswith(f"[{metric}]")]
        assert len(found) == 1, (status, workload, metric, lines)
        return found[0]

    # Fabricated cells are single values: their verdicts say so where an interval would be.
    assert "cugraphrt_torch / torch_graph = 0.995x [one measurement] (target <= 1.05x)" in line(
        "PASS", "real_resnet50", "per call fp16 b8")
    assert "= 0.750x [one measurement] (target <= 1.05x)" in line(
        "PASS", "real_resnet50", "capture + warm-ups")
    assert "= 1.110x [one measurement] (target <= 1.05x)" in line(
        "MISS", "real_llama", "per call decode step")
    assert "cugraphrt_torch / torch_graphed = 1.002x" in line(
        "PASS", "real_resnet18", "per call train step b32")
    # The memory row has no target; only the named rows get verdicts (ResNet-18's capture
    # row was not fabricated: its target reads N/A).
    assert len(report.targets) == 6
    assert [t.status for t in report.targets if t.workload == "real_resnet18"] == ["PASS", "N/A"]
    assert all(t.metric != "pool reserved" for t in report.targets)


def test_plot_shows_the_real_rows_but_not_rows_without_a_ratio():
    train = _workload("real_resnet18")
    rows = _fabricated_rows(train, {
        "per call train step b32": {"torch_eager": 6000, "torch_graphed": 3132,
                                    "cugraphrt_torch": 3137}})
    agreement = RowBuilder("loss vs eager", "rel", ("torch_eager", "torch_graphed",
                                                    "cugraphrt_torch"), "torch_eager",
                           "cugraphrt_torch")
    for system, value in (("torch_eager", 0.0), ("torch_graphed", 0.0),
                          ("cugraphrt_torch", 0.0)):
        agreement.set(system, Summary(value, value, value, 1))
    report = runner.build_report([(train, [*rows, agreement.build()], None)], [train],
                                 created="t", device="d", versions={}, quick=False,
                                 elapsed_s=1.0)
    assert [(r.workload, r.metric) for r in plot_rows(report)] == [
        ("real_resnet18", "per call train step b32")]


# -- the training check on CPU modules -----------------------------------------------------


def _small_net(torch):
    torch.manual_seed(0)
    nn = torch.nn
    return nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(),
                         nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 10))


def test_training_check_times_agreeing_systems_and_fails_a_wrong_one(capsys):
    torch = pytest.importorskip("torch")
    base = _small_net(torch)
    generator = torch.Generator().manual_seed(1)
    batches = [(torch.randn(4, 3, 8, 8, generator=generator),
                torch.randint(0, 10, (4,), generator=generator))
               for _ in range(workloads_real_train.CHECK_STEPS)]
    drifted = copy.deepcopy(base)
    with torch.no_grad():
        drifted(batches[0][0] * 3)  # a warm-up that moves the BatchNorm running statistics
    wrong = copy.deepcopy(base)
    with torch.no_grad():
        wrong[-1].weight.mul_(1.5)
    trainers = {system: workloads_real_train._Trainer(torch, module) for system, module in
                (("torch_eager", copy.deepcopy(base)), ("torch_graphed", drifted),
                 ("cugraphrt_torch", wrong))}
    rows = workloads_real.rows_of({
        workloads_real_train.STEP_METRIC: ("us", workloads_real_train.SYSTEMS, "torch_graphed"),
        workloads_real_train.LOSS: ("rel", workloads_real_train.SYSTEMS[:3], "torch_eager"),
        workloads_real_train.STATS: ("abs", workloads_real_train.SYSTEMS[:3], "torch_eager"),
    }, "cugraphrt_torch")
    timed = workloads_real_train._checked(torch, rows, trainers, batches)
    assert set(timed) == {"torch_eager", "torch_graphed"}
    loss = rows[workloads_real_train.LOSS].build().cells
    stats = rows[workloads_real_train.STATS].build().cells
    assert loss["torch_eager"].median == 0.0 and stats["torch_eager"].median == 0.0
    # Same weights, same batches: equal losses; the warm-up shows in the statistics only.
    assert loss["torch_graphed"].median == 0.0
    assert stats["torch_graphed"].median > 1e-3
    assert loss["cugraphrt_torch"].median > workloads_real_train.LOSS_TOL
    step = rows[workloads_real_train.STEP_METRIC].build().cells
    assert isinstance(step["cugraphrt_torch"], Failed)
    assert "losses differ from eager's" in step["cugraphrt_torch"].message
    assert "cugraphrt_torch failed" in capsys.readouterr().err


# -- the Llama decode step on CPU (where transformers is installed) ------------------------


def test_llama_decoder_greedy_tokens_match_a_full_sequence_reference():
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from cugraphrt.bench.real_models import LlamaDecoder

    decoder = LlamaDecoder(torch, 5, layers=2, device="cpu")
    with torch.no_grad():
        tokens, seconds = decoder.generate(decoder.step)
        # Independent of the StaticCache: the whole sequence again at every step.
        sequence, expected = decoder.prompt, []
        for _ in range(6):
            logits = decoder.model(input_ids=sequence, use_cache=False).logits
            token = logits[:, -1].argmax(-1, keepdim=True)
            expected.append(int(token))
            sequence = torch.cat([sequence, token], 1)
        again, _ = decoder.generate(decoder.step)  # the cache resets between runs
    assert tokens == expected == again
    assert seconds > 0
    token, position = decoder.step_args(2)
    assert token.shape == (1, 1) and int(position) == decoder.prompt.shape[1] + 2
