"""The zoo's models: every torchvision family and tiny transformers architectures, each with a
sample input, built with random weights (nothing is downloaded).

A :class:`ZooModel` builds its module and its inputs on demand; ``module(*inputs)`` is what
the zoo graphs. Models whose forward takes lists or keyword arguments are wrapped in a module
that takes tensors and returns a tuple of tensors (``_Outputs``), so that every system graphs
the same call. A model that cannot be built or run eagerly on this machine is reported as such
by the zoo, with the reason, and left out of its counts.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

__all__ = ["ZooModel", "zoo_models", "torchvision_models", "transformers_models",
           "flatten_outputs"]


@dataclasses.dataclass(frozen=True)
class ZooModel:
    """One model of the zoo: ``family`` (e.g. ``"torchvision classification"``), ``name``,
    and ``build(torch) -> (module, inputs)`` on the CUDA device, inputs a tuple of tensors."""

    family: str
    name: str
    build: Callable[[Any], tuple[Any, tuple]]


def flatten_outputs(torch, value: Any) -> tuple:
    """The tensors of a nested output (dicts in key order, lists, tuples, model outputs)."""
    if isinstance(value, torch.Tensor):
        return (value,)
    if hasattr(value, "to_tuple"):  # transformers' ModelOutput
        value = value.to_tuple()
    if isinstance(value, dict):
        value = [value[k] for k in sorted(value)]
    if isinstance(value, (list, tuple)):
        return tuple(t for item in value for t in flatten_outputs(torch, item))
    return ()


def _outputs_module(torch, inner, call: Callable[..., Any]):
    class _Outputs(torch.nn.Module):
        """``call(inner, *tensors)``, its tensors as a flat tuple."""

        def __init__(self) -> None:
            super().__init__()
            self.inner = inner

        def forward(self, *tensors):
            return flatten_outputs(torch, call(self.inner, *tensors))

    return _Outputs()


def zoo_models(families: str | None = None) -> list[ZooModel]:
    """Every model of the zoo, or those whose family contains one of the comma-separated
    ``families`` (``"transformers"``, ``"torchvision detection,optical"``)."""
    models = torchvision_models() + transformers_models()
    if not families:
        return models
    wanted = [f.strip() for f in families.split(",") if f.strip()]
    return [m for m in models if any(w in m.family for w in wanted)]


# -- torchvision ---------------------------------------------------------------------------

_TV_FAMILIES = {
    "classification": ("", (1, 3, 224, 224)),
    "segmentation": ("segmentation", (1, 3, 224, 224)),
    "video": ("video", (1, 3, 16, 112, 112)),
    "detection": ("detection", (3, 224, 224)),
    "optical flow": ("optical_flow", (1, 3, 128, 128)),
}
_TV_SIZES = {"inception_v3": (1, 3, 299, 299), "googlenet": (1, 3, 224, 224)}


def torchvision_models() -> list[ZooModel]:
    """Every model ``torchvision.models.list_models`` names, by family."""
    import torchvision

    models = []
    for family, (module_name, shape) in _TV_FAMILIES.items():
        module = getattr(torchvision.models, module_name) if module_name else torchvision.models
        for name in sorted(torchvision.models.list_models(module=module)):
            models.append(ZooModel(f"torchvision {family}", name,
                                   _tv_builder(family, name, _TV_SIZES.get(name, shape))))
    return models


def _tv_builder(family: str, name: str, shape: tuple) -> Callable:
    def build(torch):
        import torchvision

        kwargs: dict[str, Any] = {"weights": None}
        if family in ("segmentation", "detection"):
            kwargs["weights_backbone"] = None
        if name in ("googlenet", "inception_v3"):
            kwargs["aux_logits"] = False
            kwargs["init_weights"] = False
        with torch.device("cuda"):  # weights initialised on the device: much faster
            model = torchvision.models.get_model(name, **kwargs).eval()
        gen = torch.Generator("cuda").manual_seed(0)
        x = torch.rand(shape, device="cuda", generator=gen)
        if family == "detection":  # a list of images in, a list of dicts out
            return _outputs_module(torch, model, lambda m, image: m([image])), (x,)
        if family == "optical flow":
            y = torch.rand(shape, device="cuda", generator=gen)
            return _outputs_module(torch, model, lambda m, a, b: m(a, b)), (x, y)
        if family == "segmentation":
            return _outputs_module(torch, model, lambda m, image: m(image)), (x,)
        return model, (x,)

    return build


# -- transformers --------------------------------------------------------------------------

#: Tiny sizes, set on a config wherever it has the attribute (architectures name them
#: differently).
_TINY = {
    "vocab_size": 256, "hidden_size": 64, "n_embd": 64, "d_model": 64, "embed_dim": 64,
    "num_hidden_layers": 2, "n_layer": 2, "num_layers": 2, "encoder_layers": 2,
    "decoder_layers": 2, "num_decoder_layers": 2, "num_attention_heads": 4, "n_head": 4,
    "num_heads": 4, "encoder_attention_heads": 4, "decoder_attention_heads": 4,
    "num_key_value_heads": 2, "intermediate_size": 128, "d_ff": 128, "n_inner": 128,
    "encoder_ffn_dim": 128, "decoder_ffn_dim": 128, "ffn_dim": 128, "d_kv": 16,
    "head_dim": 16, "max_position_embeddings": 128, "n_positions": 128,
    "num_local_experts": 4, "num_experts": 4, "num_experts_per_tok": 2,
    "moe_intermediate_size": 64, "shared_expert_intermediate_size": 64,
    "image_size": 64, "patch_size": 8, "num_channels": 3, "sliding_window": 16,
    "embedding_size": 64, "max_source_positions": 32, "max_target_positions": 64,
    "num_mel_bins": 16, "conv_dim": (16, 16), "conv_stride": (5, 2), "conv_kernel": (10, 3),
    "num_feat_extract_layers": 2, "num_conv_pos_embeddings": 16,
    "num_conv_pos_embedding_groups": 4, "rotary_dim": 16,
    # Token ids inside the tiny vocabulary.
    "pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2, "decoder_start_token_id": 1,
    "decoder_vocab_size": 256,
}
#: Per architecture, over :data:`_TINY` (stages whose sizes are lists, downsampling stems).
_OVERRIDES: dict[str, dict[str, Any]] = {
    "swin": {"patch_size": 2, "depths": [1, 1, 1], "num_heads": [2, 4, 8],
             "embed_dim": 32, "window_size": 4},
    "convnext": {"patch_size": 4, "depths": [1, 1, 1, 1], "hidden_sizes": [16, 32, 64, 128]},
}
PIXELS = 64  # the side of the images given to vision models (the configs' image_size)
#: (model type, auto class, inputs kind) of the architectures the zoo builds.
_HF = [
    *[(t, "AutoModelForCausalLM", "tokens") for t in (
        "llama", "mistral", "qwen2", "qwen3", "gemma", "gemma2", "gemma3_text", "phi",
        "phi3", "gpt2", "gpt_neox", "gptj", "opt", "bloom", "falcon", "starcoder2",
        "stablelm", "olmo", "olmo2", "cohere", "mixtral", "qwen2_moe", "qwen3_moe",
        "gpt_oss", "granite", "smollm3")],
    *[(t, "AutoModel", "tokens") for t in (
        "bert", "roberta", "distilbert", "albert", "electra", "deberta-v2", "xlm-roberta",
        "modernbert")],
    *[(t, "AutoModelForSeq2SeqLM", "seq2seq") for t in ("t5", "bart", "mbart", "pegasus",
                                                        "marian")],
    *[(t, "AutoModel", "pixels") for t in ("vit", "deit", "beit", "swin", "convnext",
                                           "dinov2", "resnet", "mobilevit")],
    ("whisper", "AutoModelForSpeechSeq2Seq", "speech"),
    ("wav2vec2", "AutoModel", "audio"),
    ("clip", "AutoModel", "text+pixels"),
]


def transformers_models() -> list[ZooModel]:
    """Tiny random-weight models of :data:`_HF`'s architectures."""
    return [ZooModel(f"transformers {kind}", model_type, _hf_builder(model_type, auto, kind))
            for model_type, auto, kind in _HF]


def _tiny_config(model_type: str):
    import transformers

    config = transformers.AutoConfig.for_model(model_type)
    for part in (config, *(getattr(config, key, None) for key in
                           getattr(config, "sub_configs", {}) or {})):
        if part is None:
            continue
        for key, value in {**_TINY, **_OVERRIDES.get(model_type, {})}.items():
            current = getattr(part, key, None)
            if not hasattr(part, key) or (isinstance(current, (list, tuple))
                                          != isinstance(value, (list, tuple))
                                          and key not in _OVERRIDES.get(model_type, {})):
                continue  # absent, or a list per stage where the tiny value is one number
            try:
                setattr(part, key, value)
            except (AttributeError, TypeError, ValueError):  # derived (a read-only property)
                continue
        if hasattr(part, "layer_types") and getattr(part, "layer_types", None):
            part.layer_types = list(part.layer_types)[:2]
    return config


def _hf_builder(model_type: str, auto: str, kind: str) -> Callable:
    def build(torch):
        import transformers

        torch.manual_seed(0)
        config = _tiny_config(model_type)
        with torch.device("cuda"):
            model = getattr(transformers, auto).from_config(config).eval()
        # Some parameters are made by the legacy torch.Tensor(n) constructor, which ignores
        # the default device (wav2vec2's masked_spec_embed): move what was left behind.
        model.to("cuda")
        gen = torch.Generator("cuda").manual_seed(0)
        vocab = int(getattr(getattr(config, "text_config", config), "vocab_size", 256) or 256)
        ids = torch.randint(3, min(vocab, 256), (1, 16), device="cuda", generator=gen)
        if kind == "tokens":
            call = (lambda m, i: m(input_ids=i, use_cache=False)) \
                if auto == "AutoModelForCausalLM" else (lambda m, i: m(input_ids=i))
            return _outputs_module(torch, model, call), (ids,)
        if kind == "seq2seq":
            return _outputs_module(torch, model, lambda m, i, d: m(
                input_ids=i, decoder_input_ids=d, use_cache=False)), (ids, ids[:, :8])
        if kind == "pixels":
            pixels = torch.rand(1, 3, PIXELS, PIXELS, device="cuda", generator=gen)
            return _outputs_module(torch, model, lambda m, p: m(pixel_values=p)), (pixels,)
        if kind == "speech":
            features = torch.rand(1, config.num_mel_bins, 2 * config.max_source_positions,
                                  device="cuda", generator=gen)
            return _outputs_module(torch, model, lambda m, f, d: m(
                input_features=f, decoder_input_ids=d, use_cache=False)), (features, ids[:, :4])
        if kind == "audio":
            audio = torch.rand(1, 4000, device="cuda", generator=gen)
            return _outputs_module(torch, model, lambda m, a: m(input_values=a)), (audio,)
        pixels = torch.rand(1, 3, PIXELS, PIXELS, device="cuda", generator=gen)
        return _outputs_module(torch, model, lambda m, i, p: m(input_ids=i, pixel_values=p)), \
            (ids, pixels)

    return build
