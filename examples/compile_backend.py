"""torch.compile(backend="cugraphrt"): a decode-like step with an in-place cache, graphed.

The step writes its new row into a KV-cache-like buffer and advances a position counter, in
place: the mutations reduce-overhead gives up on. The backend captures them into the graph,
so every replay updates the cache, and the results equal eager runs of an identical model.

Run: python examples/compile_backend.py   (needs a CUDA GPU and a CUDA build of torch)
"""

from __future__ import annotations

import copy

import cugraphrt_torch
import torch


class Step(torch.nn.Module):
    def __init__(self, width: int = 256, length: int = 64) -> None:
        super().__init__()
        self.mix = torch.nn.Linear(width, width)
        self.register_buffer("cache", torch.zeros(length, width))
        self.register_buffer("position", torch.zeros((), dtype=torch.long))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        row = torch.tanh(self.mix(x))
        self.cache.index_copy_(0, self.position.view(1), row.view(1, -1))  # in place
        self.position.add_(1)
        return row + self.cache.mean(0)


def main() -> None:
    torch.manual_seed(0)
    model = Step().cuda()
    control = copy.deepcopy(model)
    step = torch.compile(model, backend="cugraphrt")  # found by its entry point
    with torch.no_grad():
        for _ in range(32):
            x = torch.randn(256, device="cuda")
            torch.testing.assert_close(step(x), control(x), rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(model.cache, control.cache, rtol=1e-4, atol=1e-4)
    print(cugraphrt_torch.format_compile_report())
    (report,) = cugraphrt_torch.compile_report()
    assert report.graphed and report.replays == 31, report
    print("ok: 32 steps equal eager; the cache and counter updates replay inside the graph")


if __name__ == "__main__":
    main()
