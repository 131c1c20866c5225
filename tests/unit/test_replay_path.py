"""Graph.replay's paths on fake devices: what it launches, on which device and stream, and how
many Python frames and C calls each path costs (issue 24: the cost of a replay on the graph's
own device must not depend on how many devices the process sees)."""

from __future__ import annotations

import pytest

import cugraphrt
from cugraphrt import PoolOrderError, ReplayError
from cugraphrt._capture import graphs
from cugraphrt._flags import FLAGS
from cugraphrt._memory.replay_order import ReplayOrder

from .fake_devices import FakeDevices, Stream, call_profile
from .fakes import FakeBackingAllocator
from .test_pool import capture

FAST = ["Graph.replay"]


@pytest.mark.parametrize("count", [1, 2, 8])
@pytest.mark.parametrize("null", [False, True], ids=["stream", "null"])
def test_replay_on_the_graphs_device_is_one_frame_whatever_the_device_count(monkeypatch,
                                                                            count, null):
    fake = FakeDevices(monkeypatch, count=count)
    if null:
        fake.use_null_stream()  # device_id -1: it does not say which device is current
    g = fake.graph(device=0, exec_handle=0xE0)
    profile = call_profile(g.replay)
    assert profile.frames == FAST
    if count == 1:  # the only device is the graph's: CUDA is asked nothing
        assert profile.c_calls == ["get_current_stream", "cudaGraphLaunch"]
        assert fake.device_queries == 0
    else:  # which device is current, asked once (CuPy's own launch asks too), null or not
        assert profile.c_calls == ["cudaGetDevice", "get_current_stream", "cudaGraphLaunch"]
        assert fake.device_queries == 1
    assert fake.launches == [(0xE0, 0 if null else 0x100, 0)]


def test_null_stream_with_another_device_current_switches(monkeypatch):
    fake = FakeDevices(monkeypatch, count=2)
    fake.use_null_stream()
    g = fake.graph(device=0, exec_handle=0xE0)
    fake.current = 1  # the null stream of device 1 would be the wrong one: switch
    g.replay()
    assert fake.launches == [(0xE0, 0, 0)] and fake.current == 1


def test_explicit_stream_of_the_graphs_device(monkeypatch):
    fake = FakeDevices(monkeypatch, count=2)
    g = fake.graph(device=1, exec_handle=0xE1)
    mine = Stream(0x901, device_id=1)
    fake.current = 1
    profile = call_profile(lambda: g.replay(mine))
    assert profile.frames[1:] == FAST  # after the lambda's own frame
    assert profile.c_calls == ["cudaGetDevice", "cudaGraphLaunch"]
    fake.current = 0  # the stream says its device, not the current one: switch to launch
    g.replay(mine)
    assert fake.launches == [(0xE1, 0x901, 1), (0xE1, 0x901, 1)] and fake.current == 0


def test_a_stream_of_another_device_is_refused_from_either_device(monkeypatch):
    fake = FakeDevices(monkeypatch, count=2)
    g = fake.graph(device=1, exec_handle=0xE1)
    for current in (0, 1):
        fake.current = current
        with pytest.raises(ReplayError, match=r"stream belongs to device 0 \(got a graph "
                                              r"captured on device 1\); replay on a stream "
                                              r"of device 1"):
            g.replay(Stream(0x900, device_id=0))
    assert fake.launches == [] and fake.current == 1


def test_replay_under_another_device_switches_and_restores(monkeypatch):
    fake = FakeDevices(monkeypatch, count=2)
    g = fake.graph(device=1, exec_handle=0xE1)
    g.replay()
    assert fake.launches == [(0xE1, 0x101, 1)] and fake.current == 0
    g.replay(0x777)  # an int handle is taken as given, on the graph's device
    assert fake.launches[-1] == (0xE1, 0x777, 1) and fake.current == 0


@pytest.mark.parametrize("count", [1, 2])
def test_replay_before_capture_and_after_reset_is_a_replay_error(monkeypatch, count):
    fake = FakeDevices(monkeypatch, count=count)
    with pytest.raises(ReplayError, match=r"before a successful capture or after reset\(\)"):
        graphs.Graph().replay()
    g = fake.graph(device=0)
    g.replay()
    g.reset()
    with pytest.raises(ReplayError, match=r"after reset\(\) \(got an empty Graph\)"):
        g.replay(Stream(0x900, device_id=0))
    assert len(fake.launches) == 1


@pytest.fixture
def three_graphs_one_pool(monkeypatch):
    """Three fake graphs sharing a pool, pool-order checks on (no CUDA event: a fake note)."""
    fake = FakeDevices(monkeypatch, count=2)

    def note(self, seq, stream_ptr):
        self.last, self.last_stream = seq, stream_ptr

    monkeypatch.setattr(ReplayOrder, "note", note)
    pool = cugraphrt.MemPool(backing=FakeBackingAllocator(device_id=0))
    made = []
    for exec_handle in (0xA, 0xB, 0xC):
        seq, _ = capture(pool, [4096])
        g = fake.graph(device=0, exec_handle=exec_handle)
        g._handles.pool, g._handles.seq = pool, seq
        made.append(g)
    cugraphrt.set_pool_checks(True)
    yield fake, made
    cugraphrt.set_pool_checks(False)
    for g in made:
        g.reset()


def test_pool_order_checks_still_run_on_every_replay(three_graphs_one_pool):
    fake, (a, b, c) = three_graphs_one_pool
    for g in (a, b, b, c, a, b):  # in order, repeats, a new round
        g.replay()
    with pytest.raises(PoolOrderError, match=r"graph #3 of the 3 graphs sharing memory pool "
                                             r"\d+ was replayed right after graph #1 \(got an "
                                             r"out-of-order replay\)"):
        a.replay(Stream(0x100, device_id=0))  # also with an explicit stream
        c.replay()  # skips graph #2: refused before the launch
    assert [launch[0] for launch in fake.launches] == [0xA, 0xB, 0xB, 0xC, 0xA, 0xB, 0xA]


def test_the_bench_runs_the_several_device_path_in_a_one_device_process(monkeypatch):
    from cugraphrt.bench.several_devices import several_devices_path

    fake = FakeDevices(monkeypatch, count=1)
    g = fake.graph(device=0, exec_handle=0xE0)
    with several_devices_path():
        profile = call_profile(g.replay)
    assert profile.frames == FAST
    assert profile.c_calls == ["cudaGetDevice", "get_current_stream", "cudaGraphLaunch"]
    assert fake.launches == [(0xE0, 0x100, 0)]
    assert FLAGS.plain and not FLAGS.multi_device  # the one-device path is back
    assert call_profile(g.replay).c_calls == ["get_current_stream", "cudaGraphLaunch"]
    with pytest.raises(KeyError), several_devices_path():
        raise KeyError("a failed batch")
    assert FLAGS.plain and not FLAGS.multi_device


def test_the_several_device_path_still_switches_to_the_graphs_device(monkeypatch):
    from cugraphrt.bench.several_devices import several_devices_path

    fake = FakeDevices(monkeypatch, count=2)  # the flags are set already: nothing changes
    g = fake.graph(device=1, exec_handle=0xE1)
    with several_devices_path():
        g.replay()
    assert fake.launches == [(0xE1, 0x101, 1)] and fake.current == 0
    assert FLAGS.multi_device and not FLAGS.plain
