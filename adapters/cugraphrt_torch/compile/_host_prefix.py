"""The host work at the head of an inference graph, split off so that the rest can be graphed.

A forward may compute a tensor on the CPU from tensors that existed before it was called and
copy the result to the device: torchvision's SSD builds its default boxes from its anchor
generator's CPU ``wh_pairs`` on every call, then ``.to(device)``. Dynamo traces that into the
same graph as the backbone and the heads, and a capture cannot take it: the CPU tensors may
change between calls, and a capture would bake the values it saw (the core stages only CPU
tensors made inside the capture, see ``capture._host_constants``). So the whole graph ran
eagerly: 0.3% of an SSD's kernel time ran in graphs.

:func:`split_host_prefix` takes the CPU work out instead: every node that computes on the CPU
from CPU inputs, constants and sizes, and every copy of such a value to the device, goes into
a prefix that runs eagerly on each call, reading the CPU tensors' values of that call, as
eager does. The rest, the device work, becomes a graph of its own whose extra inputs are the
prefix's device copies, which the piece copies in like any input. The split is refused
(None) where a device node reads a CPU value other than through such a copy (a 0-d CPU
tensor as a scalar operand, say) or where the CPU work depends on device values (a read back
to the host): the graph then runs as it was.

It runs once per compiled graph, never per call: the prefix is an ``fx.GraphModule``, called
by :class:`HostPrefixed` before the graph's piece.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch

__all__ = ["HostPrefix", "HostPrefixed", "split_host_prefix"]

#: Where the prefix runs: values on this device type are host values.
HOST = "cpu"


@dataclass(frozen=True)
class HostPrefix:
    """An inference graph cut in two (see the module)."""

    #: Takes the original inputs at ``prefix_inputs``; returns the device graph's extra inputs
    #: (its first ``copies`` outputs), then the host values the original graph returns.
    prefix: torch.fx.GraphModule
    #: Takes the original inputs at ``device_inputs``, then the prefix's copies.
    device: torch.fx.GraphModule
    prefix_inputs: tuple[int, ...]
    device_inputs: tuple[int, ...]
    copies: int
    #: Per output of the original graph: ``(True, i)``, the device graph's output ``i``;
    #: ``(False, i)``, the prefix's output ``i``; None for a None output.
    outputs: tuple[tuple[bool, int] | None, ...]
    #: The device graph's example inputs (the original ones, then the copies' fake values).
    example_inputs: tuple[Any, ...]
    #: The copies' names (``host prefix: <node>``), for reports and errors.
    copy_names: tuple[str, ...]


class HostPrefixed:
    """What AOTAutograd calls in place of a split graph: the prefix eagerly, then ``piece``
    (the device graph's runtime) on the original device inputs and the prefix's copies."""

    def __init__(self, split: HostPrefix, piece: Callable[[list], Any]) -> None:
        self._boxed_call = True  # an instance attribute, as AotGraph's (see there)
        self._prefix = split.prefix
        self._prefix_inputs = split.prefix_inputs
        self._device_inputs = split.device_inputs
        self._copies = split.copies
        self._outputs = split.outputs
        self.piece = piece

    def __call__(self, args: list) -> list:
        made = self._prefix(*[args[i] for i in self._prefix_inputs])
        inner = [args[i] for i in self._device_inputs]
        inner.extend(made[:self._copies])
        out = self.piece(inner)
        return [None if where is None else (out[where[1]] if where[0] else made[where[1]])
                for where in self._outputs]


def _nodes_in(value: Any) -> Iterator[torch.fx.Node]:
    if isinstance(value, torch.fx.Node):
        yield value
    elif isinstance(value, (list, tuple)):
        for item in value:
            yield from _nodes_in(item)
    elif isinstance(value, dict):
        for item in value.values():
            yield from _nodes_in(item)


def _devices(value: Any) -> set[str]:
    if isinstance(value, torch.Tensor):
        return {value.device.type}
    if isinstance(value, (list, tuple)):
        return set().union(*(_devices(item) for item in value)) if value else set()
    return set()


def _inputs_of(node: torch.fx.Node) -> list[torch.fx.Node]:
    return list(_nodes_in(node.args)) + list(_nodes_in(node.kwargs))


def _value(gm: torch.fx.GraphModule, node: torch.fx.Node) -> Any:
    if node.op == "get_attr":  # a constant of the graph: its device is the tensor's own
        target: Any = gm
        for part in str(node.target).split("."):
            target = getattr(target, part)
        return target
    return node.meta.get("val")


def split_host_prefix(gm: torch.fx.GraphModule,
                      example_inputs: Sequence[Any]) -> HostPrefix | None:
    """``gm`` cut into its host prefix and its device graph, or None where there is no host
    work to take out or it cannot be taken out (see the module)."""
    host: set[torch.fx.Node] = set()     # computed on the host: CPU tensors, host values
    copies: set[torch.fx.Node] = set()   # device tensors copied from host values
    either: set[torch.fx.Node] = set()   # inputs that are no tensor (sizes): both sides
    placeholders = list(gm.graph.find_nodes(op="placeholder"))
    for node in gm.graph.nodes:
        if node.op == "output":
            continue
        found = _devices(_value(gm, node))
        if node.op == "placeholder":
            if found == {HOST}:
                host.add(node)
            elif not found:
                either.add(node)
            continue
        sources = _inputs_of(node)
        if any(s not in host and s not in either for s in sources):
            continue  # reads a device value: device work (or a read back, refused below)
        from_host = any(s in host for s in sources)
        if found == {HOST} or (not found and from_host):
            host.add(node)  # a CPU tensor, or a value read off one (its size, an item of it)
        elif found and HOST not in found and from_host:
            copies.add(node)
        # Else device work: a device tensor made from sizes alone, or arithmetic on sizes.
    if not copies and not host - set(placeholders):
        return None
    hoisted = (host | copies) - set(placeholders)
    device_nodes = [n for n in gm.graph.nodes
                    if n.op not in ("placeholder", "output") and n not in hoisted]
    # What crosses from the prefix: only device copies, into device nodes.
    crossing: list[torch.fx.Node] = []
    for node in device_nodes:
        for source in _inputs_of(node):
            if source in copies:
                if source not in crossing:
                    crossing.append(source)
            elif source in host:
                return None  # a host value read by device work: not a copy
    if not crossing:
        return None  # nothing the device work needs: the host work is not what stops it
    (output,) = gm.graph.find_nodes(op="output")
    results = output.args[0]
    if not isinstance(results, (list, tuple)) or not all(
            r is None or isinstance(r, torch.fx.Node) for r in results):
        return None  # outputs other than a flat list of values: not an AOT graph's
    returned = [n for n in _nodes_in(results) if n in hoisted or n in host]
    if any(n in placeholders for n in returned):
        return None  # an input handed back as it is: leave such graphs as they are
    handed = crossing + [n for n in dict.fromkeys(returned) if n not in crossing]

    prefix = torch.fx.Graph()
    env: dict[torch.fx.Node, torch.fx.Node] = {}
    used = {s for n in hoisted for s in _inputs_of(n)}
    prefix_inputs = []
    for index, node in enumerate(placeholders):
        if node in used:
            env[node] = prefix.placeholder(node.name)
            env[node].meta = dict(node.meta)
            prefix_inputs.append(index)
    for node in gm.graph.nodes:
        if node in hoisted:
            env[node] = prefix.node_copy(node, env.__getitem__)
    prefix.output(tuple(env[n] for n in handed))

    device = torch.fx.Graph()
    env = {}
    needed = {s for n in device_nodes for s in _inputs_of(n)} | set(_nodes_in(results))
    device_inputs, example = [], []
    for index, node in enumerate(placeholders):
        if node in needed and node not in host:
            env[node] = device.placeholder(node.name)
            env[node].meta = dict(node.meta)
            device_inputs.append(index)
            example.append(example_inputs[index])
    for node in crossing:
        env[node] = device.placeholder(f"host_prefix_{node.name}")
        env[node].meta = dict(node.meta)
        example.append(node.meta.get("val"))
    for node in device_nodes:
        env[node] = device.node_copy(node, env.__getitem__)
    device_outputs = [n for n in dict.fromkeys(_nodes_in(results)) if n not in handed]
    device.output(tuple(env[n] for n in device_outputs))

    def where(node: Any) -> tuple[bool, int] | None:
        if node is None:
            return None
        if node in handed:
            return (False, handed.index(node))
        return (True, device_outputs.index(node))

    return HostPrefix(
        prefix=torch.fx.GraphModule(gm, prefix), device=torch.fx.GraphModule(gm, device),
        prefix_inputs=tuple(prefix_inputs), device_inputs=tuple(device_inputs),
        copies=len(crossing), outputs=tuple(where(r) for r in results),
        example_inputs=tuple(example),
        copy_names=tuple(f"host prefix: {n.name}" for n in crossing))
