"""cugraphrt graphs of two models, each also compiled with reduce-overhead, in one process.

This sequence faulted before captures stopped sharing torch's cached cuBLAS workspace
(docs/torch.md, "Coexisting with torch.compile"). Exits 0 when it runs correctly.
Run: python tests/torch/repro_compile_interop.py
"""

from __future__ import annotations

import copy

import cugraphrt_torch
import torch


def mlp():
    layers = []
    for _ in range(4):
        layers += [torch.nn.Linear(512, 512), torch.nn.ReLU()]
    return torch.nn.Sequential(*layers[:-1])


def convnet():
    nn = torch.nn
    return nn.Sequential(nn.Conv2d(3, 32, 3, padding=1), nn.ReLU(),
                         nn.Conv2d(32, 64, 3, stride=2, padding=1), nn.ReLU(),
                         nn.Conv2d(64, 128, 3, stride=2, padding=1), nn.ReLU(),
                         nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(128, 10))


def graph_both_ways(build, shape, keep):
    torch.manual_seed(0)
    model = build().cuda().eval()
    inputs = [torch.randn(*shape, device="cuda") for _ in range(6)]
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.no_grad(), torch.cuda.stream(stream):
        expected = model(inputs[1])
        ours = cugraphrt_torch.graph_module(copy.deepcopy(model), (inputs[0].clone(),),
                                            num_warmup_iters=3)
        compiled = torch.compile(copy.deepcopy(model), mode="reduce-overhead", dynamic=False)
        for x in inputs[:5]:
            compiled(x)
        torch.cuda.synchronize()
        torch.testing.assert_close(ours(inputs[1]), expected)
        torch.testing.assert_close(compiled(inputs[1]).clone(), expected)
    keep += [ours, compiled]


if __name__ == "__main__":
    kept: list = []
    graph_both_ways(mlp, (32, 512), kept)
    graph_both_ways(convnet, (32, 3, 32, 32), kept)
    print("ok")
