"""Causal LMs of several architectures, built from configs with random weights: the models of
the ``generate_architectures`` bench and of the Generator's architecture tests.

One size rule for all: ``layers`` decoder layers of width ``hidden`` (heads of 64, or of
``hidden // 4`` below 256), a feed-forward of ``hidden * 11 // 4``, half as many key-value
heads as heads. Each architecture keeps what sets it apart from Llama:

* ``qwen3``: per-head query/key norms;
* ``gemma3``: sliding-window layers (five of every six) beside full ones, soft-capped
  logits, scaled embeddings;
* ``mistral``: a sliding window on every layer;
* ``gemma2``: sliding and full layers alternating;
* ``mixtral``: a mixture of experts (4 experts, 2 per token);
* ``qwen3_moe``: Qwen3's attention and a mixture of experts (4 experts of width ``hidden``,
  2 per token) on every layer;
* ``gpt_oss``: alternating sliding and full layers, attention sinks, a mixture of experts.

``window`` is the sliding window, in tokens, of the architectures that have one: set below
the generated length, so that generation crosses its edge.

:func:`tensor_parallel` splits such a model over the ranks of a process group with the
model's own plan (``config.base_model_tp_plan``, what ``from_pretrained(tp_plan="auto")``
applies) and torch's parallel styles, for models built from a config (no checkpoint to
load, and no ``accelerate``, which ``tp_plan`` needs).
"""

from __future__ import annotations

from typing import Any

__all__ = ["ARCHITECTURES", "WINDOWED", "causal_lm", "tensor_parallel"]

ARCHITECTURES = ("llama", "qwen3", "gemma3", "mistral", "gemma2", "mixtral", "qwen3_moe",
                 "gpt_oss")
#: The architectures with sliding-window layers.
WINDOWED = ("gemma3", "mistral", "gemma2", "gpt_oss")


def causal_lm(arch: str, *, layers: int = 2, hidden: int = 64, vocab: int = 512,
              window: int = 8, positions: int = 1024) -> Any:
    """``arch``'s ``*ForCausalLM`` on the CPU in float32, in eval mode, seeded (the same
    weights for the same arguments); the caller moves it."""
    if arch not in ARCHITECTURES:
        raise ValueError(f"unknown architecture {arch!r}; one of {ARCHITECTURES}")
    import torch
    import transformers

    head_dim = 64 if hidden >= 256 else max(hidden // 4, 8)
    heads = hidden // head_dim
    common: dict[str, Any] = dict(
        vocab_size=vocab, hidden_size=hidden, intermediate_size=hidden * 11 // 4,
        num_hidden_layers=layers, num_attention_heads=heads,
        num_key_value_heads=max(heads // 2, 1), max_position_embeddings=positions)
    experts = dict(num_local_experts=4, num_experts_per_tok=2)
    torch.manual_seed(0)
    if arch == "llama":
        model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**common))
    elif arch == "qwen3":
        model = transformers.Qwen3ForCausalLM(transformers.Qwen3Config(head_dim=head_dim,
                                                                        **common))
    elif arch == "gemma3":
        model = transformers.Gemma3ForCausalLM(transformers.Gemma3TextConfig(
            head_dim=head_dim, sliding_window=window, **common))
    elif arch == "mistral":
        model = transformers.MistralForCausalLM(transformers.MistralConfig(
            head_dim=head_dim, sliding_window=window, **common))
    elif arch == "gemma2":
        model = transformers.Gemma2ForCausalLM(transformers.Gemma2Config(
            head_dim=head_dim, sliding_window=window, **common))
    elif arch == "mixtral":
        model = transformers.MixtralForCausalLM(transformers.MixtralConfig(
            head_dim=head_dim, **experts, **common))
    elif arch == "qwen3_moe":
        model = transformers.Qwen3MoeForCausalLM(transformers.Qwen3MoeConfig(
            head_dim=head_dim, num_experts=4, num_experts_per_tok=2,
            moe_intermediate_size=hidden, **common))
    else:
        common["intermediate_size"] = hidden  # per expert
        model = transformers.GptOssForCausalLM(transformers.GptOssConfig(
            head_dim=head_dim, sliding_window=window, **experts, **common))
    return model.eval()


#: transformers' plan entries and what they mean for inference. "replicated_with_grad_allreduce"
#: (Qwen3's per-head norms) only all-reduces gradients: for inference the module stays as it is.
_STYLES = ("colwise", "rowwise", "replicated_with_grad_allreduce")


def tensor_parallel(model: Any, mesh: Any) -> Any:
    """``model`` with its decoder split over ``mesh`` (a 1-D ``DeviceMesh``) by its own tensor
    parallel plan: column-parallel query, key, value, gate and up projections and
    row-parallel output and down projections (one all-reduce after attention and one after
    the MLP of each layer); embeddings, norms and the head stay whole on every rank. Every
    rank must build the same weights first (``causal_lm`` seeds them). Returns the model."""
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        RowwiseParallel,
        parallelize_module,
    )

    plan = dict(getattr(model.config, "base_model_tp_plan", None) or {})
    unknown = sorted({style for style in plan.values() if style not in _STYLES})
    if not plan or unknown:
        raise ValueError(f"{type(model).__name__}: no tensor-parallel plan this helper applies "
                         f"(got {plan or 'none'}; styles it knows: {_STYLES})")
    heads = model.config.num_key_value_heads
    if heads % mesh.size():
        raise ValueError(f"{type(model).__name__}: {heads} key-value heads do not split over "
                         f"{mesh.size()} ranks")
    styles = {"colwise": ColwiseParallel, "rowwise": RowwiseParallel}
    parallelize_module(model.model, mesh, {name: styles[style]() for name, style in plan.items()
                                           if style in styles})
    return model
