"""transformers' ``batched_mm`` experts with the weight gather left to a matmul of one's own.

``batched_mm`` (transformers 5.17, ``integrations.moe.batched_mm_experts_forward``) copies
each (token, expert) pair's weights out of the experts' stacked weights
(``gate_up_proj[expert_ids]``) and multiplies the copies with one strided batched matmul. At
a Mixtral decode step of batch 8 that is 16 copies of every projection per layer, most of a
step's memory traffic. :func:`register_experts` registers the same forward under a name of
one's own, with each ``_batched_linear(x, weights[ids])`` computed by a function given the
stacked weights and the ids instead, which can read the weights in place; every other
operation is ``batched_mm``'s, in its order, so a function that returns
``_batched_linear``'s bits gives the forward's bits.

Tested on transformers 5.17: ``ExpertsInterface.register`` (``ALL_EXPERTS_FUNCTIONS``), the
experts modules' ``num_experts``, ``has_gate``, ``has_bias``, ``is_transposed``,
``gate_up_proj``/``up_proj``, ``down_proj`` (and their ``_bias``), ``_apply_gate`` and
``act_fn``; ``_batched_linear(input, weight, bias=None, is_transposed=False)``.
``tests/torch/test_expert_matmul_cpu.py`` checks the forward bit for bit against
transformers' own for Mixtral, Qwen3-MoE and gpt-oss, which catches a release that changes
``batched_mm``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

__all__ = ["register_experts", "gathered_linear"]

#: ``matmul(weights, ids, x, transposed)``: row ``s`` of the result is
#: ``weights[ids[s]] @ x[s]`` (``x[s] @ weights[ids[s]]`` when ``transposed``).
GatheredMatmul = Callable[[Any, Any, Any, bool], Any]


def gathered_linear(weights: Any, ids: Any, x: Any, transposed: bool) -> Any:
    """What ``batched_mm`` computes for a projection: transformers' own ``_batched_linear``
    (one strided batched matmul) over ``weights[ids]``, the copy of each pair's weights."""
    from transformers.integrations.moe import _batched_linear

    return _batched_linear(x, weights[ids], is_transposed=transposed)


#: name -> (matmul, the forward registered for it): registering the same pair again keeps the
#: same function object, which dynamo guards on (a new one at every decode step would
#: recompile the step every time).
_registered: dict[str, tuple[GatheredMatmul, Callable[..., Any]]] = {}


def register_experts(name: str, matmul: GatheredMatmul) -> None:
    """Register ``name`` as a transformers experts implementation: ``batched_mm``'s forward
    with its projections computed by ``matmul`` (see the module). Registering a name again
    with another matmul replaces it; with the same one, it keeps the same forward."""
    from transformers.integrations.moe import ALL_EXPERTS_FUNCTIONS

    known = _registered.get(name)
    if known is not None and known[0] is matmul:
        forward = known[1]
    else:
        def forward(self: Any, hidden_states: Any, top_k_index: Any,
                    top_k_weights: Any) -> Any:
            return _forward(self, hidden_states, top_k_index, top_k_weights, matmul)

        forward.__name__ = forward.__qualname__ = f"{name}_experts_forward"
        _registered[name] = (matmul, forward)
    if ALL_EXPERTS_FUNCTIONS.get(name) is not forward:
        ALL_EXPERTS_FUNCTIONS.register(name, forward)


def _forward(self: Any, hidden_states: Any, top_k_index: Any, top_k_weights: Any,
             matmul: GatheredMatmul) -> Any:
    top_k = top_k_index.size(-1)
    tokens, hidden = hidden_states.size(0), hidden_states.size(-1)
    # Each token once per expert it is routed to, the pairs in (token, rank) order.
    pairs = hidden_states.repeat_interleave(top_k, dim=0)
    weights_of_pairs = top_k_weights.reshape(-1)
    # Expert-parallel sentinels clamped into range, out of place, as batched_mm does.
    ids = top_k_index.reshape(-1).clamp(0, self.num_experts - 1)
    if self.has_gate:
        up_weights = self.gate_up_proj
        up_bias = self.gate_up_proj_bias if self.has_bias else None
    else:
        up_weights = self.up_proj
        up_bias = self.up_proj_bias if self.has_bias else None
    out = matmul(up_weights, ids, pairs, self.is_transposed)
    if up_bias is not None:
        out.add_(up_bias[ids])
    out = self._apply_gate(out) if self.has_gate else self.act_fn(out)
    down = matmul(self.down_proj, ids, out, self.is_transposed)
    if self.has_bias:
        down.add_(self.down_proj_bias[ids])
    weighted = down * weights_of_pairs.unsqueeze(-1)
    # A sum over each token's pairs (fp32 accumulation in a reduction), not index_add_.
    return weighted.view(tokens, top_k, hidden).sum(dim=1).to(hidden_states.dtype)
