"""CuPy's capture API by name (issue 23.2): cugraphrt.Stream's begin_capture / end_capture
against eager results, and its errors, which are CuPy's too (CUDARuntimeError with the status,
NotImplementedError for refused libraries)."""

from __future__ import annotations

import threading

import cupy
import numpy as np
import pytest
from cupy_backends.cuda.api import runtime

import cugraphrt
from cugraphrt import CaptureError, CugraphrtError, StreamGraph

pytestmark = pytest.mark.gpu


def _work(a):
    return cupy.sqrt(3 * cupy.sin(a) ** 2 + 1) * 7.5 - a


@pytest.mark.parametrize("upload", [False, True])
def test_capture_launches_like_eager_on_any_stream(upload, randn):
    s1 = cugraphrt.Stream(non_blocking=True)
    s2 = cupy.cuda.Stream(non_blocking=True)
    a = randn((4096,), np.float64)
    _work(a)  # warm up the kernels
    with s1:
        s1.begin_capture()
        assert s1.is_capturing() and cugraphrt.is_current_stream_capturing()
        out = _work(a)
        g = s1.end_capture()
    assert isinstance(g, StreamGraph) and not s1.is_capturing()
    for stream in (s1, s2, None):
        fresh = randn((4096,), np.float64)
        a[...] = fresh
        cupy.cuda.Device().synchronize()  # the copy first: s is non-blocking
        if upload:
            g.upload(stream)
        g.launch(stream=stream)
        (stream or cupy.cuda.get_current_stream()).synchronize()
        cupy.testing.assert_allclose(out, _work(fresh), rtol=1e-12)
    assert g.pool().stats().active_bytes >= out.nbytes  # out lives in the graph's pool


def test_same_program_with_cupys_and_cugraphrts_stream(randn):
    a = randn((2048,), np.float32)
    _work(a)
    results = []
    for stream_class in (cupy.cuda.Stream, cugraphrt.Stream):  # the port: one name
        s = stream_class(non_blocking=True)
        with s:
            s.begin_capture()
            out = _work(a)
            g = s.end_capture()
        g.launch(s)
        s.synchronize()
        results.append(out.copy())
    cupy.testing.assert_array_equal(results[0], results[1])
    cupy.testing.assert_allclose(results[1], _work(a), rtol=1e-6)


def test_host_callbacks_run_on_every_launch():
    s = cugraphrt.Stream(non_blocking=True)
    counter = {"count": 0}
    with s:
        s.begin_capture()
        s.launch_host_func(lambda box: box.__setitem__("count", box["count"] + 1), counter)
        g = s.end_capture()
    for expected in (1, 2, 3):
        g.launch()
        cupy.cuda.get_current_stream().synchronize()
        assert counter["count"] == expected


def test_fork_and_join_are_captured(randn):
    s1, s2 = cugraphrt.Stream(non_blocking=True), cupy.cuda.Stream(non_blocking=True)
    a = randn((1000,), np.float64)
    a * 100 + 1
    with s1:
        s1.begin_capture()
        out1 = a * 100
        s2.wait_event(s1.record())
        with s2:
            out2 = 3 * out1 + 1
        s1.wait_event(s2.record())
        g = s1.end_capture()
    assert not s1.is_capturing() and not s2.is_capturing()
    fresh = randn((1000,), np.float64)
    a[...] = fresh
    cupy.cuda.Device().synchronize()  # the copy first: s is non-blocking
    g.launch(s1)
    s1.synchronize()
    cupy.testing.assert_allclose(out2, 3 * (fresh * 100) + 1, rtol=1e-12)


def test_capture_modes_by_cupys_value(randn):
    a = randn((256,), np.float32)
    a + 1
    for mode in (runtime.streamCaptureModeGlobal, runtime.streamCaptureModeThreadLocal, None):
        s = cugraphrt.Stream(non_blocking=True)
        with s:
            s.begin_capture(mode)
            out = a + 1
            g = s.end_capture()
        g.launch(s)
        s.synchronize()
        cupy.testing.assert_allclose(out, a + 1)


def test_legacy_stream_is_refused_with_both_wordings():
    s = cugraphrt.Stream(null=True)
    with pytest.raises(CaptureError, match=r"legacy default stream.*non-default stream\."):
        s.begin_capture()
    assert not cugraphrt.Stream(non_blocking=True).is_capturing()


def test_sync_in_capture_is_cupys_error_and_explained_then_the_stream_works():
    s = cugraphrt.Stream(non_blocking=True)
    with s:
        s.begin_capture()
        with pytest.raises(runtime.CUDARuntimeError, match="cudaErrorStreamCaptureUnsupported") \
                as sync:
            s.synchronize()
        assert isinstance(sync.value, CaptureError) and sync.value.status == 900
        with pytest.raises(runtime.CUDARuntimeError,
                           match="cudaErrorStreamCaptureInvalidated") as end:
            s.end_capture()
        assert isinstance(end.value, CaptureError) and end.value.status == 901
        assert "Likely causes" in str(end.value)
    assert not s.is_capturing()
    s.synchronize()
    with s:  # and it captures again
        s.begin_capture()
        x = cupy.arange(10.0)
        g = s.end_capture()
    g.launch(s)
    s.synchronize()
    cupy.testing.assert_array_equal(x, np.arange(10.0))


def test_end_capture_without_a_capture_and_on_a_forked_stream():
    s1, s2 = cugraphrt.Stream(non_blocking=True), cugraphrt.Stream(non_blocking=True)
    a = cupy.arange(100.0)
    a ** 3
    with s1:
        s1.begin_capture()
        with pytest.raises(runtime.CUDARuntimeError, match="cudaErrorIllegalState") as idle:
            s2.end_capture()
        assert isinstance(idle.value, CugraphrtError) and idle.value.status == 401
        s2.wait_event(s1.record())
        with s2:
            a ** 3
        with pytest.raises(runtime.CUDARuntimeError, match="cudaErrorStreamCaptureUnmatched"):
            s2.end_capture()  # forked into s1's capture: CUDA invalidates that capture
        with pytest.raises(runtime.CUDARuntimeError, match="cudaErrorStreamCaptureInvalidated"):
            s1.end_capture()
    assert not s1.is_capturing() and not s2.is_capturing()
    s1.synchronize()
    s2.synchronize()


def test_unjoined_fork_is_cupys_error_and_explained():
    s1, s2 = cugraphrt.Stream(non_blocking=True), cupy.cuda.Stream(non_blocking=True)
    a = cupy.arange(100.0)
    a * 2
    with s1:
        s1.begin_capture()
        s2.wait_event(s1.record())
        with s2:
            a * 2
        with pytest.raises(runtime.CUDARuntimeError, match="cudaErrorStreamCaptureUnjoined") \
                as info:
            s1.end_capture()
    assert isinstance(info.value, CaptureError) and "wait_event" in str(info.value)
    assert not s1.is_capturing() and not s2.is_capturing()


@pytest.mark.parametrize("library, call", [
    ("cuSOLVER", lambda a: cupy.linalg.svd(a)),
    ("cuRAND", lambda a: cupy.random.random(100)),
])
def test_refused_libraries_are_not_implemented_errors(library, call, randn):
    a = randn((8, 8), np.float64)
    call(a)  # warm-up: eagerly they work
    s = cugraphrt.Stream(non_blocking=True)
    with s:
        s.begin_capture()
        with pytest.raises(NotImplementedError, match=library) as info:
            call(a)
        assert isinstance(info.value, CaptureError)
        y = a + 1  # the capture is intact
        g = s.end_capture()
    g.launch(s)
    s.synchronize()
    cupy.testing.assert_allclose(y, a + 1)


def test_first_cublas_use_in_a_capture_is_refused_like_cupy(randn):
    a, b = randn((3, 4), np.float64), randn((4, 5), np.float64)
    seen = {}

    def fresh_thread():  # no CuPy cuBLAS handle exists in a new thread
        s = cugraphrt.Stream(non_blocking=True)
        with s:
            s.begin_capture()
            try:
                cupy.matmul(a, b)
            except Exception as exc:  # noqa: BLE001 - inspected below
                seen["error"] = exc
            y = a + 1
            g = s.end_capture()
        g.launch(s)
        s.synchronize()
        seen["y"] = y

    thread = threading.Thread(target=fresh_thread)
    thread.start()
    thread.join()
    error = seen["error"]
    assert isinstance(error, NotImplementedError) and isinstance(error, CaptureError)
    assert "cuBLAS" in str(error) and "warm-up" in str(error)
    cupy.testing.assert_allclose(seen["y"], a + 1)


def test_matmul_and_new_fft_plans_are_captured(randn):
    # Deliberate differences from CuPy, which refuses both inside begin_capture().
    a, b = randn((64, 48), np.float32), randn((48, 32), np.float32)
    x = randn((1998,), np.complex64)  # no FFT plan cached for this size
    a @ b  # warm-up: the cuBLAS handle exists
    s = cugraphrt.Stream(non_blocking=True)
    with s:
        s.begin_capture()
        product = a @ b
        spectrum = cupy.fft.fft(x)
        g = s.end_capture()
    fa, fb, fx = randn((64, 48), np.float32), randn((48, 32), np.float32), \
        randn((1998,), np.complex64)
    a[...], b[...], x[...] = fa, fb, fx
    cupy.cuda.Device().synchronize()  # the copy first: s is non-blocking
    g.launch(s)
    s.synchronize()
    np.testing.assert_allclose(cupy.asnumpy(product),
                               cupy.asnumpy(fa).astype(np.float64) @ cupy.asnumpy(fb),
                               rtol=1e-3, atol=1e-3)
    np.testing.assert_allclose(cupy.asnumpy(spectrum), np.fft.fft(cupy.asnumpy(fx)),
                               rtol=1e-3, atol=1e-3)


def test_debug_dot_str_names_the_kernels(randn):
    a = randn((100,), np.float64)
    cupy.sin(a)
    s = cugraphrt.Stream(non_blocking=True)
    with s:
        s.begin_capture()
        cupy.sin(a)
        g = s.end_capture()
    text = g.debug_dot_str()
    verbose = g.debug_dot_str(runtime.cudaGraphDebugDotFlagsVerbose)
    assert "cupy_sin" in text and "cupy_sin" in verbose and text != verbose


def test_shared_pool_between_stream_captures(randn):
    pool = cugraphrt.graph_pool_handle()
    a = randn((512,), np.float32)
    a * 2
    s = cugraphrt.Stream(non_blocking=True)
    with s:
        s.begin_capture(pool=pool)
        b = a * 2
        g1 = s.end_capture()
        s.begin_capture(pool=pool)
        c = b + 1
        g2 = s.end_capture()
    assert g1.pool() is pool and g2.pool() is pool
    fresh = randn((512,), np.float32)
    a[...] = fresh
    cupy.cuda.Device().synchronize()  # the copy first: s is non-blocking
    g1.launch(s)
    g2.launch(s)
    s.synchronize()
    cupy.testing.assert_allclose(c, fresh * 2 + 1, rtol=1e-6)
    assert pool.stats().live_graphs == 2
