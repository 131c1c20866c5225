"""The zoo's catalog and comparison without a GPU: tiny transformers configs build and run on
the CPU for one architecture of each kind, outputs flatten in a fixed order, and a comparison
names how outputs differ."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from cugraphrt.bench import workloads_zoo, zoo_models  # noqa: E402

KINDS = {"llama": "tokens", "mixtral": "tokens", "bert": "tokens", "t5": "seq2seq",
         "vit": "pixels", "swin": "pixels", "whisper": "speech", "wav2vec2": "audio",
         "clip": "text+pixels"}


@pytest.mark.parametrize("model_type", list(KINDS))
def test_tiny_configs_build_and_run(model_type):
    auto = next(a for t, a, _ in zoo_models._HF if t == model_type)
    config = zoo_models._tiny_config(model_type)
    model = getattr(transformers, auto).from_config(config).eval()
    ids = torch.randint(3, 256, (1, 16))
    pixels = torch.rand(1, 3, zoo_models.PIXELS, zoo_models.PIXELS)
    kind = KINDS[model_type]
    with torch.no_grad():
        if kind == "tokens":
            out = model(input_ids=ids)
        elif kind == "seq2seq":
            out = model(input_ids=ids, decoder_input_ids=ids[:, :8], use_cache=False)
        elif kind == "pixels":
            out = model(pixel_values=pixels)
        elif kind == "speech":
            out = model(input_features=torch.rand(1, config.num_mel_bins,
                                                  2 * config.max_source_positions),
                        decoder_input_ids=ids[:, :4], use_cache=False)
        elif kind == "audio":
            out = model(input_values=torch.rand(1, 4000))
        else:
            out = model(input_ids=ids, pixel_values=pixels)
    tensors = zoo_models.flatten_outputs(torch, out)
    assert tensors and all(isinstance(t, torch.Tensor) for t in tensors)
    assert sum(p.numel() for p in model.parameters()) < 5_000_000  # tiny indeed


def test_catalog_and_filter():
    hf = zoo_models.transformers_models()
    assert len(hf) >= 30 and len({m.name for m in hf}) == len(hf)
    assert {"mixtral", "qwen3_moe", "gpt_oss", "falcon", "bloom"} <= {m.name for m in hf}
    assert {m.family for m in hf} >= {"transformers tokens", "transformers seq2seq",
                                      "transformers pixels", "transformers speech"}


def test_outputs_flatten_in_key_order_and_compare_names_the_difference():
    a, b = torch.ones(2), torch.zeros(3)
    assert zoo_models.flatten_outputs(torch, {"z": a, "a": [b, (a,)]}) == (b, a, a)
    assert workloads_zoo._compare(torch, (a, b), (a.clone(), b.clone())) is True
    # within float32 rounding (transformers' other path under capture): equal, not to the bit
    assert workloads_zoo._compare(torch, (a + 1e-7, b), (a, b)) is False
    with pytest.raises(RuntimeError, match=r"largest difference 0\.5"):
        workloads_zoo._compare(torch, (a,), (a - 0.5,))
    with pytest.raises(RuntimeError, match=r"shape \(3,\), eager's \(2,\)"):
        workloads_zoo._compare(torch, (b,), (a,))
    with pytest.raises(RuntimeError, match="2 outputs, eager has 1"):
        workloads_zoo._compare(torch, (a, b), (a,))


def _stand_ins(monkeypatch) -> None:
    """Two stand-in models, the captures replaced (no GPU here): one every system graphs,
    one graph_module cannot take whole but takes in pieces."""

    def build(torch):
        return torch.nn.Linear(4, 4), (torch.ones(2, 4),)

    models = [zoo_models.ZooModel("fake family", "fine", build),
              zoo_models.ZooModel("fake family", "hostread", build)]
    monkeypatch.setattr(workloads_zoo, "zoo_models", lambda families=None: models)
    monkeypatch.setattr(workloads_zoo, "missing_package", lambda *names: None)
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: None)
    seen = []

    def whole(torch, module, inputs, fresh):
        seen.append(len(seen))
        if len(seen) == 2:  # the second model
            raise RuntimeError("`float(y.sum())` cannot be captured")
        return tuple(t.clone() for t in zoo_models.flatten_outputs(torch, module(*fresh)))

    monkeypatch.setattr(workloads_zoo, "_torch_graph", lambda torch, m, i, f: tuple(
        zoo_models.flatten_outputs(torch, m(*f))))
    monkeypatch.setattr(workloads_zoo, "_whole", whole)
    class Pieces:  # half its pieces graphed
        def __init__(self, module):
            self.module = module

        def __call__(self, *args):
            return self.module(*args)

        def graphed_fraction(self):
            return 0.5

        def report(self):
            from cugraphrt_torch.compile._aot_graph import AotGraphReport

            common = dict(compiler="aot_eager", rerecords=0, static_inputs=(),
                          copied_inputs=(), mutated_inputs=())
            return [AotGraphReport(name="graph 0 inference", graphed=True, reason=None,
                                   graphs=1, replays=3, **common),
                    AotGraphReport(name="graph 1 inference", graphed=False,
                                   reason="the capture failed: a host read", graphs=0,
                                   replays=0, **common)]

    monkeypatch.setattr(workloads_zoo, "_pieces", lambda torch, m, i, f: (
        Pieces(m), zoo_models.flatten_outputs(torch, m(*f))))
    monkeypatch.setattr(workloads_zoo, "_graphed_share", lambda torch, call: (call(), 0.75)[1])


def test_the_zoo_counts_what_each_system_graphed_and_says_why_not(monkeypatch, capsys):
    from cugraphrt.bench.spec import Context, Failed
    from cugraphrt.bench.timing import Summary

    _stand_ins(monkeypatch)
    ctx = Context(selected=True)
    workloads_zoo.run_zoo(ctx)
    log = capsys.readouterr().err  # each piece of the model in pieces, and why not graphed
    assert "zoo: fake family: hostread: graph 0 inference: graphed, 3 replays" in log
    assert ("zoo: fake family: hostread: graph 1 inference: not graphed (the capture "
            "failed: a host read)") in log
    assert "fake family: fine: graph" not in log
    assert torch.is_grad_enabled()  # the zoo leaves autograd as it found it
    rows = {row.metric: row.cells for row in ctx.rows}
    fine, hostread = rows["fake family: fine"], rows["fake family: hostread"]
    assert all(isinstance(fine[s], Summary) and fine[s].median == 1.0
               for s in workloads_zoo.SYSTEMS)
    assert isinstance(hostread["cugraphrt"], Failed)
    assert "cannot be captured" in hostread["cugraphrt"].message
    assert hostread["cugraphrt_pieces"].median == 0.5  # the fraction of pieces graphed
    share = rows["fake family: hostread" + workloads_zoo.SHARE]  # in pieces only
    assert share["cugraphrt_pieces"].median == 0.75
    assert all(not isinstance(share[s], Summary) for s in workloads_zoo.SYSTEMS[:3])
    assert "fake family: fine" + workloads_zoo.SHARE not in rows
    total = rows[workloads_zoo.TOTAL]
    assert [total[s].median for s in workloads_zoo.SYSTEMS] == [2.0, 2.0, 1.0, 2.0]
    bits = rows[workloads_zoo.BITS]  # the stand-ins run eager's own kernels: equal to the bit
    assert [bits[s].median for s in workloads_zoo.SYSTEMS] == [2.0, 2.0, 1.0, 2.0]


def test_a_trace_that_ties_no_kernel_to_the_replays_is_an_error_not_a_zero(monkeypatch):
    from cugraphrt.bench.spec import Context, Failed

    _stand_ins(monkeypatch)
    monkeypatch.setattr(workloads_zoo, "_graphed_share", lambda torch, call: 0.0)
    ctx = Context(selected=True)
    workloads_zoo.run_zoo(ctx)
    rows = {row.metric: row.cells for row in ctx.rows}
    cell = rows["fake family: hostread" + workloads_zoo.SHARE]["cugraphrt_pieces"]
    assert isinstance(cell, Failed) and "no kernel to a graph launch" in cell.message
    assert rows["fake family: hostread"]["cugraphrt_pieces"].median == 0.5  # still counted


def test_the_graphed_share_counts_the_kernels_of_graph_launches_by_correlation():
    """A Chrome trace as torch's profiler writes it: two kernels of one cudaGraphLaunch, one
    of a cudaLaunchKernel, one of a cuGraphLaunch through the driver, one whose launch the
    trace lacks (counted as not graphed)."""
    events = [
        {"cat": "cuda_runtime", "name": "cudaGraphLaunch", "args": {"correlation": 1}},
        {"cat": "cuda_runtime", "name": "cudaLaunchKernel", "args": {"correlation": 2}},
        {"cat": "cuda_driver", "name": "cuGraphLaunch", "args": {"correlation": 3}},
        {"cat": "cpu_op", "name": "aten::mm", "args": {}},
        {"cat": "kernel", "name": "a", "dur": 10.0, "args": {"correlation": 1}},
        {"cat": "kernel", "name": "b", "dur": 20.0, "args": {"correlation": 1}},
        {"cat": "kernel", "name": "c", "dur": 40.0, "args": {"correlation": 2}},
        {"cat": "kernel", "name": "d", "dur": 10.0, "args": {"correlation": 3}},
        {"cat": "kernel", "name": "e", "dur": 20.0, "args": {"correlation": 9}},
    ]
    assert workloads_zoo.graphed_share(events) == pytest.approx(40.0 / 100.0)
    with pytest.raises(RuntimeError, match="no kernel"):
        workloads_zoo.graphed_share(events[:4])


def test_the_coverage_page_counts_families_and_gives_each_failures_reason(monkeypatch):
    """A zoo run (the stand-ins above) through the runner's report, rendered as
    docs/coverage.md renders it."""
    from cugraphrt.bench import coverage, runner

    _stand_ins(monkeypatch)
    monkeypatch.setattr(runner, "device_name", lambda: "a test device")
    monkeypatch.setattr(runner, "_settle", lambda: None)
    report = runner.run_workloads((workloads_zoo.ZOO,), quick=False,
                                  named=frozenset({"zoo"}))
    page = coverage.render(report)
    assert "| fake family | 2 | 2 | 1 | 2 |" in page and page.count("| total |") == 1
    assert "- `hostread`: in pieces (50% of its pieces graphed, 75% of its kernel time in " \
           "graphs); whole: RuntimeError: " \
           "`float(y.sum())` cannot be captured" in page
    assert "`fine`" not in page  # graphed whole: not listed
    assert "Equal to eager bit for bit: runs eagerly 2, torch.cuda.graph 2, graph_module " \
           "whole 1, whole or in pieces 2." in page
    assert "- `cugraphrt` / `eager` = 0.500 (>= 0.90): MISS" in page
    with pytest.raises(ValueError, match="no zoo rows"):
        coverage.render(report.model_copy(update={"rows": []}))
