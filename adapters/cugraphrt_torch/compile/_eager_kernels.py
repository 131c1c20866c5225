"""Inductor with eager's numerics: the settings behind ``eager_numerics`` (True or "exact").

Inductor's fused kernels can differ from eager's in the last bit for three reasons:

1. rounding: eager rounds every op's bf16/fp16 output, a fusion keeps fp32 between its ops.
   Inductor's ``emulate_precision_casts`` rounds where eager does (``eager_numerics=True``,
   with eager's correctly rounded division on torch versions that have the setting);
2. reductions: a Triton reduction sums in its own order, eager's reduce kernels in theirs, so
   a sum, a mean, a norm or a softmax now and then differs by an ulp;
3. math functions: Triton's ``cos``, ``sin`` and ``sigmoid`` are the GPU's approximations,
   eager's are CUDA's math library; eager's composite kernels (GELU, layer norm, ``lerp``)
   contract multiply-adds where Inductor, rounding as eager, does not.

``eager_numerics="exact"`` also removes 2 and 3: the ops of :data:`EAGER_KERNEL_OPS` skip
Inductor's decompositions and lowerings and run eager's own kernels (Inductor's fallback
kernels: the aten op, called as eager calls it), between fused kernels that only add,
multiply, compare, select, cast, move data and take correctly rounded square roots. Greedy
decoding then keeps eager's tokens where a nearly tied pair of logits flips them under (1)
alone, at the price of the kernels fusion no longer saves (docs/compile.md, "Eager's
numerics"). Denormal fp32 values aside (Triton may flush them), the results are eager's bits.
Inference graphs only (:func:`check_inference`).

The lowering patch is scoped to one Inductor compilation (a ``with`` around it), but it patches
Inductor's one table of lowerings: a compilation in another thread meanwhile also gets eager's
kernels (slower, never less exact). The FX graph cache is off for these compilations, since
its key cannot see the patch.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator
from typing import Any, Literal

import torch

from cugraphrt.errors import OptionsError

from .._internals import compile as _compile

__all__ = ["EAGER_KERNEL_OPS", "Numerics", "check_inference", "compile_inductor",
           "inductor_backend", "inductor_settings", "eager_kernel_lowerings"]

#: ``eager_numerics``' values: False (Inductor's own), True (eager's rounding), "exact".
Numerics = bool | Literal["exact"]

#: aten ops that run eager's kernels under ``eager_numerics="exact"``: floating reductions
#: and normalizations, math functions, and eager's composite pointwise kernels.
EAGER_KERNEL_OPS = (
    "sum.default", "sum.dim_IntList", "mean.default", "mean.dim", "prod.default",
    "prod.dim_int", "var.correction", "var_mean.correction", "std.correction",
    "std_mean.correction", "cumsum.default", "cumprod.default", "logsumexp.default",
    "linalg_vector_norm.default", "_softmax.default", "_log_softmax.default",
    "native_layer_norm.default", "native_group_norm.default", "native_batch_norm.default",
    "_native_batch_norm_legit_no_training.default", "_native_batch_norm_legit.default",
    "exp.default", "exp2.default", "expm1.default", "log.default", "log2.default",
    "log10.default", "log1p.default", "sin.default", "cos.default", "tan.default",
    "asin.default", "acos.default", "atan.default", "atan2.default", "sinh.default",
    "cosh.default", "tanh.default", "asinh.default", "acosh.default", "atanh.default",
    "sigmoid.default", "silu.default", "gelu.default", "erf.default", "erfc.default",
    "erfinv.default", "softplus.default", "mish.default", "elu.default", "selu.default",
    "celu.default", "logit.default", "hardswish.default", "hardsigmoid.default",
    "addcmul.default", "addcdiv.default", "lerp.Scalar", "lerp.Tensor",
    "pow.Tensor_Tensor", "pow.Scalar", "_fused_rms_norm.default",
    # Backward kernels (AOTAutograd traces the backward through autograd's formulas, the ops
    # eager's backward runs; these are eager's composite ones).
    "silu_backward.default", "gelu_backward.default", "sigmoid_backward.default",
    "tanh_backward.default", "_softmax_backward_data.default",
    "_log_softmax_backward_data.default", "native_layer_norm_backward.default",
    "native_group_norm_backward.default", "native_batch_norm_backward.default",
    "elu_backward.default", "softplus_backward.default", "hardswish_backward.default",
    "hardsigmoid_backward.default", "mish_backward.default", "logit_backward.default",
    "_fused_rms_norm_backward.default",
)

#: Names of :data:`EAGER_KERNEL_OPS` that older torch versions lack (skipped there).
NEWER_OPS = ("_fused_rms_norm.default", "_fused_rms_norm_backward.default")

#: Division, added to the list where this torch cannot round Triton's division as eager's.
DIVISION_OPS = ("div.Tensor", "div.Scalar", "div.Tensor_mode", "div.Scalar_mode",
                "reciprocal.default")

# x ** e that Inductor computes as eager does (repeated products, or sqrt); other exponents
# call eager's pow.
_EXACT_EXPONENTS = (0, 1, 2, 3, 0.5)


def inductor_settings(numerics: Numerics) -> tuple[dict, dict | None]:
    """(config patches, decomposition table or None for Inductor's) for ``numerics``."""
    if not numerics:
        return {}, None
    patches: dict = {"emulate_precision_casts": True}
    if _compile.has_division_rounding():
        patches["eager_numerics.division_rounding"] = True
    if numerics != "exact":
        return patches, None
    patches["fx_graph_cache"] = False
    kept = set(_eager_ops())
    return patches, {op: fn for op, fn in _compile.select_decomp_table().items()
                     if op not in kept}


@contextlib.contextmanager
def eager_kernel_lowerings(numerics: Numerics) -> Iterator[None]:
    """Inside: Inductor lowers :data:`EAGER_KERNEL_OPS` to eager's kernels (if "exact")."""
    if numerics != "exact":
        yield
        return
    lowerings = _compile.lowering_table()
    handlers: dict[Any, Callable] = {op: _compile.fallback_handler(op) for op in _eager_ops()}
    handlers[torch.ops.aten.pow.Tensor_Scalar] = _pow_handler(
        lowerings[torch.ops.aten.pow.Tensor_Scalar],
        _compile.fallback_handler(torch.ops.aten.pow.Tensor_Scalar))
    saved = {op: lowerings.get(op) for op in handlers}
    lowerings.update(handlers)
    try:
        yield
    finally:
        for op, handler in saved.items():
            if handler is None:
                lowerings.pop(op, None)
            else:
                lowerings[op] = handler


def check_inference(numerics: Numerics, compile_kwargs: dict) -> None:
    """Refuse ``"exact"`` for a training graph: eager's fallback kernels in a forward change
    the layouts of the tensors it saves, which the backward compiled from the joint graph
    does not expect (Inductor's stride checks fail). ``aot_eager`` trains with eager's bits.
    """
    if numerics == "exact" and not compile_kwargs.get("is_inference"):
        raise OptionsError("eager_numerics", numerics, "True or False for a graph that "
                           "trains (\"exact\" compiles inference graphs: run under "
                           "torch.no_grad(); compiler=\"aot_eager\" trains with eager's bits)")


def compile_inductor(gm: torch.fx.GraphModule, example_inputs: Any, numerics: Numerics,
                     finish: Callable[..., Any] | None = None) -> Any:
    """Inductor's ``compile_fx`` under ``numerics``, without CUDA graphs of its own:
    ``finish(compiled, graph, inputs, kwargs)``, if given, wraps each compiled graph."""
    patches, decompositions = inductor_settings(numerics)

    def inner(graph, inputs, **kwargs):
        check_inference(numerics, kwargs)
        # Around each compilation, a backward's later one included.
        with eager_kernel_lowerings(numerics):
            compiled = _compile.compile_fx_inner(graph, inputs, **kwargs)
        return compiled if finish is None else finish(compiled, graph, inputs, kwargs)

    # compile_fx applies the patches to the backward's later compilation too.
    return _compile.compile_fx(gm, example_inputs, inner_compile=inner,
                      config_patches={"triton.cudagraphs": False, **patches},
                      decompositions=decompositions)


def inductor_backend(numerics: Numerics) -> Callable:
    """A ``torch.compile`` backend: :func:`compile_inductor` under ``numerics``."""
    return functools.partial(compile_inductor, numerics=numerics)


@functools.cache
def _eager_ops() -> tuple:
    """:data:`EAGER_KERNEL_OPS` (and division where needed) resolved on this torch; a name
    this version lacks is skipped (no graph can hold it)."""
    names = EAGER_KERNEL_OPS + (() if _compile.has_division_rounding() else DIVISION_OPS)
    ops = []
    for name in names:
        packet, _, overload = name.partition(".")
        op = getattr(getattr(torch.ops.aten, packet, None), overload, None)
        if op is not None:
            ops.append(op)
    return tuple(ops)


def _pow_handler(native: Callable, fallback: Callable) -> Callable:
    def handler(base, exponent):
        if isinstance(exponent, (int, float)) and exponent in _EXACT_EXPONENTS:
            return native(base, exponent)
        return fallback(base, exponent)
    return handler
