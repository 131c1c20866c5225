"""Errors that are also the peer's (issue 23): each capture error stays a CaptureError with its
explanation and is also what CuPy (or torch) raises in the same situation; messages carry the
peer's wording where code matches on it."""

from __future__ import annotations

import pickle
import warnings

import pytest
from cupy_backends.cuda.api import runtime

import cugraphrt
from cugraphrt import CaptureError, CugraphrtError
from cugraphrt._capture import diagnose as _diagnose
from cugraphrt._capture import graphs
from cugraphrt._capture import stream_capture as _capture
from cugraphrt._cuda import runtime as _cuda
from cugraphrt._cuda.status_errors import CudaCaptureError, CudaStatusError, LibraryCaptureError
from cugraphrt._libraries import capture_setup as _libs


@pytest.mark.parametrize("status, name", [
    (900, "cudaErrorStreamCaptureUnsupported"),
    (901, "cudaErrorStreamCaptureInvalidated"),
    (903, "cudaErrorStreamCaptureUnmatched"),
    (904, "cudaErrorStreamCaptureUnjoined"),
    (906, "cudaErrorStreamCaptureImplicit"),
])
def test_capture_statuses_are_also_cupys_runtime_error(status, name):
    error = _cuda.error_from_status(status, "cudaStreamEndCapture")
    assert isinstance(error, CaptureError) and isinstance(error, runtime.CUDARuntimeError)
    assert error.status == status
    # CuPy's tests match the status name in the message; the explanation stays.
    assert name in str(error) and "cudaStreamEndCapture" in str(error)
    try:
        raise error
    except runtime.CUDARuntimeError as caught:  # code written for CuPy catches it
        assert caught is error


@pytest.mark.parametrize("status, name", [(401, "cudaErrorIllegalState"),
                                          (2, "cudaErrorMemoryAllocation")])
def test_other_statuses_are_cugraphrt_and_cupy_errors_but_not_capture_errors(status, name):
    error = _cuda.error_from_status(status, "cudaStreamEndCapture")
    assert isinstance(error, CudaStatusError) and isinstance(error, runtime.CUDARuntimeError)
    assert isinstance(error, CugraphrtError) and not isinstance(error, CaptureError)
    assert error.status == status and name in str(error)


@pytest.mark.parametrize("error", [CudaCaptureError("explained (901)", 901),
                                   CudaStatusError("explained (401)", 401)])
def test_peer_errors_pickle_with_message_and_status(error):
    again = pickle.loads(pickle.dumps(error))
    assert type(again) is type(error)
    assert str(again) == str(error) and again.status == error.status


class _CaptureContext:
    mode = "thread_local"
    notes: list = []
    stream = None


def test_invalidated_capture_diagnosis_keeps_the_status():
    cause = _cuda.error_from_status(901, "cudaStreamEndCapture")
    error = _diagnose.capture_error_from(cause, _CaptureContext())
    assert error is not cause
    assert isinstance(error, runtime.CUDARuntimeError) and error.status == 901
    assert "cudaErrorStreamCaptureInvalidated" in str(error)
    assert "Likely causes" in str(error)


def test_a_non_capture_status_during_a_capture_is_a_capture_error_with_its_status():
    cupy_error = runtime.CUDARuntimeError(700)
    error = _diagnose.capture_error_from(cupy_error, None)
    assert isinstance(error, CaptureError) and isinstance(error, runtime.CUDARuntimeError)
    assert error.status == 700 and "run it before the captured region" in str(error)


@pytest.mark.parametrize("library", ["cuSOLVER", "cuRAND", "cuSPARSE"])
def test_cupys_library_refusals_become_not_implemented_capture_errors(library):
    refusal = NotImplementedError(
        f"calling {library} API during stream capture is currently unsupported")
    error = _diagnose.capture_error_from(refusal)
    assert isinstance(error, LibraryCaptureError)
    assert isinstance(error, NotImplementedError) and isinstance(error, CaptureError)
    assert library in str(error)


class CuFFTError(RuntimeError):  # CuPy's classes, as they are (the library modules need
    def __init__(self, result):  # the CUDA libraries to import, which CPU machines lack)
        super().__init__(f"CUFFT status {result}")
        self.result = result


class CUBLASError(RuntimeError):
    def __init__(self, status):
        super().__init__(f"CUBLAS status {status}")
        self.status = status


@pytest.mark.parametrize("peer, attr", [(CuFFTError, "result"), (CUBLASError, "status")])
def test_library_errors_in_a_capture_are_also_the_librarys_own_class(peer, attr):
    cause = peer(5)  # the library's status 5 (an internal error)
    error = _diagnose.capture_error_from(cause)
    assert isinstance(error, CaptureError) and isinstance(error, peer)
    assert getattr(error, attr) == 5 and "cannot be recorded by CUDA graphs" in str(error)
    again = pickle.loads(pickle.dumps(error))
    assert type(again) is type(error) and str(again) == str(error)
    assert getattr(again, attr) == 5
    try:
        raise error
    except peer as caught:  # code written for CuPy catches it by CuPy's class
        assert caught is error


def test_cupys_sync_refusal_stays_a_runtime_error_not_a_library_one():
    refusal = RuntimeError("the current stream is capturing, so synchronous API calls are "
                           "disallowed")
    error = _diagnose.capture_error_from(refusal)
    assert isinstance(error, CaptureError) and not isinstance(error, NotImplementedError)
    assert "is capturing" in str(error)


def test_library_guards_refuse_with_not_implemented_error(monkeypatch):
    calls = []
    guarded = _libs._refusing(lambda *a: calls.append(a), "cusolver.dgesvd", "cuSOLVER",
                              "run the solver outside")
    monkeypatch.setattr(_capture, "current_capture", lambda: object())
    with pytest.raises(NotImplementedError, match="cuSOLVER call cusolver.dgesvd") as info:
        guarded(1, 2)
    assert isinstance(info.value, CaptureError) and calls == []
    monkeypatch.setattr(_capture, "current_capture", lambda: None)
    guarded(1, 2)
    assert calls == [(1, 2)]


class _Stream:
    def __init__(self, ptr):
        self.ptr = ptr


def test_default_stream_refusal_carries_torchs_wording(monkeypatch):
    monkeypatch.setattr(_capture, "_get_current_stream", lambda: _Stream(0))
    with pytest.raises(CaptureError) as info:
        _capture.begin(pool=None, mode="global")  # refused before the pool is looked at
    text = str(info.value)
    assert "CUDA graphs must be captured on a non-default stream." in text  # torch's phrase
    assert "legacy default stream" in text and "(got stream 0x0)" in text


class _FakeCapture:
    def __init__(self):
        self.pool = None
        self.keepalive = []
        self.aborted_by = None
        self.collectives = None  # none recorded (cugraphrt.distributed.log)
        self.bodies = []  # no loop or branch bodies


def test_empty_graph_warning_carries_torchs_wording(monkeypatch):
    monkeypatch.setattr(graphs._capture, "end", lambda capture, finish: (0x1234, 0))
    monkeypatch.setattr(graphs._cuda, "graph_node_count", lambda handle: 0)
    monkeypatch.setattr(graphs._cuda, "destroy_graph", lambda handle: None)
    g = cugraphrt.Graph(keep_graph=True)
    g._capture = _FakeCapture()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        g._end(finish=None, instantiate=False)
    texts = [str(w.message) for w in caught]
    assert any("The CUDA Graph is empty" in t and "(got 0 nodes)" in t for t in texts), texts
