"""The checks and small rules of :class:`cugraphrt_torch.Generator`: a generate call's
prompt and special tokens, the model's cache, device and vocabulary, the buckets a size
falls in. Plain functions of their arguments, shared by the generator and its tests."""

from __future__ import annotations

from typing import Any

import torch

from cugraphrt.errors import OptionsError

from .._internals import row_cache as _row_cache
from .._internals import transformers as _transformers
from .._internals import window_cache as _window_cache
from ..compile._eager_kernels import Numerics
from ._generation_program import MAX_EOS
from ._speculative import DraftModel, PromptLookup

__all__ = ["check_prompt", "special_tokens", "static_cache", "model_device", "vocab_size",
           "positive", "step_numerics", "bucket", "describe", "speculative_options"]


def check_prompt(input_ids: Any, attention_mask: Any, max_new_tokens: Any,
                 device: torch.device, max_length: int) -> tuple[int, int]:
    """``(batch, prompt)`` of a generate call's prompt, checked against the generator's
    device and ``max_length``; raises OptionsError naming the argument."""
    if not isinstance(input_ids, torch.Tensor) or input_ids.dim() != 2 \
            or input_ids.dtype not in (torch.int64, torch.int32) \
            or input_ids.device != device or 0 in input_ids.shape:
        raise OptionsError("input_ids", describe(input_ids),
                           f"a non-empty (batch, prompt) integer tensor on {device}")
    if attention_mask is not None and (
            not isinstance(attention_mask, torch.Tensor)
            or attention_mask.shape != input_ids.shape
            or attention_mask.device != device):
        raise OptionsError("attention_mask", describe(attention_mask),
                           f"None or a tensor shaped like input_ids "
                           f"{tuple(input_ids.shape)} on {device}")
    positive("max_new_tokens", max_new_tokens)
    batch, prompt = input_ids.shape
    if prompt + max_new_tokens > max_length:
        raise OptionsError("max_new_tokens", max_new_tokens,
                           f"at most max_length - prompt = {max_length} - {prompt} "
                           f"= {max_length - prompt}; build the Generator with a "
                           f"larger max_length")
    return batch, prompt


def special_tokens(model: Any, eos_token_id: Any, pad_token_id: Any) -> tuple[list[int], int]:
    """The EOS ids and the pad id of a generate call, defaulting to the model's generation
    config as ``generate`` does; raises OptionsError naming the argument."""
    config = getattr(model, "generation_config", None)
    if eos_token_id is None:
        eos_token_id = getattr(config, "eos_token_id", None)
    eos = [] if eos_token_id is None else \
        [eos_token_id] if isinstance(eos_token_id, int) else list(eos_token_id)
    if len(eos) > MAX_EOS or not all(isinstance(t, int) and t >= 0 for t in eos):
        raise OptionsError("eos_token_id", eos_token_id,
                           f"None, a token id, or up to {MAX_EOS} token ids")
    if pad_token_id is None:
        pad_token_id = getattr(config, "pad_token_id", None)
    if pad_token_id is None:
        pad_token_id = eos[0] if eos else 0
    if not isinstance(pad_token_id, int) or pad_token_id < 0:
        raise OptionsError("pad_token_id", pad_token_id, "None or a token id")
    return eos, pad_token_id


def static_cache(model: Any, length: int, rows: int, device: torch.device,
                 per_row: bool = False) -> Any:
    """A StaticCache of ``length`` positions for ``rows`` sequences, its tensors allocated
    (StaticCache allocates on first use: one eager step of ``rows`` dummy tokens); with
    ``per_row``, a write position per row (:func:`.._internals.row_cache.per_row_cache`)."""
    uncached = _transformers.uncached_kinds(model.config)
    if uncached:
        raise OptionsError("model", type(model).__name__,
                           "a model whose layers have full or sliding-window attention (got "
                           f"layers of kind {', '.join(uncached)})")
    # Sliding-window layers in rings of the window's length, attending over generate's keys
    # (window_cache), where the model's masks can say which (sdpa and eager attention) and
    # rows share their positions (not with speculative decoding's per-row cache); at full
    # length, the window masked, else.
    text = model.config.get_text_config(decoder=True)
    window = getattr(text, "sliding_window", None)
    windowed = not per_row and window is not None and window < length and \
        "sliding_attention" in _transformers.layer_kinds(model.config) and \
        _row_cache.attention_implementation(model.config) in _row_cache.MASKED_IMPLEMENTATIONS
    prompt_end = torch.zeros((), dtype=torch.int64, device=device)
    cache = _transformers.static_cache(
        model.config, length,
        (lambda size, width: _window_cache.window_layer(width, prompt_end)) if windowed
        else None)
    sliding = _transformers.sliding_layers(cache)
    if sliding or not _transformers.has_write_counters(cache):
        raise OptionsError("model", type(model).__name__,
                           "a transformers release whose StaticCache layers count their "
                           f"writes on the device (got sliding-window layers {sliding})")
    ids = torch.zeros(rows, 1, dtype=torch.int64, device=device)
    masks = None
    if windowed:  # window layers take their masks ready-made
        masks = _window_cache.window_masks(
            model.config, torch.ones(rows, length, dtype=torch.int64, device=device),
            torch.zeros((), dtype=torch.int64, device=device), 1,
            next(model.parameters()).dtype)
    with torch.no_grad():
        model(input_ids=ids, attention_mask=masks, past_key_values=cache, use_cache=True)
    if per_row:
        _row_cache.per_row_cache(cache)
    return cache


def model_device(model: Any) -> torch.device:
    try:
        return next(model.parameters()).device
    except (AttributeError, StopIteration):
        raise OptionsError("model", type(model).__name__,
                           "a Hugging Face causal LM (a torch module with parameters)") from None


def vocab_size(model: Any) -> int:
    """The width of the model's logits (its output embedding's rows)."""
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    if head is not None and hasattr(head, "weight"):
        return int(head.weight.shape[0])
    return int(model.config.vocab_size)


def positive(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise OptionsError(name, value, "an integer >= 1")
    return value


def step_numerics(compile_step: bool | str) -> Numerics | None:
    """The decode step's Inductor numerics: None (not compiled), eager's bits, or eager's
    rounding alone ("fast")."""
    if compile_step is False:
        return None
    return True if compile_step == "fast" else "exact"


def bucket(size: int, buckets: tuple[int, ...], what: str, option: str) -> int:
    for bucket in buckets:
        if bucket >= size:
            return bucket
    raise OptionsError(what, size, f"at most the largest of {option} {buckets}")


def describe(value: Any) -> str:
    if isinstance(value, torch.Tensor):
        return f"a {value.dtype} tensor of shape {tuple(value.shape)} on {value.device}"
    return type(value).__name__


def speculative_options(speculative: Any, sampling: bool, compile_step: Any, model: Any
                        ) -> PromptLookup | DraftModel | None:
    """The ``speculative`` option, checked with the options it cannot go with yet and, for a
    draft model, against the target ``model`` (vocabulary, device)."""
    if speculative is None:
        return None
    if not isinstance(speculative, (PromptLookup, DraftModel)):
        raise OptionsError("speculative", describe(speculative),
                           "None, cugraphrt_torch.PromptLookup(tokens=..., ngram=...) or "
                           "cugraphrt_torch.DraftModel(model, tokens=...)")
    if isinstance(speculative, DraftModel):
        draft = speculative.model
        if vocab_size(draft) != vocab_size(model):
            raise OptionsError("speculative.model", type(draft).__name__,
                               f"a draft with the target's vocabulary of {vocab_size(model)} "
                               f"tokens (got {vocab_size(draft)})")
        if model_device(draft) != model_device(model):
            raise OptionsError("speculative.model", f"a model on {model_device(draft)}",
                               f"a draft on the target's device, {model_device(model)}")
    for which, checked in (("model", model), ("speculative.model", getattr(
            speculative, "model", None))):
        implementation = None if checked is None else \
            _row_cache.attention_implementation(checked.config)
        if implementation is not None and implementation not in \
                _row_cache.MASKED_IMPLEMENTATIONS:
            raise OptionsError(which, f"attention implementation {implementation!r}",
                               "a model with 'sdpa' or 'eager' attention for speculative "
                               "decoding (its masks offset each row's queries; set "
                               "attn_implementation='sdpa' when loading it)")
    if sampling:
        raise OptionsError("speculative", speculative,
                           "None with sampling=True (speculative decoding is greedy)")
    if compile_step is not False:
        raise OptionsError("speculative", speculative,
                           "None with compile_step (the speculative step runs eager's "
                           "kernels)")
    return speculative
