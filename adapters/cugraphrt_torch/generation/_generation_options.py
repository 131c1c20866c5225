"""The options of :class:`cugraphrt_torch.Generator`, validated as the core's options are
(a pydantic model, :func:`cugraphrt.options.validate_options`), with the defaults that
depend on ``max_length`` and the checks that relate one option to another."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BeforeValidator, Field

from cugraphrt.adapter import Frozen
from cugraphrt.errors import OptionsError
from cugraphrt.options import validate_options

__all__ = ["GeneratorOptions", "generator_options"]

#: The smallest default prompt bucket (prompts are right-padded to a bucket).
PROMPT_BUCKET_MIN = 16
#: The default cache buckets' step: as many 64-key blocks as eager's growing cache has.
CACHE_BUCKET_STEP = 64


def _sorted_sizes(values: Any) -> Any:
    """A list or tuple of sizes, sorted and without repeats; anything else as given, for
    the field's own check to refuse."""
    if isinstance(values, (list, tuple)) and all(
            isinstance(v, int) and not isinstance(v, bool) for v in values):
        return tuple(sorted(set(values)))
    return values


Sizes = Annotated[tuple[Annotated[int, Field(ge=1)], ...], Field(min_length=1),
                  BeforeValidator(_sorted_sizes)]


class GeneratorOptions(Frozen):
    """A :class:`~cugraphrt_torch.Generator`'s options (its parameters, less the model), the
    bucket lists sorted and their defaults filled in by :func:`generator_options`."""

    max_length: int = Field(ge=2)
    batch_buckets: Sizes = (1, 2, 4, 8)
    prompt_buckets: Sizes | None = None
    cache_buckets: Sizes | None = None
    chunk: int = Field(default=32, ge=1)
    compile_step: bool | Literal["fast"] = False
    graphed: bool = True


def generator_options(**values: Any) -> GeneratorOptions:
    """Validate a Generator's options, fill in the default buckets and check them against
    each other; raises OptionsError naming the option."""
    opts = validate_options(GeneratorOptions, **values)
    length = opts.max_length
    prompt = opts.prompt_buckets or powers(PROMPT_BUCKET_MIN, length)
    cache = opts.cache_buckets or multiples(CACHE_BUCKET_STEP, length)
    for name, sizes in (("prompt_buckets", prompt), ("cache_buckets", cache)):
        if sizes[-1] > length:
            raise OptionsError(name, values.get(name, sizes),
                               f"lengths up to max_length ({length})")
    if cache[-1] < prompt[-1]:
        raise OptionsError("cache_buckets", cache,
                           f"a length >= the largest prompt bucket ({prompt[-1]})")
    return opts.model_copy(update={"prompt_buckets": prompt, "cache_buckets": cache})


def powers(smallest: int, largest: int) -> tuple[int, ...]:
    """smallest, 2 * smallest, 4 * smallest, ... below ``largest``, then ``largest``."""
    sizes, size = [], smallest
    while size < largest:
        sizes.append(size)
        size *= 2
    sizes.append(largest)
    return tuple(sizes)


def multiples(step: int, largest: int) -> tuple[int, ...]:
    """step, 2 * step, 3 * step, ... below ``largest``, then ``largest``."""
    return (*range(step, largest, step), largest)
