"""The moe_step bench's rows without a GPU: a tiny Qwen3-MoE's decode and prefill steps through
the workload's own row logic, the graph and the compiled systems replaced by stand-ins (no
capture here), each checked against eager with batched_mm experts before it is timed."""

from __future__ import annotations

import copy
import functools

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from cugraphrt.bench import workloads_moe as moe  # noqa: E402
from cugraphrt.bench.generate_models import causal_lm  # noqa: E402
from cugraphrt.bench.spec import Failed, NotAvailable, RowBuilder  # noqa: E402
from cugraphrt.bench.timing import Summary, host_batch  # noqa: E402


def _steps(monkeypatch, graph):
    """The decode and prefill modules of a tiny Qwen3-MoE (default experts, and a copy with
    batched_mm), inputs for each, with ``graph(module, sample)`` standing in for
    graph_module and the compiled systems run eagerly."""
    monkeypatch.setattr(moe, "host_batch", functools.partial(host_batch, sync=lambda: None))
    monkeypatch.setattr(moe, "_compiled", lambda torch, module, sample: module)
    monkeypatch.setattr(moe, "_adapter", lambda: type("Adapter", (), {
        "graph_module": staticmethod(graph)}))
    monkeypatch.setattr(moe, "REPEATS", 3)
    model = causal_lm("qwen3_moe", layers=2, hidden=64, vocab=512, positions=256)
    batched = copy.deepcopy(model)
    batched.set_experts_implementation(
        dict.fromkeys(model.get_experts_implementation(), "batched_mm"))
    cache = transformers.StaticCache(config=model.config, max_cache_len=128)
    own = moe._step_modules(torch, model, cache)
    reference = moe._step_modules(torch, batched, cache)
    position = torch.tensor([64])
    inputs = ([(torch.randint(0, 512, (8, 1)), position.clone()) for _ in range(3)],
              [(torch.randint(0, 512, (1, 64)),) for _ in range(3)])
    return own, reference, inputs, cache


def _row(step: str) -> RowBuilder:
    return RowBuilder(step, "us", moe.SYSTEMS, "eager", "cugraphrt")


def test_each_step_times_every_system_after_checking_it(monkeypatch):
    own, reference, inputs, cache = _steps(monkeypatch, lambda module, sample: module)
    rows = [_row(step) for step in moe.STEPS]
    rewinds = []

    def rewind():  # the cache's own write counter stays inside its 128 positions
        rewinds.append(int(cache.layers[0].cumulative_length))
        cache.reset()

    with torch.no_grad():
        for index, row in enumerate(rows):
            moe._step(torch, own[index], reference[index], inputs[index], row,
                      compile_too=index == 0, rewind=rewind)
    assert max(rewinds) == moe.ROTATION  # a batch of steps at most between two rewinds
    decode, prefill = (row.row.cells for row in rows)
    assert all(isinstance(decode[s], Summary) and decode[s].median > 0 for s in moe.SYSTEMS)
    assert all(isinstance(prefill[s], Summary) for s in
               ("eager", "eager_batched_mm", "cugraphrt"))
    assert all(isinstance(prefill[s], NotAvailable)
               for s in ("reduce_overhead", "reduce_overhead_batched_mm"))


def test_a_system_whose_logits_differ_is_an_error_and_is_not_timed(monkeypatch):
    def stale(module, sample):  # a graph that replays its sample's logits, whatever comes in
        out = module(*sample)
        return lambda *args: out

    own, reference, inputs, cache = _steps(monkeypatch, stale)
    row = _row(moe.STEPS[1])
    with torch.no_grad():
        moe._step(torch, own[1], reference[1], inputs[1], row, compile_too=False,
                  rewind=cache.reset)
    cell = row.row.cells["cugraphrt"]
    assert isinstance(cell, Failed) and "cugraphrt" in cell.message
    assert isinstance(row.row.cells["eager"], Summary)


def test_the_two_steps_compute_what_the_model_computes():
    model = causal_lm("mixtral", layers=2, hidden=64, vocab=512, positions=256)
    cache = transformers.StaticCache(config=model.config, max_cache_len=32)
    decode, prefill = moe._step_modules(torch, model, cache)
    assert not decode.training and not prefill.training
    ids = torch.randint(0, 512, (1, 16))
    with torch.no_grad():
        assert torch.equal(prefill(ids), model(input_ids=ids, use_cache=False).logits)
        tokens, position = torch.randint(0, 512, (4, 1)), torch.tensor([5])
        got = decode(tokens, position)
        cache.reset()
        want = model(input_ids=tokens, past_key_values=cache, cache_position=position,
                     use_cache=True).logits
    assert torch.equal(got, want)


def test_the_compiled_systems_count_the_cuda_graphs_inductor_skipped(monkeypatch):
    own, reference, inputs, cache = _steps(monkeypatch, lambda module, sample: module)

    def compiled(torch, module, sample):  # the default experts' step skipped one graph
        def call(*args):
            return module(*args)
        call.graph_skips = 1 if module is own[0] else 0
        return call

    monkeypatch.setattr(moe, "_compiled", compiled)
    row, skips = _row(moe.STEPS[0]), RowBuilder("skips", "graphs", moe.SYSTEMS,
                                                "reduce_overhead", "reduce_overhead_batched_mm")
    with torch.no_grad():
        moe._step(torch, own[0], reference[0], inputs[0], row, compile_too=True,
                  rewind=cache.reset, skips=skips)
    cells = skips.row.cells
    assert cells["reduce_overhead"].median == 1 and cells["reduce_overhead_batched_mm"].median == 0
    assert all(isinstance(cells[s], NotAvailable) for s in ("eager", "eager_batched_mm",
                                                             "cugraphrt"))


def test_inductors_count_of_skipped_cuda_graphs_moves_when_it_runs_without_them():
    """On the CPU there are no CUDA graphs: reduce-overhead runs its graph without them, and
    the counter the bench reads says so (its only other sign is a log off by default)."""
    before = moe._inductor_skips()
    step = torch.compile(lambda x: (x * 2).sin() + 1, mode="reduce-overhead")
    for _ in range(3):
        step(torch.randn(8))
    assert before is not None and moe._inductor_skips() > before
