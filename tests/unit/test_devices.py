"""Device ownership without a GPU: index validation, per-device stats, stream devices, and
the replay's device switch on a Graph whose CUDA calls are replaced by recorders."""

from __future__ import annotations

import gc

import numpy as np
import pytest

import cugraphrt
from cugraphrt import MemPool, OptionsError, ReplayError
from cugraphrt._capture import graphs
from cugraphrt._cuda import devices
from cugraphrt._cuda import runtime as _cuda
from cugraphrt._flags import FLAGS

from .fake_devices import FakeDevices, Stream
from .fakes import FakeBackingAllocator
from .test_pool import capture


@pytest.fixture
def two_devices(monkeypatch):
    """A process that sees two devices, device 0 current."""
    state = {"current": 0}
    monkeypatch.setattr(_cuda, "device_count", lambda: 2)
    monkeypatch.setattr(_cuda, "current_device", lambda: state["current"])
    return state


@pytest.mark.parametrize("bad", [2, 7, -1])
def test_out_of_range_device_is_an_options_error(two_devices, bad):
    with pytest.raises(OptionsError, match=r"from 0 to 1 \(this process sees 2 device"):
        cugraphrt.graph_pool_handle(device=bad)
    with pytest.raises(OptionsError, match="'device'"):
        MemPool(bad)


@pytest.mark.parametrize("bad", [True, "1", 1.0, None.__class__])
def test_non_integer_device_is_an_options_error(two_devices, bad):
    with pytest.raises(OptionsError, match="a device index"):
        devices.resolve_device(bad)


def test_devices_resolve_to_indices(two_devices):
    assert devices.resolve_device(None) == 0
    two_devices["current"] = 1
    assert devices.resolve_device(None) == 1
    assert devices.resolve_device(np.int64(0)) == 0
    # Creating a pool makes no CUDA call: it belongs to device 1 from the start.
    pool = cugraphrt.graph_pool_handle(device=1)
    assert pool.device_id == 1 and pool.stats().device_id == 1


def _totals() -> dict[int, tuple[int, ...]]:
    return {s.device_id: (s.pools, s.reserved_bytes, s.active_bytes, s.segments, s.live_graphs,
                          s.live_arrays) for s in cugraphrt.device_stats()}


def test_device_stats_sum_pools_per_device():
    gc.collect()
    before = _totals()  # pools of other tests may still live: compare differences
    a0 = MemPool(backing=FakeBackingAllocator(device_id=0))
    b0 = MemPool(backing=FakeBackingAllocator(device_id=0))
    a1 = MemPool(backing=FakeBackingAllocator(device_id=1))
    taken = [(pool, *capture(pool, sizes, keep=keep)) for pool, sizes, keep in (
        (a0, [1 << 20], [0]), (b0, [3 << 20], [0]), (a1, [1000, 2000], [0, 1]))]
    try:
        after = _totals()
        grew = {d: tuple(x - y for x, y in zip(after[d], before.get(d, (0,) * 6), strict=True))
                for d in after}
        mib = 1 << 20
        # (pools, reserved, active, segments, graphs, arrays); small requests get 2 MiB
        # segments, a 3 MiB one an exact multiple of 2 MiB.
        assert grew[0] == (2, 2 * mib + 4 * mib, 1 * mib + 3 * mib, 2, 2, 2)
        assert grew[1][0] == 1 and grew[1][1] == 2 * mib and grew[1][4:] == (1, 2)
        table = cugraphrt.memory_summary(device=1)
        rows = table.splitlines()[1:]
        assert any(row.split()[0] == str(a1.id) for row in rows)
        assert all(row.split()[1] == "1" for row in rows)
    finally:
        for pool, seq, _ in taken:
            pool._remove_graph(seq)


def test_stream_device_reads_cupy_and_torch_streams():
    assert devices.stream_device(Stream(5, device_id=1)) == 1
    assert devices.stream_device(Stream(5)) == -1  # the null stream follows the device
    assert devices.stream_device(Stream(5, device_index=0)) == 0
    assert devices.stream_device(1234) == -1


def test_capture_stream_of_another_device_is_refused():
    with pytest.raises(OptionsError, match=r"stream of the current device 0 \(got a stream of "
                                           r"device 1\).*cupy.cuda.Device\(1\)"):
        devices.check_capture_stream(Stream(5, device_id=1), 0)
    devices.check_capture_stream(Stream(5, device_id=0), 0)
    devices.check_capture_stream(Stream(0), 1)


@pytest.fixture
def fake_graph(monkeypatch):
    """A captured Graph of device 1 on two fake devices, device 0 current."""
    fake = FakeDevices(monkeypatch, count=2)
    return fake.graph(device=1, exec_handle=0xE1), fake


def test_a_second_device_is_noted_and_leaves_the_pool_checks_off(fake_graph):
    assert FLAGS.multi_device and not FLAGS.pool_checks


def test_replay_under_another_device_launches_on_the_graphs_device(fake_graph):
    g, fake = fake_graph
    g.replay()  # device 0 current: switch to 1, its current stream, then back
    assert fake.launches == [(0xE1, 0x101, 1)] and fake.current == 0
    fake.current = 1
    g.replay(Stream(0x555, device_id=1))
    assert fake.launches[-1] == (0xE1, 0x555, 1)
    g.replay(0x777)  # int handles are taken as given
    assert fake.launches[-1] == (0xE1, 0x777, 1)


def test_replay_on_a_stream_of_another_device_is_a_replay_error(fake_graph):
    g, fake = fake_graph
    with pytest.raises(ReplayError, match=r"stream belongs to device 0 \(got a graph captured "
                                          r"on device 1\)"):
        g.replay(Stream(0x555, device_id=0))
    assert fake.launches == []


def test_replay_stream_check_reads_torch_streams_too():
    # What the torch adapter's replay calls with a torch stream (device_index).
    devices.check_replay_stream(Stream(5, device_index=1), 1)
    devices.check_replay_stream(Stream(5), 1)  # the null stream follows the device
    devices.check_replay_stream(0x777, 1)  # int handles are taken as given
    with pytest.raises(ReplayError, match=r"stream belongs to device 0 \(got a graph captured "
                                          r"on device 1\)"):
        devices.check_replay_stream(Stream(5, device_index=0), 1)


def test_single_device_replay_takes_the_fast_path(monkeypatch):
    fake = FakeDevices(monkeypatch, count=1)
    assert not FLAGS.multi_device
    g = fake.graph(device=0, exec_handle=0xE1)
    # One device: the replay names it in CuPy's stream lookup, which then asks CUDA nothing;
    # even the null stream needs no device query.
    fake.use_null_stream()
    g.replay()
    assert fake.launches == [(0xE1, 0, 0)] and fake.device_queries == 0
    assert g.device_id == 0 and graphs.Graph().device_id is None


def test_info_shows_pools_and_nccl_per_gpu():
    from cugraphrt import cli

    gpu = dict(name="GPU", compute_capability="90", total_bytes=80 << 30, free_bytes=70 << 30)
    info = cli.InfoResult(
        cugraphrt_version="0", cupy_version="14", cuda_runtime_version=13000,
        cuda_driver_version=13000, nccl_version="2.27.7",
        gpus=[cli.GpuInfo(index=0, **gpu),
              cli.GpuInfo(index=1, graph_pools=2, graph_pool_reserved_bytes=6 << 20, **gpu)])
    lines = cli._render_info(info).splitlines()
    gpu0 = next(line for line in lines if line.startswith("GPU 0"))
    gpu1 = next(line for line in lines if line.startswith("GPU 1"))
    assert "graph pool" not in gpu0
    assert "2 graph pool(s) reserving 6.0 MiB" in gpu1
    assert "NCCL          2.27.7" in lines
