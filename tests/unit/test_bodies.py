"""Loop and branch bodies, without a GPU: what a collective adds is taken out keeping the
order, what a body cannot hold is refused by name, collectives are recorded with their body,
and the distributed runs take one rank per GPU present."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from cugraphrt import CaptureError
from cugraphrt._control import bodies
from cugraphrt.bench.workloads_distributed import world_size
from cugraphrt.distributed.crossrank import first_difference
from cugraphrt.distributed.log import Collective, CollectiveLog


class FakeGraph:
    """A graph of named nodes with edges, standing in for cuda-bindings handles."""

    def __init__(self, kinds: dict[str, str], edges: list[tuple[str, str]]) -> None:
        self.kinds = dict(kinds)
        self.edges = set(edges)

    def remove_keeping_order(self, _graph, node: str) -> None:
        before = [a for a, b in self.edges if b == node]
        after = [b for a, b in self.edges if a == node]
        self.edges = {(a, b) for a, b in self.edges if node not in (a, b)}
        self.edges |= {(a, b) for a in before for b in after}
        del self.kinds[node]


@pytest.fixture
def fake(monkeypatch):
    graph = FakeGraph({"k1": "KERNEL", "wait": "WAIT_EVENT", "nccl": "KERNEL",
                       "record": "EVENT_RECORD", "k2": "KERNEL"},
                      [("k1", "wait"), ("wait", "nccl"), ("nccl", "record"), ("record", "k2")])
    nodes = SimpleNamespace(
        EVENT_KINDS=frozenset({"WAIT_EVENT", "EVENT_RECORD"}),
        NOT_IN_BODIES=frozenset({"HOST", "WAIT_EVENT", "EVENT_RECORD"}),
        nodes=lambda g: list(graph.kinds), kind=lambda n: graph.kinds[n], key=lambda n: n,
        kinds=lambda g: sorted(graph.kinds.values()), child_graph=lambda n: None,
        walk=lambda g: [(n, k, []) for n, k in list(graph.kinds.items())],
        remove_keeping_order=graph.remove_keeping_order)
    monkeypatch.setattr(bodies, "_nodes", nodes)
    return graph


def _body(label: str = "while_loop body") -> bodies.Body:
    return bodies.Body(SimpleNamespace(bodies=[]), 0, "g", label)


def test_event_nodes_a_collective_added_are_taken_out_keeping_the_order(fake):
    body = _body()
    body.added.append(("all_reduce float32[8] sum on group '0'", ["wait", "nccl", "record"]))
    report = bodies.finish(body)
    assert report == bodies.BodyNodes("while_loop body", ("KERNEL", "KERNEL", "KERNEL"), 2)
    assert fake.edges == {("k1", "nccl"), ("nccl", "k2")}
    assert body.capture.bodies == [report]


def test_event_nodes_of_user_code_are_refused_naming_them(fake):
    with pytest.raises(CaptureError) as info:
        bodies.finish(_body("cond body"))
    message = str(info.value)
    assert message.startswith("a cond body can hold only kernel, memcpy, memset, empty, "
                              "child-graph and conditional nodes (got EVENT_RECORD, "
                              "WAIT_EVENT nodes)"), message
    assert "cudaEventWaitExternal" in message and "added by" not in message


def test_a_host_node_a_collective_added_names_the_collective_and_the_fix(fake):
    fake.kinds["proxy"] = "HOST"
    body = _body()
    body.added.append(("all_gather float32[8] on group 'x'", ["wait", "proxy", "record"]))
    with pytest.raises(CaptureError) as info:
        bodies.finish(body)
    message = str(info.value)
    assert "(got HOST node added by all_gather float32[8] on group 'x')" in message
    assert "Issue this collective outside the loop or branch" in message
    assert "WAIT_EVENT" not in message  # those two were taken out


def test_collective_call_outside_bodies_does_nothing():
    assert bodies.innermost() is None and bodies.scope() == ""
    with bodies.collective_call("anything"):
        pass


def test_collectives_are_recorded_with_the_bodies_they_are_issued_in():
    log = CollectiveLog(exchanger=None)
    stack = bodies.open_bodies()
    entry = Collective("all_reduce", "float32", 8, "0", "sum")
    log.add(entry)
    stack.extend([_body("while_loop body"), _body("cond body")])
    try:
        log.add(entry)
    finally:
        del stack[:]
    top, inner = log.entries
    assert top.scope == "" and inner.scope == "while_loop body > cond body"
    assert inner.describe() == ("all_reduce float32[8] sum on group '0' in a "
                                "while_loop body > cond body")
    # The same collective inside a body and outside differs between ranks.
    assert first_difference({0: [top], 1: [inner]}) == (0, {0: top, 1: inner})
    assert first_difference({0: [inner], 1: [inner]}) is None


@pytest.mark.parametrize("gpus, env, world", [
    (0, {}, 0), (1, {}, 0), (2, {}, 2), (3, {}, 2), (4, {}, 4), (7, {}, 4), (8, {}, 8),
    (16, {}, 8), (4, {"CUGRAPHRT_WORLD": "2"}, 2), (2, {"CUGRAPHRT_WORLD": "4"}, 0),
])
def test_the_distributed_runs_take_one_rank_per_gpu_present(gpus, env, world):
    assert world_size(gpus, env) == world


def test_a_bad_world_setting_is_refused():
    with pytest.raises(ValueError, match="CUGRAPHRT_WORLD must be an integer >= 2"):
        world_size(4, {"CUGRAPHRT_WORLD": "1"})
