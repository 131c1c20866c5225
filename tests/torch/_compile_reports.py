"""The compile reports of the pieces one test compiled, with dynamo reset around the test."""

from __future__ import annotations

import gc


class CompileReports:
    """Call it for the reports of the pieces compiled since :meth:`start` (this test's)."""

    def __init__(self) -> None:
        self.first = 0

    def start(self) -> None:
        """Reset dynamo; later pieces are this test's (region numbers only grow)."""
        import torch
        from cugraphrt_torch.compile import dynamo

        torch._dynamo.reset()
        gc.collect()
        self.first = next(dynamo._region_ids) + 1

    def around_test(self):
        """The body of an autouse fixture: start before the test, reset after it."""
        import torch

        self.start()
        yield
        torch._dynamo.reset()

    def __call__(self) -> list:
        import cugraphrt_torch

        return [r for r in cugraphrt_torch.compile_report()
                if int(r.name.split()[1]) >= self.first]
