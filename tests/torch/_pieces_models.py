"""The module of the PiecewiseModule tests, CPU and GPU."""

from __future__ import annotations

import torch


class HostRead(torch.nn.Module):
    """Two layers around a value read on the host (as detection's post-processing reads
    counts): the program splits there into two pieces."""

    def __init__(self) -> None:
        super().__init__()
        self.first = torch.nn.Linear(16, 16)
        self.second = torch.nn.Linear(16, 16)

    def forward(self, x):
        y = self.first(x).relu()
        scale = 2.0 if float(y.sum()) > 0 else 3.0  # a host read: a graph break
        return self.second(y) * scale


class Broken(HostRead):
    """HostRead's layers around a statement dynamo does not trace (a graph break that, unlike
    HostRead's, depends on no value): two pieces, compiled once per module."""

    def forward(self, x):
        y = self.first(x).relu()
        torch._dynamo.graph_break()
        return self.second(y)
