"""Graph.launcher on fake devices: zero Python frames per call, and its contract when the graph
changes under it (reset, instantiate, release, pool checks, adopted graphs, other devices)."""

from __future__ import annotations

import copy
import gc
import pickle
import weakref

import pytest

import cugraphrt
from cugraphrt import CaptureError, Launcher, PoolOrderError, ReplayError
from cugraphrt._cuda import runtime as _cuda
from cugraphrt._memory.backing import capture_activity
from cugraphrt._memory.replay_order import ReplayOrder

from .fake_devices import FakeDevices, Stream, call_profile
from .fakes import FakeBackingAllocator
from .test_pool import capture


@pytest.fixture
def fake(monkeypatch):
    return FakeDevices(monkeypatch, count=2)


@pytest.fixture
def executables(monkeypatch, fake):
    """Fake instantiate/destroy: executables 0xE0, 0xE1, ...; ``live`` holds the undestroyed
    ones, and a launch of a destroyed one fails the test."""
    state = {"next": 0xE0, "live": set(), "fail": False}

    def launch(exec_handle, ptr):
        assert exec_handle in state["live"], f"launch of destroyed executable 0x{exec_handle:x}"
        fake.launch(exec_handle, ptr)

    def instantiate(graph_handle):
        if state["fail"]:
            raise CaptureError("cudaGraphInstantiate failed (got a fake failure)")
        handle, state["next"] = state["next"], state["next"] + 1
        state["live"].add(handle)
        return handle

    def destroy_exec(handle):
        state["live"].discard(handle)

    monkeypatch.setattr(_cuda, "instantiate", instantiate)
    monkeypatch.setattr(_cuda, "destroy_exec", destroy_exec)
    monkeypatch.setattr(_cuda, "destroy_graph", lambda handle: None)
    monkeypatch.setattr(_cuda, "graph_launch", launch)
    return state


def kept_graph(executables, device=0):
    """A Graph with a kept definition (fake handle 0x6), instantiated once."""
    g = cugraphrt.Graph(keep_graph=True)
    g._captured, g._device, g._handles.graph = True, device, 0x6
    g.instantiate()
    return g


def test_a_launch_runs_no_python_frame(fake):
    g = fake.graph(device=0, exec_handle=0xE0)
    launch = g.launcher()
    assert isinstance(launch, Launcher) and launch.alive and launch.graph is g
    profile = call_profile(launch)
    assert profile.frames == [] and profile.c_calls == ["cudaGraphLaunch"]
    assert fake.launches == [(0xE0, 0x100, 0)]
    assert launch.stream_ptr == 0x100 and "on stream 0x100" in repr(launch)


def test_the_stream_is_fixed_when_the_launcher_is_made(fake):
    g = fake.graph(device=0, exec_handle=0xE0)
    launch = g.launcher()
    fake.streams[0] = Stream(0x500, device_id=0)  # a later `with stream:`
    launch()
    g.replay()
    assert fake.launches == [(0xE0, 0x100, 0), (0xE0, 0x500, 0)]
    explicit = g.launcher(Stream(0x600, device_id=0))
    by_handle = g.launcher(0x700)
    explicit()
    by_handle()
    assert [ptr for _, ptr, _ in fake.launches[2:]] == [0x600, 0x700]


def test_a_graph_of_another_device_binds_its_own_devices_stream(fake):
    g = fake.graph(device=1, exec_handle=0xE1)
    launch = g.launcher()  # device 0 current
    assert launch.stream_ptr == 0x101
    fake.current = 1
    launch()
    assert fake.launches == [(0xE1, 0x101, 1)]
    with pytest.raises(ReplayError, match=r"stream belongs to device 0 \(got a graph captured "
                                          r"on device 1\)"):
        g.launcher(Stream(0x900, device_id=0))


def test_no_launcher_before_capture_or_for_an_adopted_graph(fake):
    with pytest.raises(ReplayError, match=r"launcher\(\) before a successful capture"):
        cugraphrt.Graph().launcher()
    g = cugraphrt.Graph()
    g._captured, g._device = True, 0
    g._adopt(object(), 0x6, 0xE5)
    with pytest.raises(ReplayError, match=r"got a graph captured by cugraphrt_torch.*call "
                                          r"g.replay\(\) instead"):
        g.launcher()
    g.reset()


def test_reset_kills_the_launcher_for_good(fake):
    g = fake.graph(device=0, exec_handle=0xE0)
    launch = g.launcher()
    g.reset()
    assert not launch.alive and launch.graph is None and repr(launch) == (
        "<cugraphrt.Launcher dead>")
    with pytest.raises(ReplayError, match=r"the launcher's graph was reset \(got a launcher of "
                                          r"a graph without its executable\); capture again "
                                          r"and make a new launcher"):
        launch()
    g._captured, g._handles.exec = True, 0xE9  # captured again: the old launcher stays dead
    g._refresh_exec()
    with pytest.raises(ReplayError, match="was reset"):
        launch()
    g.launcher()()
    assert fake.launches == [(0xE9, 0x100, 0)]


def test_instantiate_again_moves_the_launcher_to_the_new_executable(fake, executables):
    g = kept_graph(executables)
    launch = g.launcher()
    launch()
    g.instantiate()  # destroys 0xE0, makes 0xE1
    launch()
    assert [h for h, _, _ in fake.launches] == [0xE0, 0xE1] and executables["live"] == {0xE1}
    executables["fail"] = True
    with pytest.raises(CaptureError, match="fake failure"):
        g.instantiate()
    with pytest.raises(ReplayError, match=r"has no executable \(got a launcher of a graph whose "
                                          r"instantiate\(\) failed"):
        launch()
    executables["fail"] = False
    g.instantiate()
    launch()
    assert [h for h, _, _ in fake.launches] == [0xE0, 0xE1, 0xE2]
    assert executables["live"] == {0xE2}
    g.reset()


def test_the_launcher_keeps_its_graph_alive(fake, executables):
    g = kept_graph(executables)
    launch = g.launcher()
    alive = weakref.ref(g)
    del g
    gc.collect()
    assert alive() is not None and launch.graph is alive()
    launch()
    assert fake.launches[-1][0] in executables["live"]
    graph = launch.graph
    graph._finalizer()  # what interpreter exit runs: the handles are released
    assert executables["live"] == set()
    with pytest.raises(ReplayError, match="the launcher's graph was released"):
        launch()


def test_a_dropped_launcher_leaves_its_graph(fake):
    g = fake.graph(device=0)
    launch = g.launcher()
    assert len(g._handles.launchers) == 1
    del launch
    gc.collect()
    assert len(g._handles.launchers) == 0


def test_reset_during_another_capture_kills_at_once_and_destroys_later(fake, executables):
    g = kept_graph(executables)
    launch = g.launcher()
    capture_activity.enter()  # a capture underway, in any thread
    try:
        g.reset()
        with pytest.raises(ReplayError, match="was reset"):
            launch()
        assert executables["live"] == {0xE0}  # destroying waits for the capture's end
    finally:
        capture_activity.exit()
    assert executables["live"] == set()


def test_pool_checks_route_launchers_through_the_checked_replay(fake, monkeypatch):
    monkeypatch.setattr(ReplayOrder, "note",
                        lambda self, seq, ptr: setattr(self, "last", seq))
    pool = cugraphrt.MemPool(backing=FakeBackingAllocator(device_id=0))
    graphs = []
    for exec_handle in (0xA, 0xB, 0xC):
        g = fake.graph(device=0, exec_handle=exec_handle)
        g._handles.pool, g._handles.seq = pool, capture(pool, [4096])[0]
        graphs.append(g)
    a, b, c = (g.launcher() for g in graphs)
    try:
        cugraphrt.set_pool_checks(True)
        profile = call_profile(a)
        assert profile.frames[0] == "Graph._replay_checked"
        with pytest.raises(PoolOrderError, match="graph #3 of the 3 graphs"):
            c()
    finally:
        cugraphrt.set_pool_checks(False)
    assert call_profile(c).frames == []  # checks off: no frame, no check
    assert [h for h, _, _ in fake.launches] == [0xA, 0xC]
    for g in graphs:
        g.reset()


def test_a_launcher_cannot_be_made_pickled_or_copied(fake):
    with pytest.raises(TypeError, match=r"cannot be created directly.*Graph.launcher"):
        Launcher(print)
    launch = fake.graph(device=0).launcher()
    for attempt in (pickle.dumps, copy.copy, copy.deepcopy):
        with pytest.raises(TypeError, match="cannot be pickled or copied"):
            attempt(launch)


def test_no_launcher_before_the_cross_rank_check_of_a_graph_holding_collectives(
        fake, monkeypatch):
    from cugraphrt.distributed import replay as collective_replay
    from cugraphrt.distributed.log import Collective, CollectiveLog

    from .test_collective_check import DictStore, StoreExchanger

    monkeypatch.setattr(collective_replay, "collective_timeout", lambda: None)
    g = fake.graph(device=0, exec_handle=0xE0)
    log = CollectiveLog(StoreExchanger(DictStore(), 0, ranks=(0,)))
    log.add(Collective("all_reduce", "float32", 4096, "0", "sum"))
    collective_replay.arm_graph(g, log)
    with pytest.raises(ReplayError, match=r"before its cross-rank check.*replay it once"):
        g.launcher()
    g.replay(Stream(0x51, device_id=0))  # the check passes (one rank) and disarms the graph
    assert log.verdict is True and g._route is None
    launch = g.launcher(Stream(0x51, device_id=0))
    launch()
    assert [launch_[:2] for launch_ in fake.launches[-2:]] == [(0xE0, 0x51), (0xE0, 0x51)]
    g.reset()
