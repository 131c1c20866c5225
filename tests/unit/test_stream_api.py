"""CuPy's capture API by name (issue 23.2): cugraphrt.Stream, a cupy.cuda.Stream whose
begin_capture / end_capture go through cugraphrt. GPU-free parts: what is overridden (and what
is not: nothing on the paths that run kernels), the capture modes, the errors. The captures
themselves are tested in tests/gpu/test_stream_capture.py."""

from __future__ import annotations

import cupy
import pytest
from cupy_backends.cuda.api import runtime

import cugraphrt
from cugraphrt import CaptureError, CugraphrtError, OptionsError
from cugraphrt._capture import stream


def test_only_the_capture_methods_and_synchronize_are_overridden():
    own = {name for name in vars(cugraphrt.Stream) if not name.startswith("__")}
    assert own == {"begin_capture", "end_capture", "_end_foreign_capture", "synchronize"}
    assert issubclass(cugraphrt.Stream, cupy.cuda.Stream)
    # Entering the stream, making it current and recording on it are CuPy's own functions:
    # the subclass adds nothing on the paths that launch work.
    for name in ("__enter__", "__exit__", "use", "record", "wait_event", "launch_host_func",
                 "is_capturing", "__init__"):
        assert getattr(cugraphrt.Stream, name) is getattr(cupy.cuda.Stream, name), name


def test_stream_graph_launch_is_graph_replay():
    assert cugraphrt.StreamGraph.launch is cugraphrt.Graph.replay
    assert issubclass(cugraphrt.StreamGraph, cugraphrt.Graph)
    for name in ("upload", "replay", "debug_dot_str", "pool", "reset"):
        assert callable(getattr(cugraphrt.StreamGraph, name))


@pytest.mark.parametrize("mode, name", [
    (None, "relaxed"),  # CuPy's default
    (runtime.streamCaptureModeGlobal, "global"),
    (runtime.streamCaptureModeThreadLocal, "thread_local"),
    (runtime.streamCaptureModeRelaxed, "relaxed"),
    ("thread_local", "thread_local"),
])
def test_capture_modes_are_cupys_values_or_names(mode, name):
    assert stream._mode_name(mode) == name


@pytest.mark.parametrize("mode", [7, "strict", 1.5])
def test_unknown_capture_modes_are_refused(mode):
    with pytest.raises(OptionsError, match=r"invalid value for option 'mode'.*cudaStreamCapture"):
        stream._mode_name(mode)


def test_synchronize_during_a_capture_is_explained_and_still_cupys_error(monkeypatch):
    def refused(self):
        raise runtime.CUDARuntimeError(900)  # cudaErrorStreamCaptureUnsupported

    monkeypatch.setattr(cupy.cuda.Stream, "synchronize", refused)
    s = cugraphrt.Stream(null=True)  # a Stream object without a device
    with pytest.raises(runtime.CUDARuntimeError) as info:
        s.synchronize()
    error = info.value
    assert isinstance(error, CaptureError) and error.status == 900
    assert "cudaErrorStreamCaptureUnsupported" in str(error)  # what CuPy's tests match
    assert "Stream.synchronize()" in str(error) and "warm up first" in str(error)


def test_synchronize_outside_a_capture_is_cupys(monkeypatch):
    calls = []
    monkeypatch.setattr(cupy.cuda.Stream, "synchronize", lambda self: calls.append(self))
    s = cugraphrt.Stream(null=True)
    s.synchronize()
    assert calls == [s]


def test_end_capture_without_a_capture_is_cudas_answer_translated(monkeypatch):
    def end_capture(self):
        raise runtime.CUDARuntimeError(401)  # what cudaStreamEndCapture says here

    monkeypatch.setattr(cupy.cuda.Stream, "end_capture", end_capture)
    s = cugraphrt.Stream(null=True)
    with pytest.raises(runtime.CUDARuntimeError, match="cudaErrorIllegalState") as info:
        s.end_capture()
    assert isinstance(info.value, CugraphrtError) and not isinstance(info.value, CaptureError)
    assert info.value.status == 401 and "cudaStreamEndCapture" in str(info.value)

