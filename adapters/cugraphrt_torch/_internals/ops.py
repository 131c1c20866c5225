"""Operator internals: an ATen operator's schema. Tested on torch 2.11 to 2.14."""

from __future__ import annotations

from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode as _TorchDispatchMode

__all__ = ["TorchDispatchMode", "schema_of", "op_name", "argument_names", "is_aten_overload",
           "overload_name"]

#: The base class of a mode that sees every operation dispatched while it is active
#: (``torch.utils._python_dispatch.TorchDispatchMode``; the same since torch 2.0, and the
#: documented way to write one, though its module is private).
TorchDispatchMode = _TorchDispatchMode


def schema_of(target: Any) -> Any:
    """The ``torch._C.FunctionSchema`` of an operator overload (``OpOverload._schema``), or
    None for anything else (a Python function, a builtin)."""
    return getattr(target, "_schema", None)


def op_name(func: Any) -> str:
    """An operator's name without its namespace (``func._schema.name`` after ``::``):
    ``"allreduce_"`` for ``c10d::allreduce_``."""
    return func._schema.name.split("::", 1)[1]


def argument_names(func: Any) -> list[str]:
    """The names of an operator's arguments, in order (``func._schema.arguments``)."""
    return [a.name for a in func._schema.arguments]


def is_aten_overload(target: Any) -> bool:
    """Whether ``target`` is an overload of an ATen operator (``torch._ops.OpOverload``,
    the class FX graphs' ``call_function`` nodes hold since torch 2.0)."""
    return isinstance(target, torch._ops.OpOverload) and target.namespace == "aten"


def overload_name(target: Any) -> str:
    """An overload's name within its packet: ``"default"``, ``"Tensor_Scalar"``
    (``OpOverload._overloadname``, the same since torch 2.0)."""
    return target._overloadname
