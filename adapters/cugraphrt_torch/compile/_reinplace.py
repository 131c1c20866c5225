"""Input mutations written in place again, for the backend's ``aot_eager`` compiler.

AOTAutograd functionalizes the graph it hands a compiler: ``cache.index_copy_(2, pos, k)`` on
an input becomes ``new = index_copy(cache, 2, pos, k)`` (a copy of the whole cache, then the
write), reads of the cache read ``new``, and ``cache.copy_(new)`` at the end writes the result
back (``keep_inference_input_mutations``). Inductor turns the pair back into the in-place op
(its reinplacing pass); the FX interpreter of ``aot_eager`` ran it as written: per KV-cache
update two full copies of the cache and two kernels more than eager. For a 12-layer Llama
decode step that is 48 launches more than eager's graph, the 1.06x of ``hf_decode``'s
``cugraphrt_aot_eager`` row (docs/compile.md).

:func:`reinplace_input_mutations` rewrites each such pair into the in-place op when that is
safe: the functional op's first argument is a graph input, the only copy back into that input
is the final ``copy_`` of its result, and nothing after the op reads the input's old value.
torch's own ``torch.fx.passes.reinplace`` leaves graph inputs alone, so it does not apply.
"""

from __future__ import annotations

import functools
from operator import is_not

import torch

from .._internals import ops as _ops

__all__ = ["reinplace_input_mutations"]

_aten = torch.ops.aten


def _inplace_variant(target):
    """``aten.index_copy_.default`` for ``aten.index_copy.default``; None where there is none
    with the same schema (arguments and their order)."""
    if not _ops.is_aten_overload(target):
        return None
    packet = getattr(_aten, _ops.op_name(target) + "_", None)
    overload = getattr(packet, _ops.overload_name(target), None) if packet is not None else None
    if overload is None:
        return None
    return overload if _ops.argument_names(target) == _ops.argument_names(overload) else None


def reinplace_input_mutations(gm: torch.fx.GraphModule) -> int:
    """Rewrite ``y = op(x, ...); ...; x.copy_(y)`` (``x`` a graph input) into
    ``op_(x, ...)``, its reads of ``y`` reading ``x``; returns how many were rewritten."""
    graph = gm.graph
    order = {node: index for index, node in enumerate(graph.nodes)}
    rewritten = 0
    for copy in list(graph.find_nodes(op="call_function", target=_aten.copy_.default)):
        target, result = copy.args[0], copy.args[1]
        if not isinstance(target, torch.fx.Node) or target.op != "placeholder" \
                or not isinstance(result, torch.fx.Node) \
                or result.op != "call_function" or not result.args or result.args[0] is not target:
            continue
        inplace = _inplace_variant(result.target)
        if inplace is None or copy.users:
            continue
        # Every other use of the input must come before the functional op: after it, a read
        # of the input means its old value, which the in-place op would have overwritten.
        later = [user for user in target.users
                 if user is not result and user is not copy and order[user] > order[result]]
        if later:
            continue
        result.target = inplace
        result.replace_all_uses_with(target, delete_user_cb=functools.partial(is_not, copy))
        graph.erase_node(copy)
        rewritten += 1
    if rewritten:
        graph.lint()
        gm.recompile()
    return rewritten
