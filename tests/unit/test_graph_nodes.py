"""The one node walker (cugraphrt._cuda.graph_nodes.walk) on a fake driver: what it lists,
where it descends, and what its readers (kinds, a body's forbidden nodes) make of it."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from cugraphrt._control import bodies
from cugraphrt._cuda import graph_nodes

_PREFIX = "CU_GRAPH_NODE_TYPE_"


class FakeDriver:
    """Graphs and nodes are ints. Graph 1 holds a kernel (10), a child graph (11 -> graph
    2) and a conditional (12 -> bodies 3 and 4); graph 2 holds a memset (20) and a host node
    (21); body 3 an event record (30); body 4 a kernel (40) and a conditional (41) whose
    bodies cannot be read."""

    graphs = {1: [10, 11, 12], 2: [20, 21], 3: [30], 4: [40, 41]}
    kinds = {10: "KERNEL", 11: "GRAPH", 12: "CONDITIONAL", 20: "MEMSET", 21: "HOST",
             30: "EVENT_RECORD", 40: "KERNEL", 41: "CONDITIONAL"}
    children = {11: 2}
    conditions = {12: [3, 4]}

    def cuGraphGetNodes(self, graph, count):
        found = self.graphs[graph]
        return (0, list(found) if count else None, len(found))

    def cuGraphNodeGetType(self, node):
        return (0, SimpleNamespace(name=_PREFIX + self.kinds[node]))

    def cuGraphChildGraphNodeGetGraph(self, node):
        return (0, self.children[node])

    def cuGraphNodeGetParams(self, node):
        if node not in self.conditions:
            return (1, None)  # what an older driver says for a node it cannot describe
        bodies_ = self.conditions[node]
        return (0, SimpleNamespace(conditional=SimpleNamespace(phGraph_out=bodies_,
                                                               size=len(bodies_))))


@pytest.fixture(autouse=True)
def fake_driver(monkeypatch):
    monkeypatch.setattr(graph_nodes, "driver_api", FakeDriver)


def listed(into=None):
    walk = graph_nodes.walk(1) if into is None else graph_nodes.walk(1, into)
    return [(node, kind, inner) for node, kind, inner in walk]


def test_the_walk_descends_into_child_graphs_by_default():
    assert listed() == [(10, "KERNEL", []), (11, "GRAPH", [2]), (20, "MEMSET", []),
                        (21, "HOST", []), (12, "CONDITIONAL", [])]


def test_the_walk_reads_conditional_bodies_when_asked_and_says_which_it_cannot():
    assert listed(graph_nodes.NESTING) == [
        (10, "KERNEL", []), (11, "GRAPH", [2]), (20, "MEMSET", []), (21, "HOST", []),
        (12, "CONDITIONAL", [3, 4]), (30, "EVENT_RECORD", []), (40, "KERNEL", []),
        (41, "CONDITIONAL", None)]


def test_the_top_level_alone():
    assert listed(frozenset()) == [(10, "KERNEL", []), (11, "GRAPH", []),
                                   (12, "CONDITIONAL", [])]


def test_kinds_count_child_graphs_but_not_bodies():
    assert graph_nodes.kinds(1) == sorted(["KERNEL", "GRAPH", "MEMSET", "HOST", "CONDITIONAL"])


def test_a_body_refuses_what_its_child_graphs_hold_naming_who_added_it():
    found = bodies._forbidden(1, {21: "all_reduce"})
    assert found == [("HOST", "all_reduce")]


# -- the rebinding plan's reader of nested graphs, on the walker ------------------------------

def test_an_inputs_address_inside_a_body_is_found_and_an_unreadable_body_counts(monkeypatch):
    from cugraphrt._callables import rebind_plan

    base = 0x7000_0000
    finder = rebind_plan._Finder([(base, base, base + 256)])
    inside = (base + 64).to_bytes(8, "little")
    elsewhere = (0x1234).to_bytes(8, "little")
    raws = {10: [elsewhere], 40: [inside]}
    monkeypatch.setattr(rebind_plan._params, "kernel_params",
                        lambda node: SimpleNamespace(why_not=None, raw=raws[node]))
    monkeypatch.setattr(rebind_plan._params, "set_params",
                        lambda node: SimpleNamespace(dst=0x99))
    # Graph 2 (a child graph: a memset elsewhere, a host node) holds no input address.
    assert not rebind_plan._referenced(2, finder)
    # Graph 1 does: kernel 40 in body 4 of conditional 12 points into the input.
    assert rebind_plan._referenced(1, finder)
    raws[40] = [elsewhere]
    # Now only body 4's second conditional (41), which CUDA does not let us read, is left:
    # a body that cannot be read counts as holding it.
    assert rebind_plan._referenced(1, finder)
    FakeDriver.graphs[4] = [40]
    try:
        assert not rebind_plan._referenced(1, finder)
    finally:
        FakeDriver.graphs[4] = [40, 41]
