"""Partial-network capture: graph a model's sections, keep the loss and optimizer eager.

1. `make_graphed_callables` captures the forward and backward of two sections of an MLP
   (with dropout) into one pool; 20 SGD steps equal those of an eager copy bit for bit.
2. Gradient accumulation: two micro-batches per optimizer step accumulate exactly as eager.
3. Mixed precision: `torch.autocast(cache_enabled=False)` around the graphed calls, and a
   `GradScaler` outside them.

Run: python examples/train_partial_capture.py   (needs a CUDA GPU and a CUDA build of torch)
"""

from __future__ import annotations

import copy
import time

import cugraphrt_torch
import torch
import torch.nn.functional as F

BATCH, D_IN, HIDDEN, CLASSES = 64, 512, 1024, 10


def mlp() -> torch.nn.Sequential:
    torch.manual_seed(0)
    nn = torch.nn
    return nn.Sequential(
        nn.Sequential(nn.Linear(D_IN, HIDDEN), nn.ReLU(), nn.Dropout(0.1)),
        nn.Sequential(nn.Linear(HIDDEN, HIDDEN), nn.ReLU(), nn.Dropout(0.1)),
        nn.Linear(HIDDEN, CLASSES),
    ).cuda()


def graph_sections(model: torch.nn.Sequential, activation=torch.float32) -> None:
    """Graph the two hidden sections in place (they share one pool and run in this order)."""
    x = torch.randn(BATCH, D_IN, device="cuda")
    # The second section's real input is the first one's output, which requires grad and,
    # under autocast, is float16: the sample must say so.
    h = torch.randn(BATCH, HIDDEN, device="cuda", dtype=activation, requires_grad=True)
    cugraphrt_torch.make_graphed_callables((model[0], model[1]), ((x,), (h,)))


def train(model, opt, batches, *, accumulate: int = 1, amp: bool = False, scaler=None) -> float:
    torch.cuda.manual_seed(1)  # the same dropout masks for every model trained here
    torch.cuda.synchronize()
    start = time.perf_counter()
    for i, (x, y) in enumerate(batches):
        with torch.autocast("cuda", enabled=amp, cache_enabled=False):
            loss = F.cross_entropy(model(x), y) / accumulate
        (scaler.scale(loss) if scaler is not None else loss).backward()
        if (i + 1) % accumulate == 0:
            if scaler is not None:
                scaler.step(opt)
                scaler.update()
            else:
                opt.step()
            opt.zero_grad(set_to_none=True)
    torch.cuda.synchronize()
    return (time.perf_counter() - start) / len(batches) * 1e6


def pair(opt_factory):
    eager = mlp()
    graphed = copy.deepcopy(eager)
    return (eager, opt_factory(eager)), (graphed, opt_factory(graphed))


def same(a: torch.nn.Module, b: torch.nn.Module) -> bool:
    return all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters(), strict=False))


def main() -> None:
    if not torch.cuda.is_available():
        raise SystemExit("this example needs a CUDA GPU and a CUDA build of torch")
    torch.backends.cuda.matmul.allow_tf32 = False  # exact comparisons below
    batches = [(torch.randn(BATCH, D_IN, device="cuda"),
                torch.randint(0, CLASSES, (BATCH,), device="cuda")) for _ in range(20)]

    def sgd(m):
        return torch.optim.SGD(m.parameters(), lr=0.05, momentum=0.9)

    (eager, opt_e), (graphed, opt_g) = pair(sgd)
    graph_sections(graphed)
    train(eager, opt_e, batches[:3])  # first-use costs out of the timings
    train(graphed, opt_g, batches[:3])
    eager_us = train(eager, opt_e, batches)
    graphed_us = train(graphed, opt_g, batches)
    assert same(eager, graphed), "graphed training diverged from eager"
    print(f"partial capture: 23 SGD steps, parameters bitwise equal to eager; per step "
          f"eager {eager_us:.0f} us, graphed {graphed_us:.0f} us")

    (eager, opt_e), (graphed, opt_g) = pair(sgd)
    graph_sections(graphed)
    train(eager, opt_e, batches, accumulate=2)
    train(graphed, opt_g, batches, accumulate=2)
    assert same(eager, graphed), "accumulated gradients differ from eager"
    print("gradient accumulation: 2 micro-batches per step, bitwise equal to eager")

    def adam(m):
        return torch.optim.Adam(m.parameters(), lr=1e-3)

    (eager, opt_e), (graphed, opt_g) = pair(adam)
    with torch.autocast("cuda", cache_enabled=False):  # capture under the autocast of the calls
        graph_sections(graphed, activation=torch.float16)
    scalers = [torch.amp.GradScaler("cuda") for _ in range(2)]
    train(eager, opt_e, batches, amp=True, scaler=scalers[0])
    train(graphed, opt_g, batches, amp=True, scaler=scalers[1])
    for p, q in zip(eager.parameters(), graphed.parameters(), strict=False):
        torch.testing.assert_close(p, q, rtol=1e-3, atol=1e-3)
    print(f"autocast + GradScaler: graphed matches eager (scale {scalers[1].get_scale():g})")


if __name__ == "__main__":
    main()
