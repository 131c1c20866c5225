"""Whole-step capture: forward, loss, backward and optimizer step as one graph.

The recipe of PyTorch's whole-network capture, on cugraphrt: static input and target
tensors, a few eager warm-up steps on the capture stream, one capture of the whole training
step with a capturable optimizer (`Adam(capturable=True)`; SGD needs no flag), then one
replay per step after copying the batch into the static tensors. The run checks itself
against an eager copy that takes the same steps.

Run: python examples/train_whole_step.py   (needs a CUDA GPU and a CUDA build of torch)
"""

from __future__ import annotations

import copy
import time

import cugraphrt_torch
import torch

import cugraphrt

BATCH, D_IN, HIDDEN, D_OUT, STEPS, WARMUP = 64, 256, 512, 16, 50, 3


def make_model() -> torch.nn.Module:
    torch.manual_seed(0)
    nn = torch.nn
    return nn.Sequential(nn.Linear(D_IN, HIDDEN), nn.ReLU(), nn.Linear(HIDDEN, HIDDEN),
                         nn.ReLU(), nn.Linear(HIDDEN, D_OUT)).cuda()


def eager_step(model, opt, loss_fn, x, y) -> torch.Tensor:
    opt.zero_grad(set_to_none=True)
    loss = loss_fn(model(x), y)
    loss.backward()
    opt.step()
    return loss


def main() -> None:
    if not torch.cuda.is_available():
        raise SystemExit("this example needs a CUDA GPU and a CUDA build of torch")
    torch.backends.cuda.matmul.allow_tf32 = False  # exact comparison with eager below
    loss_fn = torch.nn.MSELoss()
    model = make_model()
    control = copy.deepcopy(model)
    # capturable=True keeps Adam's step count on the GPU, so the step needs no host sync.
    opt = torch.optim.Adam(model.parameters(), lr=1e-3, capturable=True)
    opt_c = torch.optim.Adam(control.parameters(), lr=1e-3, capturable=True)
    static_x = torch.randn(BATCH, D_IN, device="cuda")
    static_y = torch.randn(BATCH, D_OUT, device="cuda")

    # Warm up on the stream the capture will use: optimizer state, cuBLAS handles and
    # workspaces are created here and not inside the capture. These are real steps.
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(WARMUP):
            eager_step(model, opt, loss_fn, static_x, static_y)
            eager_step(control, opt_c, loss_fn, static_x, static_y)
    torch.cuda.current_stream().wait_stream(stream)

    # Gradients set to None before the capture: backward allocates them from the graph's
    # pool, and every replay writes them at the same addresses.
    opt.zero_grad(set_to_none=True)
    step = cugraphrt.Graph()
    with cugraphrt_torch.graph(step, stream=stream):
        static_loss = loss_fn(model(static_x), static_y)
        static_loss.backward()
        opt.step()

    batches = [(torch.randn(BATCH, D_IN, device="cuda"), torch.randn(BATCH, D_OUT, device="cuda"))
               for _ in range(STEPS)]
    current = torch.cuda.current_stream()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for x, y in batches:
        static_x.copy_(x)
        static_y.copy_(y)
        step.replay(current)  # on torch's stream, after the copies
    torch.cuda.synchronize()
    graphed_us = (time.perf_counter() - start) / STEPS * 1e6
    last = static_loss.item()

    start = time.perf_counter()
    for x, y in batches:
        loss = eager_step(control, opt_c, loss_fn, x, y)
    torch.cuda.synchronize()
    eager_us = (time.perf_counter() - start) / STEPS * 1e6

    for p, q in zip(model.parameters(), control.parameters(), strict=False):
        torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(last, loss.item(), rtol=1e-5, atol=1e-6)
    print(f"whole-step capture: {STEPS} Adam steps as one graph each, equal to eager "
          f"(last loss {last:.5f})")
    print(f"  per step: eager {eager_us:.0f} us, one replay {graphed_us:.0f} us")
    print(f"  pool: {step.pool()}")


if __name__ == "__main__":
    main()
