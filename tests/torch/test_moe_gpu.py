"""Mixture-of-experts models of transformers graphed whole by graph_module: captured with their
own experts (transformers' default grouped_mm keeps its offsets on the device on an H200),
or, where a capture with them is refused, with transformers' batched_mm (no routing read on
the host); gpt-oss's host constants are staged; every replay equals the model run eagerly
with the experts implementation that was captured."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import cugraphrt_torch  # noqa: E402

from tests.conftest import torch_gpu_marks  # noqa: E402

pytestmark = torch_gpu_marks(torch)

MOE = {
    "mixtral": ("Mixtral", dict(num_local_experts=4, num_experts_per_tok=2)),
    "qwen3_moe": ("Qwen3Moe", dict(num_experts=4, num_experts_per_tok=2,
                                    moe_intermediate_size=32, head_dim=16)),
    "gpt_oss": ("GptOss", dict(num_local_experts=4, num_experts_per_tok=2, head_dim=16,
                               layer_types=["sliding_attention", "full_attention"],
                               sliding_window=8)),
}


def _model(name: str):
    prefix, extra = MOE[name]
    config = getattr(transformers, f"{prefix}Config")(
        vocab_size=128, hidden_size=64, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64, **extra)
    torch.manual_seed(0)
    model = getattr(transformers, f"{prefix}ForCausalLM")(config)
    return model.to("cuda", torch.bfloat16).eval()


class Logits(torch.nn.Module):
    """The model's logits for token ids (graph_module takes tensors and returns them)."""

    def __init__(self, model) -> None:
        super().__init__()
        self.model = model

    def forward(self, ids):
        return self.model(input_ids=ids, use_cache=False).logits


def _replays_equal_eager(graphed, model, name: str) -> None:
    """Replays of fresh ids equal the model's eager logits, as its experts are set now."""
    for seed in range(3):
        fresh = torch.randint(0, 128, (2, 16), device="cuda",
                              generator=torch.Generator("cuda").manual_seed(seed))
        with torch.no_grad():
            expected = Logits(model)(fresh)
        assert torch.equal(graphed(fresh), expected), name


@pytest.mark.parametrize("name", list(MOE))
def test_a_moe_model_is_graphed_whole_with_its_own_experts_equal_to_eager(name):
    import warnings

    model = _model(name)
    own = model.get_experts_implementation()
    assert own[""] == "grouped_mm"  # transformers' default
    ids = torch.randint(0, 128, (2, 16), device="cuda")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        graphed = cugraphrt_torch.graph_module(Logits(model), ids)
    assert not [w for w in caught if "batched_mm" in str(w.message)], name  # not refused
    assert model.get_experts_implementation() == own
    _replays_equal_eager(graphed, model, name)


@pytest.mark.parametrize("name", ["mixtral", "qwen3_moe"])
def test_a_moe_model_whose_experts_read_the_host_is_graphed_with_batched_mm(name):
    """transformers' ``eager`` experts loop over the experts hit, read on the host: the capture
    with them is refused, and graph_module captures with batched_mm instead, saying so."""
    model = _model(name)
    model.set_experts_implementation("eager")
    ids = torch.randint(0, 128, (2, 16), device="cuda")
    with pytest.warns(UserWarning, match="captured with transformers' batched_mm experts"):
        graphed = cugraphrt_torch.graph_module(Logits(model), ids)
    assert model.get_experts_implementation() == {"": "eager"}  # restored after the capture
    model.set_experts_implementation("batched_mm")
    _replays_equal_eager(graphed, model, name)
