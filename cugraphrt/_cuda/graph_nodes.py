"""The nodes of a graph definition: listing them, their kinds, walking into the graphs nested
in them, and taking one out.

cugraphrt reads the nodes of conditional bodies (see :mod:`cugraphrt._control.bodies`).
CUDA lets a body hold kernel, memcpy, memset, empty, child-graph and conditional nodes only,
and refuses anything else late and mutely: ``cuGraphInstantiate`` of the whole graph fails
with ``CUDA_ERROR_INVALID_VALUE``, naming no node. NCCL's collectives add two such nodes
when its graph-mixing support is on (the default): a wait on, and a record of, an external
event that order graph launches with the communicator's eager launches.

Everything goes through NVIDIA's ``cuda-bindings`` (driver API) and
:func:`cugraphrt._cuda.runtime.error_from_status`, as :mod:`cugraphrt._cuda.conditional` does.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from cugraphrt._cuda.conditional import driver_api, unpack

__all__ = ["NOT_IN_BODIES", "EVENT_KINDS", "NESTING", "nodes", "kind", "key", "kinds",
           "child_graph", "nested", "walk", "remove_keeping_order"]

#: Node kinds a conditional body cannot hold (CUDA 12.4 to 13: the body may hold kernel,
#: memcpy, memset, empty, child-graph and conditional nodes). A deny-list, so that a kind a
#: later CUDA allows is not refused here.
NOT_IN_BODIES = frozenset({"HOST", "WAIT_EVENT", "EVENT_RECORD", "EXT_SEMAS_SIGNAL",
                           "EXT_SEMAS_WAIT", "MEM_ALLOC", "MEM_FREE"})
#: The kinds NCCL's graph-mixing support adds around a captured collective.
EVENT_KINDS = frozenset({"WAIT_EVENT", "EVENT_RECORD"})
#: The kinds that hold graphs of their own: a child graph, a conditional node's bodies.
NESTING = frozenset({"GRAPH", "CONDITIONAL"})
_PREFIX = "CU_GRAPH_NODE_TYPE_"


def nodes(graph: Any) -> list:
    """Every node of ``graph`` (a ``CUgraph``), in no particular order."""
    driver = driver_api()
    count = unpack(driver.cuGraphGetNodes(graph, 0), "cuGraphGetNodes")[-1]
    if not count:
        return []
    found = unpack(driver.cuGraphGetNodes(graph, count), "cuGraphGetNodes")[0]
    return [node for node in found if int(node)]


def kind(node: Any) -> str:
    """The node's kind without CUDA's prefix: ``KERNEL``, ``WAIT_EVENT``, ``GRAPH``, ..."""
    found = unpack(driver_api().cuGraphNodeGetType(node), "cuGraphNodeGetType")
    name = getattr(found, "name", str(found))
    return name[len(_PREFIX):] if name.startswith(_PREFIX) else name


def key(node: Any) -> int:
    """A hashable identity of a node (its handle)."""
    return int(node)


def child_graph(node: Any) -> Any:
    """The graph embedded in a child-graph (``GRAPH``) node."""
    return unpack(driver_api().cuGraphChildGraphNodeGetGraph(node),
                  "cuGraphChildGraphNodeGetGraph")


def nested(node: Any, node_kind: str) -> list | None:
    """The graphs inside a child-graph or conditional node; None if CUDA does not say (a
    cuda-bindings too old to read a conditional node's parameters)."""
    if node_kind == "GRAPH":
        return [child_graph(node)]
    try:
        result = driver_api().cuGraphNodeGetParams(node)
        if int(result[0]):
            return None
        cond = result[1].conditional
        return [cond.phGraph_out[i] for i in range(int(cond.size))]
    except Exception:  # noqa: BLE001 - an older cuda-bindings: the bodies stay unread
        return None


def walk(graph: Any, into: frozenset[str] = frozenset({"GRAPH"})) -> Iterator[tuple[Any, str,
                                                                                  list | None]]:
    """``(node, kind, inner)`` for every node of ``graph``, each followed by the nodes of the
    graphs nested in it when its kind is in ``into`` (child graphs by default; ``NESTING``
    for conditional bodies too; ``frozenset()`` for the top level only). ``inner`` is the
    list of nested graphs of a nesting node (None where CUDA does not say), else ``[]``: the
    one place that lists, classifies and descends, for every reader of a graph's nodes."""
    for node in nodes(graph):
        name = kind(node)
        inner = nested(node, name) if name in NESTING and name in into else []
        yield node, name, inner
        for graph_inside in inner or ():
            yield from walk(graph_inside, into)


def kinds(graph: Any) -> list[str]:
    """The kinds of ``graph``'s nodes and of its child graphs' nodes, sorted."""
    return sorted(name for _, name, _ in walk(graph))


def _neighbours(node: Any, call: str) -> list:
    fn = getattr(driver_api(), call)
    count = unpack(fn(node, 0), call)[-1]
    return [n for n in unpack(fn(node, count), call)[0] if int(n)] if count else []


def remove_keeping_order(graph: Any, node: Any) -> None:
    """Destroy ``node``, making every node it depended on a dependency of every node that
    depended on it: what ran before it still runs before what ran after it."""
    driver = driver_api()
    before = _neighbours(node, "cuGraphNodeGetDependencies")
    after = _neighbours(node, "cuGraphNodeGetDependentNodes")
    unpack(driver.cuGraphDestroyNode(node), "cuGraphDestroyNode")
    pairs: list[tuple[Any, Any]] = []
    for succ in after:
        have = {key(n) for n in _neighbours(succ, "cuGraphNodeGetDependencies")}
        pairs.extend((pred, succ) for pred in before if key(pred) not in have)
    if pairs:
        froms, tos = [p for p, _ in pairs], [s for _, s in pairs]
        import cuda.bindings

        # cuda-bindings 13 takes the edge data (None: default edges) that 12 did not.
        edges = (None,) if int(cuda.bindings.__version__.split(".")[0]) >= 13 else ()
        unpack(driver.cuGraphAddDependencies(graph, froms, tos, *edges, len(pairs)),
               "cuGraphAddDependencies")
