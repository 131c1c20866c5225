"""Reading an output after the next call overwrote it: caught, with the call named.

A graphed callable returns its static outputs, so ``y1 = f(x1); y2 = f(x2)`` leaves ``y1``
holding ``f(x2)``: the classic CUDA-graph mistake (docs/reliability.md, "Reading an
overwritten output").

1. torch (on by default): `graph_module` returns fresh tensors over its static outputs; once
   the next call has overwritten them, reading one raises a RuntimeError that names the call
   and the fix. Clones taken before the next call stay valid; `x = graphed(x)` is fine;
   `copy_outputs=True` returns copies that never go stale.
2. CuPy (opt-in, `check_outputs=True`): CuPy cannot intercept reads, so a replay that would
   overwrite an output still referenced is refused with `cugraphrt.OverwrittenOutputError`.
   Loops drop the previous output before the next call.

Run: python examples/stale_outputs.py   (needs a CUDA GPU and a CUDA build of torch)
"""

from __future__ import annotations

import cugraphrt_torch
import cupy
import torch

import cugraphrt


def torch_outputs() -> None:
    torch.manual_seed(0)
    torch.backends.cuda.matmul.allow_tf32 = False  # exact comparisons below
    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.Tanh()).cuda().eval()
    graphed = cugraphrt_torch.graph_module(model, torch.randn(8, 64, device="cuda"))
    x1, x2 = torch.randn(8, 64, device="cuda"), torch.randn(8, 64, device="cuda")

    y1 = graphed(x1)
    kept = y1.clone()  # taken before the next call: stays valid
    y2 = graphed(x2)  # overwrites the memory y1 reads
    try:
        print(y1.sum())
    except RuntimeError as exc:
        print(f"reading y1 after the next call raised:\n  {str(exc).splitlines()[0]}")
    else:
        raise AssertionError("reading an overwritten output should raise")
    with torch.no_grad():
        torch.testing.assert_close(y2, model(x2))
        torch.testing.assert_close(kept, model(x1))

    x = x1
    for _ in range(3):
        x = graphed(x)  # each output is copied in before the replay overwrites it
    with torch.no_grad():
        torch.testing.assert_close(x, model(model(model(x1))))

    copying = cugraphrt_torch.graph_module(model, torch.randn(8, 64, device="cuda"),
                                           copy_outputs=True)
    outs = [copying(x1), copying(x2)]  # copies: both stay valid
    with torch.no_grad():
        torch.testing.assert_close(outs[0], model(x1))
    print("torch: a stale read raised; clones, x = f(x) and copy_outputs=True stay correct")


def cupy_outputs() -> None:
    def step(a):
        return cupy.tanh(a @ a.T)

    sample = cupy.random.standard_normal((32, 32), dtype=cupy.float32)
    graphed = cugraphrt.make_graphed(step, (sample,), check_outputs=True)
    x1, x2 = (cupy.random.standard_normal((32, 32), dtype=cupy.float32) for _ in range(2))

    y1 = graphed(x1)
    try:
        graphed(x2)  # y1 is still referenced: the replay would overwrite it
    except cugraphrt.OverwrittenOutputError as exc:
        print(f"CuPy refused a replay over a referenced output:\n  {exc}")
    else:
        raise AssertionError("the checked mode should refuse the replay")
    del y1

    total = 0.0
    for x in (x1, x2, x1):
        out = graphed(x)
        total += float(out.sum())
        del out  # drop the output before the next call
    expected = sum(float(step(x).sum()) for x in (x1, x2, x1))
    assert abs(total - expected) <= 1e-3 * max(1.0, abs(expected)), (total, expected)
    print("CuPy: the checked loop drops each output before the next call")


def main() -> None:
    if not torch.cuda.is_available():
        raise SystemExit("this example needs a CUDA GPU and a CUDA build of torch")
    torch_outputs()
    cupy_outputs()


if __name__ == "__main__":
    main()
