"""A tensor-parallel decoder step captured on every rank equals eager (torchrun script).

Part ``decode``: the Llama-style decoder of :mod:`cugraphrt.bench.tp_decoder` (column- and
row-parallel linears, one all-reduce after attention and one after the MLP of each layer,
a KV cache written at a position kept on the device) runs 40 decode steps eagerly and as
replays of one cugraphrt_torch graph per rank, from the same weights and inputs; both are
compared with each other and with the unsharded layer in float64.
"""

from __future__ import annotations

import sys

import cugraphrt_torch
import torch
from _dist import ok, run_parts
from cugraphrt_torch.distributed import capture_stream, check_capture

import cugraphrt
from cugraphrt.bench.tp_decoder import Dims, build

STEPS = 40
DIMS = Dims(layers=2, hidden=256, heads=8, ffn=704, batch=4, max_len=STEPS + 8)


def part_decode(rank: int, world: int, device) -> None:
    check_capture()
    eager = build(torch, DIMS, rank=rank, world=world, device=device, dtype=torch.float32)
    graphed = build(torch, DIMS, rank=rank, world=world, device=device, dtype=torch.float32)
    # The same tokens on every rank: tensor parallelism splits the model, not the batch.
    gen = torch.Generator(device=device).manual_seed(1234)
    xs = [torch.randn(DIMS.batch, DIMS.hidden, device=device, generator=gen)
          for _ in range(STEPS)]
    static_x = xs[0].clone()
    stream = capture_stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):  # warm-up: cuBLAS, NCCL for these sizes
        for _ in range(3):
            graphed.step(static_x)
    torch.cuda.current_stream().wait_stream(stream)
    graphed.reset()
    g = cugraphrt.Graph()
    with cugraphrt_torch.graph(g):
        static_out = graphed.step(static_x)
    current = torch.cuda.current_stream()
    reference = eager.reference(xs)
    for i, x in enumerate(xs):
        static_x.copy_(x)
        g.replay(current)
        want = eager.step(x)
        torch.testing.assert_close(static_out, want, rtol=1e-5, atol=1e-5,
                                   msg=lambda m, i=i: f"step {i}: graph vs eager TP: {m}")
        torch.testing.assert_close(want.double(), reference[i], rtol=1e-3, atol=1e-3,
                                   msg=lambda m, i=i: f"step {i}: eager TP vs float64: {m}")
    assert int(graphed.pos) == int(eager.pos) == STEPS
    ok("decode")


if __name__ == "__main__":
    run_parts({"decode": part_decode}, sys.argv[1:])
