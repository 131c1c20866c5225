"""Autograd internals, read once at import for the training replay's hot path. Tested on
torch 2.11 (CUDA) and 2.11 to 2.14 (CPU)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

__all__ = ["grad_enabled", "set_grad_enabled", "any_autocast", "functorch_active",
           "function_apply"]

#: ``torch._C.is_grad_enabled``: ``torch.is_grad_enabled`` without the Python frame.
grad_enabled: Callable[[], bool] = torch._C.is_grad_enabled
#: ``torch._C._set_grad_enabled(mode)``: what ``torch.set_grad_enabled`` calls.
set_grad_enabled: Callable[[bool], None] = torch._C._set_grad_enabled
#: Whether any autocast is on: ``torch._C._is_any_autocast_enabled`` (torch 2.4 on), else
#: ``torch.is_autocast_enabled`` (CUDA autocast only).
any_autocast: Callable[[], bool] = (getattr(torch._C, "_is_any_autocast_enabled", None)
                                    or torch.is_autocast_enabled)
#: ``torch._C._are_functorch_transforms_active``: whether vmap or grad transforms are on.
functorch_active: Callable[[], bool] = torch._C._are_functorch_transforms_active


def function_apply() -> Any:
    """The C ``apply`` of ``torch.autograd.Function`` (``torch._C._FunctionBase``'s, which
    ``Function.apply`` wraps in Python for functorch; None where it is not a plain
    attribute)."""
    return torch._C._FunctionBase.__dict__.get("apply")
