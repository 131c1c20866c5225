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


class HostAnchors(torch.nn.Module):
    """An SSD-like forward: boxes made on the CPU, on every call, from tensors the module
    holds on the CPU (a plain list, as torchvision's anchor generator holds its
    ``wh_pairs``), then copied to the device and added to the layers' output."""

    def __init__(self) -> None:
        super().__init__()
        self.first = torch.nn.Linear(16, 16)
        self.second = torch.nn.Linear(16, 4)
        self.wh_pairs = [torch.tensor([[0.1, 0.2], [0.3, 0.4]]),
                         torch.tensor([[0.5, 0.6], [0.7, 1.2]])]

    def boxes(self):
        pairs = [p.clamp(min=0, max=1) for p in self.wh_pairs]
        centres = torch.arange(4, dtype=torch.float32).div(4).repeat_interleave(2)
        return torch.cat([torch.cat(pairs), torch.stack([centres[:4], centres[4:]], 1)], 1)

    def forward(self, x):
        y = self.second(self.first(x).relu())
        return y + self.boxes().to(x.device).sum(0)
