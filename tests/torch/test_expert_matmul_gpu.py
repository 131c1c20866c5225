"""The ``cugraphrt::gathered_matmul`` op on the GPU: ``batched_mm``'s bits whichever way it
computes, eagerly and replayed from a graph over new routing.

A shape's first call outside a capture decides, on one sample, whether cuBLAS's pointer-array
GEMM rounds as torch's strided one. These tests draw other inputs and routings, so they also
check that one sample's verdict holds for the shape: bits equal to the gather and
``torch.bmm`` (transformers' ``_batched_linear``) on every draw.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from cugraphrt_torch.inference import expert_matmul  # noqa: E402

from tests.conftest import torch_gpu_marks  # noqa: E402

pytestmark = torch_gpu_marks(torch)


def _reference(weights, ids, x, transposed):
    selected = weights[ids]
    if transposed:
        return torch.bmm(x.unsqueeze(1), selected).squeeze(1)
    return torch.bmm(selected, x.unsqueeze(-1)).squeeze(-1)


def _draw(weights, pairs, transposed, seed):
    generator = torch.Generator(device="cuda").manual_seed(seed)
    inner = weights.shape[1] if transposed else weights.shape[2]
    x = torch.randn(pairs, inner, device="cuda", generator=generator).to(weights.dtype)
    ids = torch.randint(0, weights.shape[0], (pairs,), device="cuda", generator=generator)
    return ids, x


# Mixtral's gate_up at the bench's width (8 experts, 2 x 1536 by 768), and gpt-oss's
# transposed layout; pairs: batch 1 to 32 at top-2.
SHAPES = [((8, 3072, 768), False), ((8, 768, 1536), False), ((4, 256, 512), True)]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("shape, transposed", SHAPES, ids=["gate_up", "down", "transposed"])
@pytest.mark.parametrize("pairs", [2, 8, 16, 64])
def test_each_draw_equals_the_gather_and_bmm_bit_for_bit(shape, transposed, pairs, dtype):
    weights = torch.randn(shape, device="cuda").to(dtype)
    for seed in range(3):
        ids, x = _draw(weights, pairs, transposed, seed)
        got = expert_matmul.gathered_matmul(weights, ids, x, transposed)
        assert torch.equal(got, _reference(weights, ids, x, transposed)), seed
    verdicts = [fits for key, fits in expert_matmul.checked_shapes().items()
                if key[1:] == (dtype, *shape, pairs, transposed)]
    assert len(verdicts) == 1  # checked once, then remembered
    way = "pointer-array GEMM" if verdicts[0] else "gather and bmm"
    print(f"{shape} pairs={pairs} {dtype}: {way}")


@pytest.mark.parametrize("shape, transposed", [SHAPES[0], SHAPES[2]],
                         ids=["gate_up", "transposed"])
def test_a_graph_replays_the_op_over_each_new_routing(shape, transposed):
    weights = torch.randn(shape, device="cuda").to(torch.bfloat16)
    ids, x = _draw(weights, 16, transposed, seed=0)
    expert_matmul.gathered_matmul(weights, ids, x, transposed)  # checked outside the capture
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.stream(stream), torch.cuda.graph(graph, stream=stream):
        out = expert_matmul.gathered_matmul(weights, ids, x, transposed)
    for seed in (1, 2, 3):
        new_ids, new_x = _draw(weights, 16, transposed, seed)
        ids.copy_(new_ids)
        x.copy_(new_x)
        graph.replay()
        assert torch.equal(out, _reference(weights, new_ids, new_x, transposed)), seed


def test_the_first_call_inside_a_capture_takes_the_gather():
    weights = torch.randn(3, 96, 80, device="cuda").to(torch.bfloat16)  # a shape of its own
    ids, x = _draw(weights, 6, False, seed=0)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = expert_matmul.gathered_matmul(weights, ids, x, False)
    graph.replay()
    assert torch.equal(out, _reference(weights, ids, x, False))
    assert not any(key[1:4] == (torch.bfloat16, 3, 96, 80)
                   for key in expert_matmul.checked_shapes())  # no check ran in the capture
