"""torch.compile(backend="cugraphrt") with shape buckets: every batch size, a few graphs.

A classifier serves requests whose batch size changes from call to call. Dynamo compiles the
model once with a dynamic batch size; with ``options={"buckets": ...}`` the backend replays
one CUDA graph per bucket (here 4, 8, 16 and 32 rows) and runs a batch of ``n`` rows on the
smallest bucket that fits, padding the rest. Results equal eager runs; the report shows which
buckets hold a graph.

Run: python examples/compile_buckets.py   (needs a CUDA GPU and a CUDA build of torch)
"""

from __future__ import annotations

import copy

import cugraphrt_torch
import torch


def main() -> None:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.GELU(),
                                torch.nn.Linear(256, 10)).cuda().eval()
    control = copy.deepcopy(model)
    serve = torch.compile(model, backend="cugraphrt",
                          options={"buckets": "pow2", "max_bucket": 32})
    sizes = [3, 17, 8, 30, 5, 12, 32, 2, 21]
    with torch.no_grad():
        for n in sizes:
            batch = torch.randn(n, 64, device="cuda")
            torch._dynamo.mark_dynamic(batch, 0)  # the batch size varies: one compilation
            torch.testing.assert_close(serve(batch), control(batch), rtol=1e-3, atol=1e-3)
    print(cugraphrt_torch.format_compile_report())
    (report,) = cugraphrt_torch.compile_report()
    assert report.graphed and set(report.buckets) <= {2, 4, 8, 16, 32}, report
    print(f"ok: {len(sizes)} batch sizes served by {report.graphs} graphs "
          f"(buckets {list(report.buckets)}), equal to eager")


if __name__ == "__main__":
    main()
