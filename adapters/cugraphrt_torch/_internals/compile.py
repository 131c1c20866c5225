"""Dynamo, Inductor, AOTAutograd and functorch internals: configuration and entry points.

Tested on torch 2.11 (CUDA, the GPU suite and bench) and 2.11 to 2.14 (CPU). Each is
imported where called: importing ``torch._dynamo`` or ``torch._inductor`` takes seconds in
a cold process, and most programs never compile.
"""

from __future__ import annotations

import contextlib
import types
from collections.abc import Callable, Iterator
from typing import Any

__all__ = ["inductor_config", "has_division_rounding", "select_decomp_table",
           "lowering_table", "fallback_handler", "compile_fx", "compile_fx_inner",
           "recompile_limit", "dynamo_disable", "aot_autograd", "make_boxed_func",
           "tracing_context", "no_autograd_cache", "own_code", "own_forward",
           "eager_composites"]


def inductor_config() -> Any:
    """``torch._inductor.config`` (its ``patch`` takes dotted keys)."""
    import torch._inductor.config as config

    return config


def has_division_rounding() -> bool:
    """Whether Inductor has ``eager_numerics.division_rounding`` (torch 2.10 on: divisions
    rounded as eager's); without it, the caller keeps eager's division kernels."""
    return hasattr(getattr(inductor_config(), "eager_numerics", None), "division_rounding")


def select_decomp_table() -> dict:
    """Inductor's decomposition table (``torch._inductor.decomposition.select_decomp_table``;
    the same since torch 2.0)."""
    from torch._inductor.decomposition import select_decomp_table as table

    return table()


def lowering_table() -> dict:
    """Inductor's global table of lowerings, op -> handler (``torch._inductor.lowering.
    lowerings``), which a caller may patch around a compilation and must restore."""
    from torch._inductor import lowering

    return lowering.lowerings


def fallback_handler(op: Any) -> Callable:
    """A lowering that calls eager's kernel for ``op``, without adding it to Inductor's
    fallback set (``lowering.fallback_handler(op, add_to_fallback_set=False)``, torch 2.1
    on)."""
    from torch._inductor import lowering

    return lowering.fallback_handler(op, add_to_fallback_set=False)


def compile_fx(gm: Any, example_inputs: Any, **kwargs: Any) -> Any:
    """``torch._inductor.compile_fx.compile_fx`` (keywords ``inner_compile``,
    ``config_patches``, ``decompositions``: the same since torch 2.1)."""
    from torch._inductor.compile_fx import compile_fx as compile

    return compile(gm, example_inputs, **kwargs)


def compile_fx_inner(graph: Any, inputs: Any, **kwargs: Any) -> Any:
    """``torch._inductor.compile_fx.compile_fx_inner``: one graph's compilation, the
    ``inner_compile`` that :func:`compile_fx` calls by default."""
    from torch._inductor.compile_fx import compile_fx_inner as inner

    return inner(graph, inputs, **kwargs)


@contextlib.contextmanager
def recompile_limit(at_least: int) -> Iterator[None]:
    """Inside, dynamo allows at least ``at_least`` compilations per code object: its
    ``recompile_limit`` (torch 2.6 on), ``cache_size_limit`` before; never lowered."""
    from torch._dynamo import config

    name = "recompile_limit" if hasattr(config, "recompile_limit") else "cache_size_limit"
    with config.patch({name: max(getattr(config, name), at_least)}):
        yield


def dynamo_disable(fn: Callable) -> Callable:
    """``torch._dynamo.disable(fn)``: ``fn`` runs eagerly even under a compiled caller."""
    import torch._dynamo

    return torch._dynamo.disable(fn)


def aot_autograd(**kwargs: Any) -> Any:
    """A dynamo backend from forward and backward compilers
    (``torch._dynamo.backends.common.aot_autograd``; the same since torch 2.0)."""
    from torch._dynamo.backends.common import aot_autograd as make

    return make(**kwargs)


def make_boxed_func(fn: Callable) -> Callable:
    """``fn`` taking its inputs as one list (``torch._functorch.aot_autograd.
    make_boxed_func``), as AOTAutograd's compilers must return."""
    from torch._functorch.aot_autograd import make_boxed_func as boxed

    return boxed(fn)


def tracing_context() -> Any:
    """The compilation's ``torch._guards.TracingContext``, or None outside one
    (``TracingContext.try_get``, torch 2.1 on)."""
    import torch._guards

    return torch._guards.TracingContext.try_get()


@contextlib.contextmanager
def no_autograd_cache() -> Iterator[None]:
    """Inside, AOTAutograd neither reads nor writes its on-disk cache
    (``torch._functorch.config.enable_autograd_cache``, torch 2.5 on)."""
    from torch._functorch import config

    with config.patch(enable_autograd_cache=False):
        yield


def own_code(method: Callable) -> Callable:
    """``method`` bound to the same object, its function on a fresh copy of its code object.

    Dynamo keeps compilations, and counts them against its recompile limit, per code object
    (torch 2.0 to 2.14): a method compiled through its own copy neither shares another
    caller's compilations nor counts against their limit, and its compilations go with it.
    """
    func = method.__func__  # type: ignore[attr-defined]
    own = types.FunctionType(func.__code__.replace(), func.__globals__, func.__name__,
                             func.__defaults__, func.__closure__)
    return types.MethodType(own, method.__self__)  # type: ignore[attr-defined]


def own_forward(module: Any) -> Callable | None:
    """``module.forward`` through :func:`own_code`, where calling the module is calling its
    forward: no forward or backward hooks of its own (``Module._forward_hooks`` and the
    others) or global ones (``torch.nn.modules.module._global_forward_hooks`` and the others;
    torch 2.0 to 2.14), and a forward that is a method. None otherwise."""
    from torch.nn.modules import module as nn_module

    forward = getattr(module, "forward", None)
    if not isinstance(forward, types.MethodType):
        return None
    tables = [getattr(module, name, None) for name in (
        "_forward_hooks", "_forward_pre_hooks", "_backward_hooks", "_backward_pre_hooks")]
    tables += [getattr(nn_module, name, None) for name in (
        "_global_forward_hooks", "_global_forward_pre_hooks", "_global_backward_hooks",
        "_global_backward_pre_hooks")]
    if any(table is None or table for table in tables):  # a hook, or a table torch renamed
        return None
    return own_code(forward)


#: Ops that ``torch._decomp`` decomposes while AOTAutograd traces, through a Python kernel
#: for the Autograd or CompositeImplicitAutograd key (torch 2.11 to 2.14), otherwise than
#: eager's C++ does: upsampling (its coordinates computed in another order, ~1e-6 apart) and
#: ``matmul`` (a vector times a batch of matrices: another reduction order).
_EAGER_COMPOSITES = tuple(
    f"{name}.{overload}" for name in (
        "upsample_nearest1d", "upsample_nearest2d", "upsample_nearest3d",
        "_upsample_nearest_exact1d", "_upsample_nearest_exact2d", "_upsample_nearest_exact3d",
        "upsample_linear1d", "upsample_bilinear2d", "upsample_trilinear3d",
        "upsample_bicubic2d", "_upsample_bilinear2d_aa", "_upsample_bicubic2d_aa")
    for overload in ("default", "vec"))

#: Set aside only for graphs of static sizes: torch 2.11's C++ ``matmul`` reads ``numel()``,
#: which a tensor of symbolic sizes refuses (torch 2.13's does not), so under dynamic shapes
#: ``matmul`` keeps torch._decomp's trace and its reduction order.
_EAGER_COMPOSITES_STATIC = ("matmul.default",)


@contextlib.contextmanager
def eager_composites(symbolic_sizes: bool = False) -> Iterator[None]:
    """Inside, AOTAutograd traces the ops of :data:`_EAGER_COMPOSITES` (and, unless
    *symbolic_sizes*, of :data:`_EAGER_COMPOSITES_STATIC`) as eager runs them: their Python
    kernels (``OpOverload.py_kernels`` for ``DispatchKey.Autograd`` and
    ``CompositeImplicitAutograd``, registered by ``torch._decomp``) are set aside, so the
    dispatcher takes the C++ path eager takes. Restored on exit; every thread sees the change
    meanwhile (a compilation elsewhere then also keeps eager's op)."""
    import torch
    from torch._C import DispatchKey

    keys = (DispatchKey.Autograd, DispatchKey.CompositeImplicitAutograd)
    hidden: list[tuple[Any, Any, Callable]] = []
    ops = _EAGER_COMPOSITES + (() if symbolic_sizes else _EAGER_COMPOSITES_STATIC)
    for qualified in ops:
        name, overload = qualified.rsplit(".", 1)
        packet = getattr(torch.ops.aten, name, None)
        op = getattr(packet, overload, None) if packet is not None else None
        kernels = getattr(op, "py_kernels", None)
        if not isinstance(kernels, dict):
            continue
        for key in keys:
            if key in kernels:
                hidden.append((op, key, kernels.pop(key)))
    _clear_dispatch_caches(op for op, _, _ in hidden)
    try:
        yield
    finally:
        for op, key, kernel in hidden:
            op.py_kernels[key] = kernel
        _clear_dispatch_caches(op for op, _, _ in hidden)


def _clear_dispatch_caches(ops: Any) -> None:
    # An OpOverload caches the kernel it resolved per key (``_dispatch_cache``).
    for op in ops:
        cache = getattr(op, "_dispatch_cache", None)
        if isinstance(cache, dict):
            cache.clear()
