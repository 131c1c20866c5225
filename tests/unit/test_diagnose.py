"""Capture failures name their real cause (cugraphrt._capture.diagnose), without a GPU.

The exceptions are CuPy's own CUDA runtime errors (constructible without a device) or
stand-ins with the class names CuPy's library errors have; the captures are stand-ins with
the attributes the diagnosis reads.
"""

from __future__ import annotations

import os
import threading

import cupy
import pytest
from cupy_backends.cuda.api import runtime

from cugraphrt import CaptureError, CugraphrtError
from cugraphrt._capture import diagnose as _diagnose
from cugraphrt._cuda import runtime as _cuda


class FakeCapture:
    def __init__(self, mode="global", notes=()):
        self.mode = mode
        self.notes = list(notes)
        self.stream = None


def raised(fn):
    try:
        fn()
    except BaseException as exc:  # noqa: BLE001 - the test inspects it
        return exc
    raise AssertionError("nothing raised")


def in_cupy(name, filename="cuda/stream.py"):
    """A function whose frame lies inside CuPy, raising the status it is called with."""
    path = os.path.join(os.path.dirname(cupy.__file__), filename)
    namespace = {"runtime": runtime}
    source = f"def {name}(status):\n    raise runtime.CUDARuntimeError(status)\n"
    exec(compile(source, path, "exec"), namespace)
    return namespace[name]


fail = in_cupy("synchronize")


@pytest.fixture
def other_thread():
    """One more thread alive for the duration of a test."""
    stop = threading.Event()
    thread = threading.Thread(target=stop.wait)
    thread.start()
    yield
    stop.set()
    thread.join()


def test_invalidated_global_capture_with_other_threads_suggests_thread_local(other_thread):
    exc = raised(lambda: fail(901))
    error = _diagnose.capture_error_from(exc, FakeCapture("global"))
    text = str(error)
    assert isinstance(error, CaptureError)
    assert "the capture was invalidated before `exc = raised(lambda: fail(901))`" in text
    assert "test_diagnose.py:" in text  # the caller's line, not CuPy's
    assert "'global' mode, in which CUDA forbids unsafe calls" in text
    assert "capture_error_mode='thread_local'" in text
    assert "another thread synchronized the whole device" in text
    assert "mode 'global'" in text and "other thread(s) running" in text


def test_invalidated_thread_local_capture_blames_device_wide_syncs_only(other_thread):
    error = _diagnose.capture_error_from(raised(lambda: fail(901)), FakeCapture("thread_local"))
    text = str(error)
    assert "forbids unsafe calls" not in text  # thread_local: others' unsafe calls are fine
    assert text.split("Likely causes: ")[1].startswith("another thread synchronized")
    assert "torch.cuda.synchronize()" in text and "cudaDeviceSynchronize" in text


def test_invalidated_capture_in_a_lone_thread_blames_an_ignored_error(monkeypatch):
    monkeypatch.setattr(threading, "active_count", lambda: 1)
    text = str(_diagnose.capture_error_from(raised(lambda: fail(901)), FakeCapture()))
    causes = text.split("Likely causes: ")[1]
    # Alone, this thread's own ignored error comes first; other threads (ended since) next.
    assert causes.startswith("an earlier operation of this capture failed and its error was "
                             "caught")
    assert "'global' mode" in causes and "0 other thread(s) running" in text


def test_cython_frames_without_source_are_not_the_callers_line():
    # CuPy's Cython frames carry relative .pyx names (outside site-packages once made
    # absolute) and no source line: the caller's line is the next frame out.
    namespace = {"runtime": runtime}
    source = "def launch(status):\n    raise runtime.CUDARuntimeError(status)\n"
    exec(compile(source, "cupy/_core/_kernel.pyx", "exec"), namespace)
    launch = namespace["launch"]
    exc = raised(lambda: launch(901))
    assert _diagnose.where_in_user_code(exc).startswith("`exc = raised(lambda: launch(901))`")


def test_kernels_compiled_during_the_capture_are_named(monkeypatch):
    monkeypatch.setattr(threading, "active_count", lambda: 1)
    capture = FakeCapture("relaxed", notes=["cupy_multiply__float32", "my_kernel"])
    text = str(_diagnose.capture_error_from(raised(lambda: fail(901)), capture))
    assert "kernels were compiled and loaded during this capture" in text
    assert "cupy_multiply__float32, my_kernel" in text and "warm up this op first" in text


def test_invalidated_error_at_the_end_of_the_capture_is_refined(other_thread):
    ended = _cuda.error_from_status(901, "cudaStreamEndCapture")
    assert isinstance(ended, CaptureError) and ended.status == 901
    refined = _diagnose.capture_error_from(ended, FakeCapture("global"))
    assert refined is not ended and "before ending the capture" in str(refined)
    assert "thread_local" in str(refined)
    assert _diagnose.capture_error_from(ended) is ended  # no capture: nothing to add


def test_module_load_refused_during_capture_says_warm_up():
    # A frame inside CuPy's compiler, as CuPy's compile-and-load path has.
    load = in_cupy("_compile_module_with_cache", "cuda/compiler.py")
    exc = raised(lambda: load(900))
    text = str(_diagnose.capture_error_from(exc, FakeCapture()))
    assert "loads a kernel module during capture" in text and "warm up this op first" in text


def test_host_sync_in_the_capturing_thread_names_the_line():
    def get_result():
        fail(900)

    text = str(_diagnose.capture_error_from(raised(get_result), FakeCapture()))
    assert "`fail(900)` (test_diagnose.py:" in text
    assert "synchronizing call" in text and "warm up first" in text


def test_every_cuda_status_during_a_capture_becomes_a_capture_error():
    error = _diagnose.capture_error_from(raised(lambda: fail(1)), FakeCapture())
    assert isinstance(error, CaptureError)
    assert "failed during capture (got cudaErrorInvalidValue (1)" in str(error)
    assert "run it before the captured region (warm-up) or after it" in str(error)


@pytest.mark.parametrize("name,library", [("CUSOLVERError", "cuSOLVER"),
                                          ("CUSPARSEError", "cuSPARSE"),
                                          ("CUBLASError", "cuBLAS")])
def test_library_statuses_become_capture_errors_naming_the_library(name, library):
    error_type = type(name, (RuntimeError,), {})
    exc = raised(lambda: (_ for _ in ()).throw(error_type("CUSOLVER_STATUS_INTERNAL_ERROR")))
    text = str(_diagnose.capture_error_from(exc, FakeCapture()))
    assert f"with a {library} error (got {name}: CUSOLVER_STATUS_INTERNAL_ERROR)" in text
    assert f"{library} cannot be recorded by CUDA graphs" in text


def test_out_of_memory_status_says_what_to_free():
    error = _cuda.error_from_status(2, "cuGraphInstantiateWithFlags")
    assert isinstance(error, CugraphrtError) and not isinstance(error, CaptureError)
    assert error.status == 2
    assert "out of memory" in str(error) and "cugraphrt.empty_cache()" in str(error)


def test_unrelated_exceptions_pass_through():
    assert _diagnose.capture_error_from(ValueError("x"), FakeCapture()) is None
    assert _diagnose.capture_error_from(KeyboardInterrupt(), FakeCapture()) is None
