"""Device ownership on one GPU: out-of-range devices, the graph's device, per-device stats."""

from __future__ import annotations

import pytest

import cugraphrt
from cugraphrt import OptionsError

pytestmark = pytest.mark.gpu


def test_out_of_range_device_index_is_an_options_error():
    import cupy

    count = cupy.cuda.runtime.getDeviceCount()
    with pytest.raises(OptionsError, match=rf"from 0 to {count - 1}"):
        cugraphrt.graph_pool_handle(device=count)
    with pytest.raises(OptionsError, match="a device index"):
        cugraphrt.graph_pool_handle(device="cuda:0")


def test_graph_and_pool_record_their_device_and_stats_sum_per_device(randn):
    import cupy

    device = cupy.cuda.runtime.getDevice()
    x = randn((256, 256))
    (x * 2).sum()
    before = {s.device_id: s for s in cugraphrt.device_stats()}
    pool = cugraphrt.graph_pool_handle()
    g = cugraphrt.Graph()
    assert g.device_id is None
    with cugraphrt.graph(g, pool=pool):
        y = x * 2 + 1
    g.replay()
    cupy.testing.assert_array_equal(y, x * 2 + 1)
    assert g.device_id == device == pool.device_id
    after = {s.device_id: s for s in cugraphrt.device_stats(device)}
    assert list(after) == [device]
    old = before.get(device)
    assert after[device].live_graphs == (old.live_graphs if old else 0) + 1
    assert after[device].reserved_bytes >= pool.stats().reserved_bytes > 0
    from cugraphrt.cli import collect_info

    info = collect_info()
    mine = next(gpu for gpu in info.gpus if gpu.index == device)
    assert mine.graph_pools >= 1 and mine.graph_pool_reserved_bytes >= pool.stats().reserved_bytes
    del y
    g.reset()
