"""What the dynamo backend reads off an AOT graph before running it: mutations, capturability.

Everything here works on the ``torch.fx`` graph AOTAutograd hands to a compiler, whose nodes
carry fake tensors in ``node.meta["val"]``. It runs once per compiled graph, never per call.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import torch
from torch.multiprocessing.reductions import StorageWeakRef

from .._internals import ops as _ops

__all__ = ["mutated_inputs", "uncapturable_reason", "placeholder_names"]

# Ops that wait for the device to hand a value to the host: a capture cannot record them.
_HOST_SYNC_OPS = frozenset({"aten::_local_scalar_dense", "aten::equal", "aten::is_nonzero"})


def placeholder_names(gm: torch.fx.GraphModule) -> list[str]:
    """The graph's input names, in call order."""
    return [node.name for node in gm.graph.find_nodes(op="placeholder")]


def _tensors(value) -> Iterator[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, (list, tuple)):
        for item in value:
            yield from _tensors(item)


def _storage_key(tensor: torch.Tensor):
    return StorageWeakRef(tensor.untyped_storage())


def mutated_inputs(gm: torch.fx.GraphModule) -> frozenset[int]:
    """Indices of the inputs whose memory the graph writes to.

    An op writes to an argument when its schema marks the argument's alias as written (in-place
    and ``out=`` ops, and the ``copy_`` AOTAutograd emits for a kept input mutation). The write
    counts for every input sharing the written tensor's storage, so a write through a view of
    an input counts too.
    """
    owners: dict[object, set[int]] = {}
    mutated: set[int] = set()
    index = 0
    for node in gm.graph.nodes:
        if node.op == "placeholder":
            for tensor in _tensors(node.meta.get("val")):
                owners.setdefault(_storage_key(tensor), set()).add(index)
            index += 1
            continue
        schema = _ops.schema_of(node.target) if node.op == "call_function" else None
        if schema is None:
            continue
        for position, argument in enumerate(schema.arguments):
            alias = argument.alias_info
            if alias is None or not alias.is_write:
                continue
            value = (node.args[position] if position < len(node.args)
                     else node.kwargs.get(argument.name))
            for written in value if isinstance(value, (list, tuple)) else (value,):
                if isinstance(written, torch.fx.Node):
                    for tensor in _tensors(written.meta.get("val")):
                        mutated |= owners.get(_storage_key(tensor), set())
    return frozenset(mutated)


def uncapturable_reason(gm: torch.fx.GraphModule, example_inputs: Sequence[object],
                        names: Sequence[str]) -> str | None:
    """Why the graph cannot run as one CUDA graph, or None if it can.

    Reasons: an input or a result that is not on one CUDA device (CPU work, or work on two
    GPUs), an op that synchronizes with the host, a result whose size depends on data, or no
    CUDA work at all.
    """
    from torch.fx.experimental.symbolic_shapes import free_unbacked_symbols

    devices: set[torch.device] = set()
    for index, value in enumerate(example_inputs):
        if isinstance(value, torch.Tensor):
            if value.device.type != "cuda":
                return f"input '{names[index]}' is on {value.device}"
            devices.add(value.device)
    for node in gm.graph.nodes:
        if node.op != "call_function":
            continue
        schema = _ops.schema_of(node.target)
        if schema is not None and _op_name(schema) in _HOST_SYNC_OPS:
            return f"op '{node.name}' ({_op_name(schema)}) waits for the device"
        for tensor in _tensors(node.meta.get("val")):
            if tensor.device.type != "cuda":
                return f"op '{node.name}' ({node.target}) computes on {tensor.device}"
            devices.add(tensor.device)
            if free_unbacked_symbols(tensor):
                return f"op '{node.name}' ({node.target}) has a data-dependent size"
    if len(devices) > 1:
        return "the graph uses several devices (" + ", ".join(sorted(map(str, devices))) + ")"
    if not devices:
        return "the graph has no CUDA work"
    return None


def _op_name(schema) -> str:
    return schema.name + (f".{schema.overload_name}" if schema.overload_name else "")
