"""What a loop or branch body may hold: event nodes of collectives taken out, the rest refused.

NCCL's graph-mixing support brackets a captured collective with a wait on an external event
and a record of it, which CUDA refuses inside conditional bodies (at instantiation, naming
nothing). These tests make the same two nodes without NCCL (``cuEventRecordWithFlags`` with
``CU_EVENT_RECORD_EXTERNAL``, ``cuStreamWaitEvent`` with ``CU_EVENT_WAIT_EXTERNAL``) and
check both paths: issued as a collective (``cugraphrt.adapter.control.collective_call``),
the nodes are taken out and the loop equals eager; issued by user code, the capture fails
at the end of the body with a CaptureError naming the node kinds. A one-rank NCCL
communicator (CuPy) inside a loop body equals eager too.
"""

from __future__ import annotations

import ctypes

import cupy
import numpy as np
import pytest

import cugraphrt
from cugraphrt import CaptureError, Graph, graph
from cugraphrt.adapter import control

pytestmark = pytest.mark.gpu
driver = pytest.importorskip("cuda.bindings.driver")


def _external_events(event) -> None:
    """Record ``event`` and wait on it: in a capture, as cross-graph (external) event nodes
    (the flags are invalid outside one)."""
    stream = cupy.cuda.get_current_stream().ptr
    capturing = cupy.cuda.runtime.streamIsCapturing(stream) != 0
    record = driver.CUevent_record_flags.CU_EVENT_RECORD_EXTERNAL if capturing else 0
    wait = driver.CUevent_wait_flags.CU_EVENT_WAIT_EXTERNAL if capturing else 0
    assert int(driver.cuEventRecordWithFlags(event, stream, record)[0]) == 0
    assert int(driver.cuStreamWaitEvent(stream, event, wait)[0]) == 0


@pytest.fixture
def event():
    cupy.empty(1)  # CUDA's primary context made current here (the driver API needs one)
    err, ev = driver.cuEventCreate(driver.CUevent_flags.CU_EVENT_DISABLE_TIMING)
    assert int(err) == 0
    yield ev
    driver.cuEventDestroy(ev)


def _loop(v, count, event, as_collective: bool):
    def body():
        v[...] = v * 0.5 + 1.0
        if as_collective:
            with control.collective_call("a test collective"):
                _external_events(event)
        else:
            _external_events(event)
        v[...] += count
        cupy.add(count, 1, out=count)

    count[...] = 0
    return cugraphrt.while_loop(lambda: count < 5, body)


def test_event_nodes_of_a_collective_are_taken_out_of_a_body(event):
    v = cupy.arange(64, dtype=cupy.float64)
    count = cupy.zeros((), dtype=cupy.int64)
    _loop(v, count, event, True)  # eager: the events are plain stream work
    want = v.copy()
    g = Graph(keep_graph=True)
    v[...] = cupy.arange(64, dtype=cupy.float64)
    with graph(g):
        n = _loop(v, count, event, True)
    (body,) = g.body_nodes
    assert body.label == "while_loop body" and body.taken_out == 2
    assert "WAIT_EVENT" not in body.kinds and "EVENT_RECORD" not in body.kinds
    assert set(body.kinds) <= {"KERNEL", "MEMCPY", "MEMSET", "EMPTY"}
    for _ in range(3):
        v[...] = cupy.arange(64, dtype=cupy.float64)
        g.replay()
        assert int(n) == 5
        assert bool((v == want).all())
    # the same loop on the host, in float64
    expected = np.arange(64, dtype=np.float64)
    for i in range(5):
        expected = expected * 0.5 + 1.0 + i
    np.testing.assert_array_equal(cupy.asnumpy(v), expected)


def test_event_nodes_of_user_code_in_a_body_are_refused_naming_them(event):
    v = cupy.ones(8)
    count = cupy.zeros((), dtype=cupy.int64)
    _loop(v, count, event, False)
    with pytest.raises(CaptureError, match=r"a while_loop body can hold only kernel, memcpy, "
                       r"memset, empty, child-graph and conditional nodes \(got EVENT_RECORD, "
                       r"WAIT_EVENT nodes\).*cudaEventRecordExternal"):
        with graph(Graph()):
            _loop(v, count, event, False)
    g = Graph()  # the capture was rolled back: the next one works
    with graph(g):
        w = v * 2
    g.replay()
    assert bool((w == v * 2).all())


def test_a_host_node_in_a_branch_is_refused_before_instantiation():
    pred = cupy.asarray(True)
    v = cupy.ones(8)

    callback = ctypes.CFUNCTYPE(None, ctypes.c_void_p)(lambda _: None)
    function = driver.CUhostFn(ctypes.cast(callback, ctypes.c_void_p).value)

    def branch():
        v[...] += 1
        stream = cupy.cuda.get_current_stream().ptr
        assert int(driver.cuLaunchHostFunc(stream, function, 0)[0]) == 0

    with pytest.raises(CaptureError, match=r"a cond body can hold only .* \(got HOST node\)"):
        with graph(Graph()):
            cugraphrt.cond(pred, branch)


def test_a_one_rank_nccl_collective_inside_a_loop_equals_eager(solo):
    coll = solo
    v = cupy.arange(256, dtype=cupy.float32)
    count = cupy.zeros((), dtype=cupy.int64)

    def body():
        coll.all_reduce(v, out=v)
        v[...] = v * 0.5 + 1
        cupy.add(count, 1, out=count)

    def work():
        v[...] = cupy.arange(256, dtype=cupy.float32)
        count[...] = 0
        return cugraphrt.while_loop(lambda: count < 6, body)

    work()
    want = v.copy()
    g = Graph()
    with graph(g):
        n = work()
    assert all(set(b.kinds) <= {"KERNEL", "MEMCPY", "MEMSET", "EMPTY"} for b in g.body_nodes)
    g.replay()
    assert int(n) == 6 and bool((v == want).all())
