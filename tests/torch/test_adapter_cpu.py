"""GPU-free tests of the torch adapter: argument checks, dtype tables, error messages and the
allocator callbacks (against a pool on a fake backing allocator)."""

from __future__ import annotations

import threading

import numpy
import pytest

torch = pytest.importorskip("torch")

import cugraphrt_torch  # noqa: E402
from cugraphrt_torch.capture import _alloc, _errors  # noqa: E402
from cugraphrt_torch.capture.dlpack import cupy_dtype_name, torch_dtype_for  # noqa: E402

import cugraphrt  # noqa: E402
from cugraphrt import CaptureError, CugraphrtError, OptionsError, PoolOutOfMemoryError  # noqa: E402

from ..unit.fakes import FakeBackingAllocator  # noqa: E402

MiB = 1 << 20


# -- public namespace ------------------------------------------------------------------------

def test_public_names():
    assert set(cugraphrt_torch.__all__) == {"to_cupy", "from_cupy", "graph", "graph_module",
                                            "GraphedModule", "BucketedModule",
                                            "make_graphed_callables", "CompileOptions",
                                            "compile_report", "format_compile_report",
                                            "__version__", "while_loop", "cond",
                                            "CUDAGraph", "graph_pool_handle",
                                            "is_current_stream_capturing", "Generator",
                                            "GeneratorStats", "CapturedGraph",
                                            "PiecewiseModule", "PromptLookup", "DraftModel"}
    for name in cugraphrt_torch.__all__:
        assert getattr(cugraphrt_torch, name).__doc__


def test_a_captured_graphs_replays_are_disarmed_when_its_owner_goes():
    """The lifetime rule (capture/_adopted.py): a CapturedGraph's replays run torch's replay
    while the owner lives, and raise once the Graph let the owner go, instead of replaying a
    destroyed graph."""
    from cugraphrt_torch.capture._adopted import CapturedGraph, Owner, Replay

    class TorchGraph:  # what the owner keeps; a weak reference must reach it
        pass

    launched: list[int] = []
    torch_graph = TorchGraph()
    replay = Replay(lambda: launched.append(1), handles=None, device=0)
    owner = Owner(torch_graph, None, None, replay)
    captured = CapturedGraph(graph=None, replay=replay, memory="kept", seq=7,
                             torch_graph=torch_graph)
    captured.launch()
    assert launched == [1] and captured.seq == 7 and captured.memory == "kept"
    assert captured.torch_graph is torch_graph and "live" in repr(captured)
    del owner, torch_graph  # what Graph.reset() does to the last owner
    with pytest.raises(cugraphrt.ReplayError, match="reset"):
        captured.launch()
    assert launched == [1] and captured.torch_graph is None and "reset" in repr(captured)


# -- dtypes and conversions --------------------------------------------------------------------

@pytest.mark.parametrize("dtype, name", [
    (torch.float32, "float32"), (torch.float16, "float16"), (torch.float64, "float64"),
    (torch.bfloat16, "bfloat16"), (torch.int8, "int8"), (torch.uint8, "uint8"),
    (torch.int16, "int16"), (torch.int32, "int32"), (torch.int64, "int64"),
    (torch.bool, "bool"), (torch.complex64, "complex64"), (torch.complex128, "complex128"),
])
def test_dtype_table_round_trips(dtype, name):
    assert cupy_dtype_name(dtype) == name
    assert torch_dtype_for(name) is dtype
    if name != "bfloat16":
        assert torch_dtype_for(numpy.dtype(name)) is dtype


@pytest.mark.parametrize("name", ["float8_e4m3fn", "complex32", "qint8"])
def test_dtypes_without_cupy_counterpart_are_refused(name):
    dtype = getattr(torch, name, None)
    if dtype is None:
        pytest.skip(f"this torch has no {name}")
    with pytest.raises(OptionsError, match=rf"dtype torch\.{name}.*tensor\.float\(\)"):
        cupy_dtype_name(dtype)


def test_numpy_dtypes_without_torch_counterpart_are_refused():
    with pytest.raises(OptionsError, match=r"dtype str96.*astype"):
        torch_dtype_for(numpy.dtype("U3"))


def test_cpu_tensor_is_refused_with_advice():
    with pytest.raises(OptionsError, match=r"tensor on cpu.*tensor\.cuda\(\)"):
        cugraphrt_torch.to_cupy(torch.randn(4, 3))


def test_non_tensor_is_refused():
    with pytest.raises(OptionsError, match=r"ndarray.*torch\.Tensor"):
        cugraphrt_torch.to_cupy(numpy.ones(3))
    with pytest.raises(OptionsError, match=r"Tensor.*cupy\.ndarray"):
        cugraphrt_torch.from_cupy(torch.randn(3))


# -- graph() and graph_module() arguments ------------------------------------------------------

def test_graph_argument_checks():
    with pytest.raises(OptionsError, match="cuda_graph"):
        cugraphrt_torch.graph(object())
    with pytest.raises(OptionsError, match="capture_error_mode"):
        cugraphrt_torch.graph(cugraphrt.Graph(), capture_error_mode="strict")
    with pytest.raises(OptionsError, match="pool"):
        cugraphrt_torch.graph(cugraphrt.Graph(), pool=(0, 1))
    with pytest.raises(OptionsError, match="stream"):
        cugraphrt_torch.graph(cugraphrt.Graph(), stream=7)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message of a CPU-only torch")
def test_graph_without_cuda_torch_says_what_is_missing():
    with pytest.raises(CugraphrtError, match=r"CUDA build of PyTorch.*is_available\(\) = False"):
        with cugraphrt_torch.graph(cugraphrt.Graph()):
            pass


def test_graph_module_argument_checks():
    linear = torch.nn.Linear(3, 2)
    x = torch.randn(4, 3)
    with pytest.raises(OptionsError, match="module"):
        cugraphrt_torch.graph_module(lambda t: t, (x,))
    with pytest.raises(OptionsError, match=r"args\[1\] of type int"):
        cugraphrt_torch.graph_module(linear, (x, 3))
    with pytest.raises(OptionsError, match="non-empty tuple"):
        cugraphrt_torch.graph_module(linear, ())
    with pytest.raises(OptionsError, match=r"got 'cpu'.*one CUDA device"):
        cugraphrt_torch.graph_module(linear, x)
    with pytest.raises(OptionsError, match="num_warmup_iters"):
        cugraphrt_torch.graph_module(linear, x, num_warmup_iters=-1)
    with pytest.raises(OptionsError, match="strict"):
        cugraphrt_torch.graph_module(linear, x, strict="yes")


def test_static_inputs_copy_an_argument_that_overlaps_an_earlier_one():
    from cugraphrt_torch.inference.module import _static_inputs

    ids = torch.arange(32).reshape(2, 16)
    other = torch.ones(3)
    static = _static_inputs((ids, ids[:, :8], other, ids[1], torch.empty(0)))
    assert static[0] is ids and static[2] is other  # nothing to copy
    assert torch.equal(static[1], ids[:, :8])
    # its own memory: copying a call's second argument in leaves the first alone
    assert static[1].untyped_storage().data_ptr() != ids.untyped_storage().data_ptr()
    static[1].fill_(-1)
    assert torch.equal(ids, torch.arange(32).reshape(2, 16))
    # row 1 lies inside ids: copied too
    assert static[3] is not ids[1] and torch.equal(static[3], ids[1])
    halves = torch.arange(8)
    first, second = halves[:4], halves[4:]  # one storage, bytes apart: both kept
    kept = _static_inputs((first, second))
    assert kept[0] is first and kept[1] is second


# -- error translation -------------------------------------------------------------------------

_UNSUPPORTED = ("CUDA error: operation not permitted when stream is capturing\nSearch for "
                "`cudaErrorStreamCaptureUnsupported' in https://docs.nvidia.com/cuda/ for more "
                "information.")
_INVALIDATED = ("CUDA error: operation failed due to a previous error during capture\nSearch "
                "for `cudaErrorStreamCaptureInvalidated' in https://docs.nvidia.com/cuda/")


def _torch_error_on_this_line(message: str, make) -> RuntimeError:
    """Raise a real torch error from C code (no Python frame of its own), then give it
    ``message``: the traceback points at the caller's line, as with a capture failure."""
    try:
        make()
    except RuntimeError as exc:
        exc.args = (message,)
        return exc
    raise AssertionError("expected a RuntimeError")


def test_item_during_capture_is_named():
    t = torch.tensor([1.0, 2.0])
    exc = _torch_error_on_this_line(_UNSUPPORTED, lambda: t.item())
    err = _errors.capture_error(exc)
    assert isinstance(err, CaptureError)
    text = str(err)
    assert "`exc = _torch_error_on_this_line(_UNSUPPORTED, lambda: t.item())`" in text
    assert "copies a CUDA tensor to the host" in text
    assert "operation not permitted when stream is capturing" in text
    assert "rolled back" in text and "outside the captured region" in text


def test_data_dependent_shape_is_named():
    t = torch.zeros(6)
    exc = _torch_error_on_this_line(_UNSUPPORTED, lambda: t.view(-1, 4).nonzero())
    err = _errors.capture_error(exc)
    assert "nonzero" in str(err) and "depends on the data" in str(err)


def test_host_copy_check_is_a_capture_error():
    t = torch.zeros(6)
    message = ("Cannot copy between CPU and CUDA tensors during CUDA graph capture unless the "
               "CPU tensor is pinned.")
    exc = _torch_error_on_this_line(message, lambda: t.view(7).cpu())
    err = _errors.capture_error(exc)
    assert isinstance(err, CaptureError)
    assert "copies a CUDA tensor to the host" in str(err) and "pinned" in str(err)


def test_invalidated_capture_names_the_cause():
    t = torch.zeros(6)
    exc = _torch_error_on_this_line(_INVALIDATED, lambda: t.view(7))
    err = _errors.capture_error(exc, "torch.cuda.CUDAGraph.capture_end()")
    assert isinstance(err, CaptureError)
    assert "the capture was invalidated before `" in str(err)  # names the caller's line
    assert "an earlier operation of this capture failed" in str(err)
    assert _errors.torch_capture_status(exc) == 901


def test_other_errors_are_left_alone():
    t = torch.zeros(6)
    exc = _torch_error_on_this_line("shape '[7]' is invalid for input of size 6",
                                    lambda: t.view(7))
    assert _errors.capture_error(exc) is None
    assert _errors.capture_error(ValueError("no")) is None


def test_rng_outside_torch_capture_gets_advice():
    exc = RuntimeError("Attempt to increase offset for a CUDA generator not in capture mode.")
    err = _errors.capture_error(exc)
    assert isinstance(err, CaptureError) and "cugraphrt_torch.graph()" in str(err)


# -- allocator callbacks -----------------------------------------------------------------------

class _FakeCapture:
    def __init__(self, pool, capture_id):
        self.pool = pool
        self.token = object()
        self.capture_id = capture_id
        pool._begin_capture(self.token)


@pytest.fixture
def capture():
    pool = cugraphrt.MemPool(backing=FakeBackingAllocator(capacity=64 * MiB))
    fake = _FakeCapture(pool, capture_id=4242)
    _alloc.register(fake)
    yield fake
    _alloc.unregister(fake)
    pool._end_capture(fake.token, succeeded=False)


def test_segments_come_from_the_capture_pool_and_go_back(capture):
    ptr = _alloc._C_ALLOC(20 * MiB, 0, 0x7000)  # through the real C trampoline
    assert ptr and ptr in _alloc._live
    stats = capture.pool.stats()
    assert stats.active_bytes == 20 * MiB and stats.live_arrays == 1
    _alloc._C_FREE(ptr, 20 * MiB, 0, 0x7000)
    assert ptr not in _alloc._live
    assert capture.pool.stats().active_bytes == 0


def test_no_capture_or_wrong_device_gives_null(capture):
    assert _alloc._on_alloc(MiB, 1, 0x7000) is None  # the pool lives on device 0
    _alloc.unregister(capture)
    assert _alloc._C_ALLOC(MiB, 0, 0x7000) is None
    _alloc.register(capture)


def test_warm_ups_allocate_from_the_pool_by_thread_not_by_stream():
    """A capture's warm-ups (before it begins) get segments of its pool on their own thread,
    on any stream; another thread's allocation meanwhile is not theirs. Once they end, a
    capture underway is served as before."""
    pool = cugraphrt.MemPool(backing=FakeBackingAllocator(capacity=64 * MiB))
    token = object()
    pool._begin_capture(token)
    got: dict[str, object] = {}
    try:
        with _alloc.serving_thread(pool, token):
            for stream in (0x7000, 0x9000):  # the capture stream, a side stream
                got[hex(stream)] = _alloc._C_ALLOC(MiB, 0, stream)
            other = threading.Thread(target=lambda: got.update(other=_alloc._on_alloc(
                MiB, 0, 0x7000)))
            other.start()
            other.join()
        assert got["0x7000"] and got["0x9000"]
        assert pool.stats().active_bytes == 2 * MiB
        assert got["other"] is None
        assert _alloc._C_ALLOC(MiB, 0, 0x7000) is None  # the warm-ups ended
    finally:
        for key in ("0x7000", "0x9000"):
            if got.get(key):
                _alloc._C_FREE(got[key], MiB, 0, int(key, 16))
        pool._end_capture(token, succeeded=False)
    assert pool.stats().active_bytes == 0


def test_out_of_memory_gives_null_and_keeps_the_pool_error(capture):
    assert _alloc._on_alloc(128 * MiB, 0, 0x7000) is None
    error = _alloc.pool_error(capture)
    assert isinstance(error, PoolOutOfMemoryError)
    assert error.requested_bytes == 128 * MiB


def test_free_of_unknown_pointer_is_ignored():
    _alloc._C_FREE(0x1234, 64, 0, 0)
    _alloc._C_FREE(None, 0, 0, None)


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a CPU-only build of torch")
def test_require_gpu_fails_torch_gpu_tests_on_a_cpu_only_torch():
    """Under CUGRAPHRT_REQUIRE_GPU=1 a torch GPU module is not skipped for want of a CUDA
    build of torch: its tests fail, saying so. Without the variable they skip, as before."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rfEs",
               "tests/torch/test_dlpack_gpu.py"]
    strict = subprocess.run(command, cwd=root, capture_output=True, text=True, timeout=300,
                            env={**os.environ, "CUGRAPHRT_REQUIRE_GPU": "1"})
    assert strict.returncode == 1, strict.stdout[-2000:]
    assert "CUGRAPHRT_REQUIRE_GPU=1 but this test needs a CUDA build of torch" in strict.stdout
    assert " passed" not in strict.stdout and " errors in " in strict.stdout  # each, at set-up
    env = {k: v for k, v in os.environ.items() if k != "CUGRAPHRT_REQUIRE_GPU"}
    lenient = subprocess.run(command, cwd=root, capture_output=True, text=True, timeout=300,
                             env=env)
    assert lenient.returncode == 5 or "skipped" in lenient.stdout, lenient.stdout[-2000:]
    assert "needs a CUDA build of torch" in lenient.stdout


def test_a_workspace_owners_captures_keep_torchs_cached_workspaces(monkeypatch):
    """blas_workspaces_for: captures of one owner (a Generator) share torch's cached cuBLAS
    workspaces; any other capture, or an owner that died, drops them first."""
    import gc

    from cugraphrt_torch.capture import _torch

    clears: list[int] = []
    monkeypatch.setattr(_torch._cuda_internals, "clear_cublas_workspaces",
                        lambda: clears.append(1))

    class Owner:
        pass

    first, second = Owner(), Owner()
    _torch.blas_workspaces_for(first)
    _torch.blas_workspaces_for(first)  # its own: kept
    assert len(clears) == 1
    _torch.blas_workspaces_for(second)  # another owner's: dropped
    _torch.blas_workspaces_for(None)  # a capture of nobody's: dropped, every time
    _torch.blas_workspaces_for(None)
    assert len(clears) == 4
    _torch.blas_workspaces_for(second)
    _torch.drop_blas_workspaces()  # dropped elsewhere: the owner's next capture drops too
    _torch.blas_workspaces_for(second)
    assert len(clears) == 7
    del second
    gc.collect()
    third = Owner()  # the dead owner's workspaces are nobody's
    _torch.blas_workspaces_for(third)
    assert len(clears) == 8


# -- the contexts a capture runs in ----------------------------------------------------------

class _Context:
    def __init__(self, name, log, fail_enter=False, fail_exit=False):
        self.name, self.log, self.fail_enter, self.fail_exit = name, log, fail_enter, fail_exit

    def __enter__(self):
        if self.fail_enter:
            raise RuntimeError(f"enter {self.name}")
        self.log.append(f"+{self.name}")

    def __exit__(self, *exc):
        self.log.append(f"-{self.name}")
        if self.fail_exit:
            raise RuntimeError(f"exit {self.name}")


def test_switched_contexts_are_left_in_reverse():
    from cugraphrt_torch.capture._torch import Switched

    log: list[str] = []
    switched = Switched(_Context("a", log), _Context("b", log), _Context("c", log))
    assert log == ["+a", "+b", "+c"]
    switched.close()
    assert log == ["+a", "+b", "+c", "-c", "-b", "-a"]
    switched.close()  # left once only
    assert log == ["+a", "+b", "+c", "-c", "-b", "-a"]


def test_a_context_that_fails_to_enter_leaves_the_earlier_ones_and_raises_its_error():
    from cugraphrt_torch.capture._torch import Switched

    log: list[str] = []
    with pytest.raises(RuntimeError, match="enter b"):
        Switched(_Context("a", log, fail_exit=True), _Context("b", log, fail_enter=True),
                 _Context("c", log))
    assert log == ["+a", "-a"]


def test_every_context_is_left_when_one_fails_to_exit_and_the_first_error_is_raised():
    from cugraphrt_torch.capture._torch import Switched

    log: list[str] = []
    switched = Switched(_Context("a", log, fail_exit=True), _Context("b", log),
                        _Context("c", log, fail_exit=True))
    with pytest.raises(RuntimeError, match="exit c"):
        switched.close()
    assert log == ["+a", "+b", "+c", "-c", "-b", "-a"]
