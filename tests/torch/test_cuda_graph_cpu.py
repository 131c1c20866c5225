"""GPU-free tests of cugraphrt_torch.CUDAGraph (issue 23.1): torch's signatures and messages,
the keep_graph / instantiate / replay states over an adopted graph (fake handles, fake torch
replay), the torch out-of-memory peer error. The captures themselves are in
tests/torch/test_cuda_graph_gpu.py."""

from __future__ import annotations

import inspect
import pickle
import warnings
import weakref

import pytest

torch = pytest.importorskip("torch")

import cugraphrt_torch  # noqa: E402
from cugraphrt_torch.capture import _errors, capture, cuda_graph  # noqa: E402

import cugraphrt  # noqa: E402
from cugraphrt import CaptureError, OptionsError, PoolOutOfMemoryError, ReplayError  # noqa: E402
from cugraphrt import adapter as core  # noqa: E402

# torch 2.11's signatures (2.13 adds check_input_liveness / enable_annotations, which torch
# 2.11 code cannot pass).
TORCH_2_11 = {
    "CUDAGraph.__init__": ["keep_graph"],
    "CUDAGraph.capture_begin": ["pool", "capture_error_mode"],
    "graph": ["cuda_graph", "pool", "stream", "capture_error_mode"],
    "make_graphed_callables": ["callables", "sample_args", "num_warmup_iters",
                               "allow_unused_input", "pool"],
}


@pytest.mark.parametrize("name", list(TORCH_2_11))
def test_torch_signatures_are_accepted_in_order(name):
    ours = cugraphrt_torch
    for part in name.split("."):
        ours = getattr(ours, part)
    parameters = [p for p in inspect.signature(ours).parameters if p != "self"]
    assert parameters[:len(TORCH_2_11[name])] == TORCH_2_11[name]


def test_the_whole_torch_surface_is_there():
    for name in ("capture_begin", "capture_end", "replay", "reset", "pool", "instantiate",
                 "debug_dump", "enable_debug_mode", "raw_cuda_graph", "raw_cuda_graph_exec",
                 "register_generator_state"):
        assert callable(getattr(cugraphrt_torch.CUDAGraph, name)), name
    assert issubclass(cugraphrt_torch.CUDAGraph, cugraphrt.Graph)
    for name in ("graph_pool_handle", "is_current_stream_capturing", "graph",
                 "make_graphed_callables", "CUDAGraph"):
        assert hasattr(torch.cuda, name) and hasattr(cugraphrt_torch, name), name


def test_is_current_stream_capturing_without_a_device_is_false():
    assert cugraphrt_torch.is_current_stream_capturing() is False


# -- before any capture ------------------------------------------------------------------------

def test_before_a_capture_the_messages_are_torchs():
    g = cugraphrt_torch.CUDAGraph()
    with pytest.raises(ReplayError, match="Called CUDAGraph::replay without a preceding "
                                          "successful capture"):
        g.replay()
    with pytest.raises(CaptureError, match=r"capture_end\(\) without a capture underway"):
        g.capture_end()
    with pytest.raises(CaptureError, match=r"instantiate\(\) is intended to be called by the "
                                           r"user only when keep_graph=true"):
        g.instantiate()
    with pytest.raises(CaptureError, match="You cannot access the raw cudaGraph_t instance "
                                           "unless CUDAGraph was initialized with "
                                           "keep_graph=true"):
        g.raw_cuda_graph()
    with pytest.raises(CaptureError, match=r"You cannot access the raw cudaGraphExec_t "
                                           r"instance until instantiate\(\) has been called"):
        g.raw_cuda_graph_exec()
    kept = cugraphrt_torch.CUDAGraph(keep_graph=True)
    with pytest.raises(CaptureError, match=r"capture_end\(\) must have been called before "
                                           r"calling instantiate"):
        kept.instantiate()
    with pytest.raises(CaptureError, match=r"until capture_end\(\) has been called"):
        kept.raw_cuda_graph()
    assert g.pool() is None


def test_debug_dump_without_debug_mode_warns_as_torch_does(tmp_path):
    g = cugraphrt_torch.CUDAGraph()
    with pytest.warns(UserWarning, match=r"CUDA Graphs debug not enabled, set with "
                                         r"\[graph\]\.enable_debug_mode\(\)"):
        g.debug_dump(tmp_path / "g.dot")
    g.enable_debug_mode()
    with pytest.raises(CaptureError, match=r"debug_dump\(\) before capture_end\(\)"):
        g.debug_dump(tmp_path / "g.dot")


def test_capture_begin_refuses_torch_pool_ids_and_bad_modes():
    g = cugraphrt_torch.CUDAGraph()
    with pytest.raises(OptionsError, match=r"'pool'.*cugraphrt_torch\.graph_pool_handle\(\)"):
        g.capture_begin(pool=(0, 7))  # what torch.cuda.graph_pool_handle() returns
    with pytest.raises(OptionsError, match="capture_error_mode"):
        g.capture_begin(capture_error_mode="strict")


# -- an adopted graph: the keep_graph / instantiate / replay states --------------------------

class FakeReplay:
    """What _TorchCapture hands over: torch's replay (on torch's stream, or on a given one)."""

    def __init__(self):
        self.calls = []

    def on_torch_stream(self):
        self.calls.append("torch's current stream")

    def __call__(self, stream=None):
        self.calls.append(stream)


def _adopted(graph_class, keep_graph: bool, exec_handle: int):
    g = graph_class(keep_graph=keep_graph)
    made = []
    executables = iter([0x500, 0x600, 0x700])

    def instantiate():  # torch's instantiate: a new cudaGraphExec_t each time
        made.append(next(executables))
        return made[-1]

    g._captured, g._device = True, 0  # what Graph._end leaves after a successful capture
    replay = FakeReplay()
    # What the adapter's capture does at its end (cugraphrt_torch.capture.capture:
    # _TorchCapture.end).
    adopted = getattr(g, "_adopted", None)
    core.adopt(g, object(), 0x400, exec_handle, route=replay if adopted is None else None,
               instantiate=instantiate)
    if adopted is not None:
        adopted(replay, exec_handle)
    return g, replay, made


def test_kept_graph_instantiates_at_first_replay_and_again_on_request():
    g, replay, made = _adopted(cugraphrt_torch.CUDAGraph, keep_graph=True, exec_handle=0)
    assert g.raw_cuda_graph() == 0x400
    with pytest.raises(CaptureError, match=r"until instantiate\(\) has been called"):
        g.raw_cuda_graph_exec()
    g.replay()
    assert made == [0x500] and g.raw_cuda_graph_exec() == 0x500
    g.replay()
    assert made == [0x500] and replay.calls == ["torch's current stream"] * 2
    g.instantiate()  # re-instantiation, as after editing the raw graph
    assert made == [0x500, 0x600] and g.raw_cuda_graph_exec() == 0x600
    g.replay(stream="side")
    assert replay.calls[-1] == "side"
    g.reset()
    with pytest.raises(ReplayError, match="without a preceding successful capture"):
        g.replay()
    with pytest.raises(CaptureError, match=r"until capture_end\(\) has been called"):
        g.raw_cuda_graph()


@pytest.mark.parametrize("keep_graph, exec_handle", [(True, 0), (False, 0x500)])
def test_dropping_a_captured_graph_frees_it_at_once(keep_graph, exec_handle):
    g, _, _ = _adopted(cugraphrt_torch.CUDAGraph, keep_graph, exec_handle)
    watch = weakref.ref(g)
    del g  # no reference cycle: torch users expect `del g` to free the graph now
    assert watch() is None


def test_graph_without_keep_graph_is_instantiated_and_refuses_instantiate():
    g, replay, made = _adopted(cugraphrt_torch.CUDAGraph, keep_graph=False, exec_handle=0x500)
    assert g.raw_cuda_graph_exec() == 0x500
    g.replay()
    assert replay.calls == ["torch's current stream"] and made == []
    with pytest.raises(CaptureError, match="only when keep_graph=true"):
        g.instantiate()
    with pytest.raises(CaptureError, match="unless CUDAGraph was initialized with keep_graph"):
        g.raw_cuda_graph()


def test_debug_dump_writes_the_adopted_graph(monkeypatch, tmp_path):
    written = []
    monkeypatch.setattr(cuda_graph._cuda, "debug_dot_print",
                        lambda handle, path: written.append((handle, path)))
    g, _, _ = _adopted(cugraphrt_torch.CUDAGraph, keep_graph=False, exec_handle=0x500)
    g.enable_debug_mode()
    g.debug_dump(tmp_path / "g.dot")
    assert written == [(0x400, str(tmp_path / "g.dot"))]


def test_plain_graph_with_keep_graph_instantiates_a_torch_capture():
    # Once refused ("its executable belongs to an adapter"): now through torch's instantiate.
    g, _, made = _adopted(cugraphrt.Graph, keep_graph=True, exec_handle=0)
    assert g.raw_graph_exec == 0x500 and made == [0x500]  # instantiated on first use
    g.instantiate()
    g.instantiate()
    assert made == [0x500, 0x600, 0x700] and g.raw_graph_exec == 0x700


def test_adopted_graph_without_an_instantiate_hook_stays_refused():
    g = cugraphrt.Graph(keep_graph=True)
    g._captured, g._device = True, 0
    core.adopt(g, object(), 0x400, 0x500)
    with pytest.raises(CaptureError, match="belongs to an adapter"):
        g.instantiate()


def test_generator_states_are_kept_for_the_captures_and_forgotten_at_reset():
    g = cugraphrt_torch.CUDAGraph()
    states = [object(), object()]
    for state in states:
        g.register_generator_state(state)
    assert g._generator_states == states  # what each capture's torch graph registers
    g.reset()
    assert g._generator_states == []  # as torch forgets them at reset


# -- the out-of-memory peer error --------------------------------------------------------------

def test_pool_out_of_memory_in_a_torch_capture_is_also_torchs():
    pool_error = PoolOutOfMemoryError(1 << 42, 2 << 20, 1 << 30, 80 << 30)
    error = _errors.torch_out_of_memory(pool_error)
    assert isinstance(error, torch.OutOfMemoryError) and isinstance(error, RuntimeError)
    assert isinstance(error, PoolOutOfMemoryError) and isinstance(error, MemoryError)
    assert str(error) == str(pool_error) and "out of memory" in str(error)
    assert error.requested_bytes == 1 << 42
    again = pickle.loads(pickle.dumps(error))
    assert type(again) is type(error) and again.device_total_bytes == 80 << 30
    other = ValueError("x")
    assert _errors.torch_out_of_memory(other) is other


def test_a_capture_that_ran_out_of_pool_memory_raises_torchs_error():
    session = capture._TorchCapture.__new__(capture._TorchCapture)
    session.pool_error = PoolOutOfMemoryError(1 << 42, 0, 1 << 30, 80 << 30)
    session.failed = None
    error = session.error_for(torch.OutOfMemoryError("CUDA out of memory. Tried to allocate"))
    assert isinstance(error, torch.OutOfMemoryError) and "graph memory pool" in str(error)


def test_no_warning_or_error_from_an_unused_graph():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        g = cugraphrt_torch.CUDAGraph(keep_graph=True)
        g.reset()
        del g
