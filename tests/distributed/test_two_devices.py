"""Two GPUs in one process: pools never cross devices, graphs replay on their own device,
and two threads (or one switching devices) capture and replay without interference.

Plain pytest (no torchrun); skips with fewer than 2 GPUs.
"""

from __future__ import annotations

import threading

import numpy as np
import pytest

from ._launch import skip_unless_gpus

pytestmark = [pytest.mark.gpu, skip_unless_gpus(2, library="cupy")]

cupy = pytest.importorskip("cupy")
import cugraphrt  # noqa: E402
from cugraphrt import CaptureError, OptionsError, ReplayError  # noqa: E402


def _capture_on(device: int, scale: float):
    with cupy.cuda.Device(device):
        x = cupy.arange(1 << 16, dtype=cupy.float32)
        (x * scale + 1).sum()  # warm-up: kernels of this device
        g = cugraphrt.Graph()
        with cugraphrt.graph(g):
            y = cupy.sin(x) * scale + 1
        return g, x, y


def test_pool_of_another_device_is_refused():
    pool0 = cugraphrt.graph_pool_handle(device=0)
    with cupy.cuda.Device(1):
        x = cupy.ones(16, dtype=cupy.float32)
        with pytest.raises(CaptureError, match=r"belongs to device 0 \(got current device 1\)"):
            with cugraphrt.graph(cugraphrt.Graph(), pool=pool0):
                x * 2
        pool1 = cugraphrt.graph_pool_handle(device=1)
        g = cugraphrt.Graph()
        with cugraphrt.graph(g, pool=pool1):
            y = x * 2
        g.replay()
        assert float(y.sum()) == 32.0
    assert pool0.device_id == 0 and g.pool() is pool1 and g.device_id == 1
    stats = {s.device_id: s for s in cugraphrt.device_stats()}
    assert stats[1].live_graphs >= 1


def test_capture_stream_of_another_device_is_refused():
    with cupy.cuda.Device(1):
        stream = cupy.cuda.Stream(non_blocking=True)
    with cupy.cuda.Device(0):
        with pytest.raises(OptionsError, match="got a stream of device 1"):
            with cugraphrt.graph(cugraphrt.Graph(), stream=stream):
                pass


def test_replay_under_another_device_runs_on_the_graphs_device():
    g0, x0, y0 = _capture_on(0, 2.0)
    g1, x1, y1 = _capture_on(1, 3.0)
    for _ in range(5):
        for device, (g, x, y, scale) in enumerate(((g0, x0, y0, 2.0), (g1, x1, y1, 3.0))):
            with cupy.cuda.Device(device):
                x[...] = cupy.random.standard_normal(x.size, dtype=cupy.float32)
                expected = cupy.sin(x) * scale + 1
            with cupy.cuda.Device(1 - device):  # the other device is current
                g.replay()
            with cupy.cuda.Device(device):
                cupy.testing.assert_array_equal(y, expected)
    with cupy.cuda.Device(0):
        with pytest.raises(ReplayError, match="belongs to device 0"):
            g1.replay(cupy.cuda.Stream(non_blocking=True))


def test_graphed_function_under_another_device():
    with cupy.cuda.Device(1):
        x = cupy.random.standard_normal((64, 64), dtype=cupy.float32)
        f = cugraphrt.make_graphed(lambda a: cupy.tanh(a) * 2, (x,))
        new = cupy.random.standard_normal((64, 64), dtype=cupy.float32)
        expected = cupy.tanh(new) * 2
    with cupy.cuda.Device(0):
        out = f(new)
    with cupy.cuda.Device(1):
        cupy.testing.assert_array_equal(out, expected)


def test_two_threads_two_devices_capture_and_replay_at_once():
    errors: list[BaseException] = []
    barrier = threading.Barrier(2)

    def work(device: int) -> None:
        try:
            with cupy.cuda.Device(device):
                rng = np.random.default_rng(device)
                x = cupy.asarray(rng.standard_normal(1 << 14).astype(np.float32))
                cupy.cos(x) + device
                barrier.wait()
                for _ in range(20):  # capture and replay over and over, both threads at once
                    g = cugraphrt.Graph()
                    with cugraphrt.graph(g, capture_error_mode="thread_local"):
                        y = cupy.cos(x) + device
                    for _ in range(10):
                        x[...] = cupy.asarray(rng.standard_normal(x.size).astype(np.float32))
                        g.replay()
                        cupy.testing.assert_array_equal(y, cupy.cos(x) + device)
                    g.reset()
        except BaseException as exc:  # noqa: BLE001 - reported by the main thread
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(d,)) for d in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    assert not errors, errors


def test_one_thread_switching_devices():
    graphs = [_capture_on(d, float(d + 2)) for d in (0, 1, 0, 1)]
    for _ in range(10):
        for device, (g, x, y) in zip((0, 1, 0, 1), graphs, strict=True):
            with cupy.cuda.Device(device):
                x[...] = cupy.random.standard_normal(x.size, dtype=cupy.float32)
                g.replay()
                cupy.testing.assert_array_equal(y, cupy.sin(x) * float(device + 2) + 1)


def test_replay_from_a_non_default_stream_of_another_device():
    # CuPy's current stream of device 1 says device 1: the fast path must not launch there.
    g0, x0, y0 = _capture_on(0, 2.0)
    with cupy.cuda.Device(0):
        x0[...] = cupy.random.standard_normal(x0.size, dtype=cupy.float32)
        expected = cupy.sin(x0) * 2.0 + 1
    with cupy.cuda.Device(1):
        stream1 = cupy.cuda.Stream(non_blocking=True)
        with stream1:
            g0.replay()
    with cupy.cuda.Device(0):
        cupy.testing.assert_array_equal(y0, expected)


def test_launcher_of_a_graph_on_another_device():
    g1, x1, y1 = _capture_on(1, 3.0)
    with cupy.cuda.Device(0):
        launch = g1.launcher()  # binds device 1's current stream, whatever is current
        with pytest.raises(ReplayError, match="belongs to device 0"):
            g1.launcher(cupy.cuda.Stream(non_blocking=True))
    with cupy.cuda.Device(1):
        x1[...] = cupy.random.standard_normal(x1.size, dtype=cupy.float32)
        expected = cupy.sin(x1) * 3.0 + 1
        launch()
        cupy.testing.assert_array_equal(y1, expected)
    # From device 0 the launcher makes no switch: CUDA either launches on the graph's own
    # stream and device, or refuses. Never anything else (run with -s to see which).
    with cupy.cuda.Device(1):
        x1[...] = cupy.random.standard_normal(x1.size, dtype=cupy.float32)
        expected = cupy.sin(x1) * 3.0 + 1
        y1.fill(0)
        cupy.cuda.runtime.deviceSynchronize()
    with cupy.cuda.Device(0):
        try:
            launch()
            outcome = "launched"
        except cupy.cuda.runtime.CUDARuntimeError as exc:
            outcome = f"refused: {exc}"
    print(f"launcher called under another device: {outcome}")
    with cupy.cuda.Device(1):
        cupy.cuda.runtime.deviceSynchronize()
        if outcome == "launched":
            cupy.testing.assert_array_equal(y1, expected)
        else:
            assert float(abs(y1).max()) == 0.0
