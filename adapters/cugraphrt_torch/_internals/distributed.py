"""torch.distributed internals. Tested on torch 2.11 (NCCL, 2 H200s) and 2.11 to 2.14 (CPU,
gloo)."""

from __future__ import annotations

from typing import Any

__all__ = ["process_group_class", "default_group", "default_group_name", "default_store",
           "script_type_name", "resolve_process_group", "reduce_op_kind"]


def process_group_class() -> Any:
    """The C10d ``ProcessGroup`` class (``torch._C._distributed_c10d.ProcessGroup``, what
    ``torch.distributed.ProcessGroup`` re-exports since torch 2.0); raises ImportError
    on builds without distributed support."""
    from torch._C._distributed_c10d import ProcessGroup

    return ProcessGroup


def default_group() -> Any:
    """The default process group (``distributed_c10d._get_default_group()``, the same since
    torch 2.0); raises if no process group is initialized."""
    import torch.distributed

    return torch.distributed.distributed_c10d._get_default_group()


def default_group_name() -> str:
    """The default process group's name; raises if none is initialized."""
    return str(default_group().group_name)


def default_store() -> Any:
    """The default process group's key-value store (``distributed_c10d.
    _get_default_store()``, the same since torch 2.0); raises if none is initialized."""
    import torch.distributed

    return torch.distributed.distributed_c10d._get_default_store()


def script_type_name(value: Any) -> str:
    """A TorchBind object's qualified type name (``value._type().qualified_name()``, e.g.
    ``__torch__.torch.classes.c10d.ProcessGroup``); "" for anything else."""
    try:
        return value._type().qualified_name()
    except Exception:  # noqa: BLE001 - not a TorchBind object
        return ""


def resolve_process_group(name: str) -> Any:
    """The process group registered under ``name`` (``distributed_c10d.
    _resolve_process_group``, what functional collectives resolve their group argument with;
    torch 2.3 on)."""
    import torch.distributed

    resolve: Any = torch.distributed.distributed_c10d._resolve_process_group  # typed GroupName
    return resolve(name)


def reduce_op_kind(op: Any) -> int | None:
    """The ``ReduceOp.RedOpType`` value of a ``c10d::ReduceOp`` TorchBind object, as a c10d
    operator receives it, or None where torch does not expose it: torch 2.11 to 2.14 give
    the object an ``op()`` method; torch 2.8's has none (nothing of it is readable)."""
    try:
        if not op._has_method("op"):
            return None
        return int(op.op())
    except Exception:  # noqa: BLE001 - not a ReduceOp object this torch can read
        return None
