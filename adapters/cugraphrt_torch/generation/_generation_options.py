"""The options of :class:`cugraphrt_torch.Generator`, validated as the core's options are
(a pydantic model, :func:`cugraphrt.options.validate_options`), with the defaults that
depend on ``max_length`` and the checks that relate one option to another."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from cugraphrt.adapter import Frozen, checked_sizes, doubling, stepping
from cugraphrt.errors import OptionsError
from cugraphrt.options import validate_options

__all__ = ["GeneratorOptions", "generator_options"]

#: The smallest default prompt bucket (prompts are right-padded to a bucket).
PROMPT_BUCKET_MIN = 16
#: The default cache buckets' step: as many 64-key blocks as eager's growing cache has.
CACHE_BUCKET_STEP = 64


# Checked with the core's one rule for bucket lists (checked_sizes: strictly increasing,
# never sorted for the caller) in generator_options, which names the option.
Sizes = tuple[int, ...]


class GeneratorOptions(Frozen):
    """A :class:`~cugraphrt_torch.Generator`'s options (its parameters, less the model), the
    bucket lists checked and their defaults filled in by :func:`generator_options`."""

    max_length: int = Field(ge=2)
    batch_buckets: Sizes = (1, 2, 4, 8)
    prompt_buckets: Sizes | None = None
    cache_buckets: Sizes | None = None
    chunk: int = Field(default=32, ge=1)
    compile_step: bool | Literal["fast"] = False
    graphed: bool = True
    sampling: bool = False


def generator_options(**values: Any) -> GeneratorOptions:
    """Validate a Generator's options, fill in the default buckets and check them against
    each other; raises OptionsError naming the option."""
    for name in ("batch_buckets", "prompt_buckets", "cache_buckets"):
        if values.get(name) is not None:
            values[name] = checked_sizes(name, values[name])
    opts = validate_options(GeneratorOptions, **values)
    length = opts.max_length
    prompt = opts.prompt_buckets or doubling(PROMPT_BUCKET_MIN, length)
    cache = opts.cache_buckets or stepping(CACHE_BUCKET_STEP, length)
    for name, sizes in (("prompt_buckets", prompt), ("cache_buckets", cache)):
        if sizes[-1] > length:
            raise OptionsError(name, values.get(name, sizes),
                               f"lengths up to max_length ({length})")
    if cache[-1] < prompt[-1]:
        raise OptionsError("cache_buckets", cache,
                           f"a length >= the largest prompt bucket ({prompt[-1]})")
    return opts.model_copy(update={"prompt_buckets": prompt, "cache_buckets": cache})
