"""The aot_eager compiler's reinplacing of input mutations, on CPU: what it rewrites, what it
must leave alone, and that the rewritten graph computes what eager does."""

from __future__ import annotations

import collections

import pytest

torch = pytest.importorskip("torch")

from cugraphrt_torch.compile._reinplace import reinplace_input_mutations  # noqa: E402

aten = torch.ops.aten


def _ops(gm) -> collections.Counter:
    return collections.Counter(str(n.target) for n in gm.graph.nodes if n.op == "call_function")


class _Cache(torch.nn.Module):
    """A KV-cache-like update: index_copy_ at a counter, the counter advanced, the cache read."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("keys", torch.zeros(2, 8, 4))
        self.register_buffer("count", torch.zeros((), dtype=torch.int64))

    def forward(self, k):
        position = torch.arange(k.shape[1]) + self.count
        self.count.add_(k.shape[1])
        self.keys.index_copy_(1, position, k)
        return (self.keys * 2).sum(1)


def _aot_graphs(fn, *args):
    """fn compiled with AOTAutograd (inference mutations kept in the graph, as the backend's
    aot_eager does), each graph reinplaced; returns (compiled, graphs, rewrite counts)."""
    from torch._dynamo.backends.common import aot_autograd
    from torch._functorch.aot_autograd import make_boxed_func

    graphs, counts = [], []

    def compile_graph(gm, inputs):
        counts.append((_ops(gm), reinplace_input_mutations(gm)))
        graphs.append(gm)
        return make_boxed_func(gm.forward)

    torch._dynamo.reset()
    backend = aot_autograd(fw_compiler=compile_graph, inference_compiler=compile_graph,
                           keep_inference_input_mutations=True)
    return torch.compile(fn, backend=backend), graphs, counts


def test_cache_update_becomes_in_place_and_matches_eager():
    eager, compiled_module = _Cache(), _Cache()
    compiled, graphs, counts = _aot_graphs(compiled_module)
    with torch.no_grad():
        for step in range(3):
            k = torch.randn(2, 1, 4, generator=torch.Generator().manual_seed(step))
            assert torch.equal(compiled(k), eager(k))
    assert torch.equal(compiled_module.keys, eager.keys)
    assert int(compiled_module.count) == int(eager.count) == 3
    (before, rewritten), = counts
    after = _ops(graphs[0])
    # Functionalized: an out-of-place index_copy and add, each copied back into the input.
    assert before["aten.index_copy.default"] == 1 and before["aten.copy_.default"] == 2
    assert rewritten == 2
    assert after["aten.index_copy_.default"] == 1 and after["aten.add_.Tensor"] == 1
    assert after["aten.index_copy.default"] == 0 and after["aten.copy_.default"] == 0


def _hand_graph(read_after: bool) -> torch.fx.GraphModule:
    """x: input; y = index_copy(x, 0, i, v); [z = x + 1 (the OLD x)]; x.copy_(y)."""
    graph = torch.fx.Graph()
    x, i, v = (graph.placeholder(name) for name in ("x", "i", "v"))
    y = graph.call_function(aten.index_copy.default, (x, 0, i, v))
    z = graph.call_function(aten.add.Tensor, (x, 1)) if read_after else None
    graph.call_function(aten.copy_.default, (x, y))
    graph.output((y, z) if read_after else (y,))
    return torch.fx.GraphModule(torch.nn.Module(), graph)


def test_a_later_read_of_the_old_value_keeps_the_copy():
    gm = _hand_graph(read_after=True)
    assert reinplace_input_mutations(gm) == 0
    x, i, v = torch.zeros(4), torch.tensor([1]), torch.tensor([5.0])
    y, z = gm(x, i, v)
    assert torch.equal(z, torch.ones(4))  # x + 1 read the old x
    assert torch.equal(x, torch.tensor([0.0, 5.0, 0.0, 0.0])) and torch.equal(y, x)


def test_hand_graph_rewritten_when_safe():
    gm = _hand_graph(read_after=False)
    assert reinplace_input_mutations(gm) == 1
    assert _ops(gm)["aten.index_copy_.default"] == 1 and _ops(gm)["aten.copy_.default"] == 0
    x, i, v = torch.zeros(4), torch.tensor([2]), torch.tensor([7.0])
    (y,) = gm(x, i, v)
    assert torch.equal(x, torch.tensor([0.0, 0.0, 7.0, 0.0]))
    assert y.data_ptr() == x.data_ptr()  # the output is the input, written in place


def test_ops_without_an_in_place_twin_are_left_alone():
    graph = torch.fx.Graph()
    x = graph.placeholder("x")
    y = graph.call_function(aten.flip.default, (x, [0]))  # there is no aten.flip_
    graph.call_function(aten.copy_.default, (x, y))
    graph.output((y,))
    gm = torch.fx.GraphModule(torch.nn.Module(), graph)
    assert reinplace_input_mutations(gm) == 0
    x_val = torch.tensor([1.0, 2.0, 3.0])
    gm(x_val)
    assert torch.equal(x_val, torch.tensor([3.0, 2.0, 1.0]))
