"""Mixture-of-experts models of transformers graphed whole by graph_module: their experts run
transformers' batched_mm while captured (no routing read on the host), gpt-oss's host
constants are staged, and every replay equals the model run eagerly with the same experts
implementation."""

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


@pytest.mark.parametrize("name", list(MOE))
def test_a_moe_model_is_graphed_whole_equal_to_eager_batched_mm(name):
    model = _model(name)
    own = model.get_experts_implementation()
    ids = torch.randint(0, 128, (2, 16), device="cuda")
    graphed = cugraphrt_torch.graph_module(Logits(model), ids)
    assert model.get_experts_implementation() == own  # restored after the capture
    model.set_experts_implementation("batched_mm")
    for seed in range(3):
        fresh = torch.randint(0, 128, (2, 16), device="cuda",
                              generator=torch.Generator("cuda").manual_seed(seed))
        with torch.no_grad():
            expected = Logits(model)(fresh)
        assert torch.equal(graphed(fresh), expected), name
