"""Host constants (stage_host_constants) without a GPU: what the capture's mode stages, what
it refuses, and how a refused host copy is recognised and explained. The staging itself (the
pinned copy and the captured memcpy) is replaced by a recorder; tests/torch/
test_host_constants_gpu.py runs it for real."""

from __future__ import annotations

import numpy
import pytest

torch = pytest.importorskip("torch")

from cugraphrt_torch.capture import _errors  # noqa: E402
from cugraphrt_torch.capture._host_constants import (  # noqa: E402
    HostConstants,
    _index_list,
    _moves_to_cuda,
)

from cugraphrt import CaptureError  # noqa: E402


@pytest.fixture
def staged(monkeypatch):
    """Replaces staging with a recorder: the 'staged' tensor stays on the CPU."""
    seen: list = []

    def stage(self, cpu):
        seen.append(cpu.detach().clone())
        return cpu

    monkeypatch.setattr(HostConstants, "_stage", stage)
    return seen


def test_factories_with_a_cuda_device_are_staged(staged):
    mode = HostConstants(capture=None, device=0)
    with mode:
        torch.tensor(0.5, device="cuda")
        torch.as_tensor([1, 2, 3], device="cuda:0")
        with pytest.warns(UserWarning, match=r"NumPy array \(float64, shape \(1,\)\)"):
            torch.as_tensor(numpy.array([4.0]), device=torch.device("cuda"))
        torch.as_tensor(numpy.array([5.0]), device="cuda")  # warned once per capture
        torch.asarray([[1, 0]], device=0, dtype=torch.int32)
        torch.tensor([7.0])  # a CPU tensor: nothing to stage
    assert [t.tolist() for t in staged] == [0.5, [1, 2, 3], [4.0], [5.0], [[1, 0]]]
    assert staged[4].dtype == torch.int32


def test_tensors_made_inside_are_constants_and_older_pageable_ones_are_refused(staged):
    older = torch.arange(3.0)
    mode = HostConstants(capture=None, device=0)
    with mode:
        grid = torch.stack(torch.meshgrid(torch.arange(2), torch.arange(3), indexing="ij"))
        moved = grid.float()[None]
        with pytest.raises(CaptureError, match=r"made before the capture \(a torch.float32 "
                                               r"tensor of shape \(3,\)\)") as info:
            older.to("cuda")
        assert "pin_memory()" in str(info.value)
        with pytest.raises(CaptureError, match="made before the capture"):
            older.cuda()
    assert mode._to_device(moved, "moved") is moved  # made inside: staged
    assert torch.equal(staged[-1], moved)
    with pytest.raises(CaptureError, match="made before the capture"):
        mode._to_device(older, "moved")


def test_index_lists_become_staged_index_tensors(staged):
    mode = HostConstants(capture=None, device=0)
    assert torch.equal(mode._index([2, 0]), torch.tensor([2, 0]))
    assert mode._index(slice(None)) == slice(None) and mode._index(3) == 3
    assert _index_list([1, True]) and _index_list([[0], [1]])
    assert not _index_list([]) and not _index_list([0.5]) and not _index_list([slice(1)])
    assert [t.tolist() for t in staged] == [[2, 0]]


def test_what_moves_to_the_device():
    t = torch.ones(2)
    assert _moves_to_cuda(torch.Tensor.to, (t, "cuda"), {})
    assert _moves_to_cuda(torch.Tensor.to, (t,), {"device": torch.device("cuda", 1)})
    assert _moves_to_cuda(torch.Tensor.to, (t, 0), {})
    assert _moves_to_cuda(torch.Tensor.cuda, (t,), {})
    assert not _moves_to_cuda(torch.Tensor.to, (t, torch.float16), {})
    assert not _moves_to_cuda(torch.Tensor.to, (t, "cpu"), {})


def test_a_refused_host_copy_is_recognised_and_names_the_option():
    torch_error = RuntimeError("Cannot copy between CPU and CUDA tensors during CUDA graph "
                               "capture unless the CPU tensor is pinned.")
    translated = _errors.capture_error(torch_error)
    assert isinstance(translated, CaptureError)
    assert "stage_host_constants=True" in str(translated)
    try:
        raise translated from torch_error
    except CaptureError as exc:
        assert _errors.is_host_copy(exc)
    assert not _errors.is_host_copy(CaptureError("operation not permitted"))


# -- mixture-of-experts models: batched_mm while captured -------------------------------------

def test_a_moe_model_runs_batched_mm_experts_while_captured_and_gets_its_own_back():
    transformers = pytest.importorskip("transformers")
    from cugraphrt_torch._internals.transformers import graph_safe_experts

    model = _tiny_mixtral(layers=2)
    own = model.get_experts_implementation()
    assert own[""] != "batched_mm"
    ids = torch.randint(0, 128, (1, 8), generator=torch.Generator().manual_seed(0))
    with torch.no_grad(), graph_safe_experts(model) as switched:
        assert switched and model.get_experts_implementation() == {"": "batched_mm"}
        inside = model(ids).logits
    assert model.get_experts_implementation() == own
    model.set_experts_implementation("batched_mm")
    with torch.no_grad():
        assert torch.equal(inside, model(ids).logits)  # what ran inside was batched_mm
    with graph_safe_experts(model) as switched:  # already graph-safe: left as it is
        assert not switched
    llama = transformers.LlamaForCausalLM(transformers.LlamaConfig(
        vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
        num_attention_heads=4, num_key_value_heads=4))
    for plain in (llama, torch.nn.Linear(2, 2)):
        with graph_safe_experts(plain) as switched:
            assert not switched
    model.set_experts_implementation(own)  # a MoE model inside a wrapper module is found
    wrapper = torch.nn.Sequential(torch.nn.Identity(), torch.nn.ModuleList([model]))
    with graph_safe_experts(wrapper) as switched:
        assert switched and model.get_experts_implementation() == {"": "batched_mm"}
    assert model.get_experts_implementation() == own


# -- mixture-of-experts models: their own experts first, batched_mm where refused ---------------

def _tiny_mixtral(layers: int = 1):
    transformers = pytest.importorskip("transformers")
    config = transformers.MixtralConfig(
        vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=layers,
        num_attention_heads=4, num_key_value_heads=2, num_local_experts=4,
        num_experts_per_tok=2, max_position_embeddings=64)
    return transformers.MixtralForCausalLM(config).eval()


def _attempts(monkeypatch, refuse):
    """capture_module's attempts, each the experts implementation it ran with; an attempt
    ``refuse(implementation)`` names is refused as a capture refuses a host read."""
    from cugraphrt_torch.inference import _warm_up

    seen = []

    def attempt(make_graph, pool, module, args, iterations):
        implementation = module.get_experts_implementation()[""] \
            if hasattr(module, "get_experts_implementation") else None
        seen.append(implementation)
        if refuse(implementation):
            raise CaptureError("`for i, end in enumerate(offs.tolist())` (moe.py:196) cannot "
                               "be captured")
        return "session", module(*args).logits if implementation else None

    monkeypatch.setattr(_warm_up, "_capture_module", attempt)
    return _warm_up, seen


def test_a_moe_model_is_captured_with_its_own_experts_where_they_capture(monkeypatch):
    import warnings

    model = _tiny_mixtral()
    own = model.get_experts_implementation()
    warm_up, seen = _attempts(monkeypatch, lambda implementation: False)
    ids = torch.randint(0, 128, (1, 8))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with torch.no_grad():
            _, logits = warm_up.capture_module(object, None, model, (ids,), 3)
    assert seen == [own[""]] and own[""] != "batched_mm"
    with torch.no_grad():
        assert torch.equal(logits, model(ids).logits)  # the model's own experts ran


def test_a_refused_moe_capture_is_made_again_with_batched_mm_and_the_family_keeps_it(
        monkeypatch):
    model = _tiny_mixtral()
    own = model.get_experts_implementation()
    warm_up, seen = _attempts(monkeypatch, lambda implementation: implementation != "batched_mm")
    ids = torch.randint(0, 128, (1, 8))
    experts = warm_up.Experts()
    with pytest.warns(UserWarning, match="captured with transformers' batched_mm experts"), \
            torch.no_grad():
        _, logits = warm_up.capture_module(object, None, model, (ids,), 3, experts)
    assert seen == [own[""], "batched_mm"] and experts.graph_safe
    assert model.get_experts_implementation() == own  # given back after the capture
    with torch.no_grad():
        _, again = warm_up.capture_module(object, None, model, (ids,), 0, experts)
    assert seen[2:] == ["batched_mm"]  # a later bucket is not refused again to learn it
    model.set_experts_implementation("batched_mm")
    with torch.no_grad():
        assert torch.equal(logits, model(ids).logits) and torch.equal(again, logits)


def test_a_refused_capture_without_experts_to_switch_raises_its_own_error(monkeypatch):
    warm_up, seen = _attempts(monkeypatch, lambda implementation: True)
    with pytest.raises(CaptureError, match="offs.tolist"):
        warm_up.capture_module(object, None, torch.nn.Linear(2, 2), (torch.ones(2),), 3)
    assert seen == [None]  # tried once: nothing to switch
