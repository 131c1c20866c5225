"""The overwritten-output check of the torch adapter without a GPU.

torch's markers exist only in CUDA builds, so a recording fake stands in for them; everything
else is real: fresh storages from DLPack, weak references to them, which outputs are alive at
the next replay, the messages, and the call paths of ``GraphedModule``, graphed callables and
compile pieces, whose "graphs" here recompute on the CPU into the static outputs.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

import cugraphrt_torch  # noqa: E402
from cugraphrt_torch.capture import _output_check  # noqa: E402
from cugraphrt_torch.capture._adopted import CapturedGraph  # noqa: E402
from cugraphrt_torch.capture._output_check import (  # noqa: E402
    FIX_CLONE,
    FIX_COMPILE,
    FIX_COPY,
    checkable,
    make_check,
)
from cugraphrt_torch.capture.framework import TORCH  # noqa: E402
from cugraphrt_torch.compile import dynamo  # noqa: E402
from cugraphrt_torch.compile._aot_graph import (  # noqa: E402
    AotGraph,
    AotGraphSettings,
    _CopyIn,
    _HandOut,
    _Recording,
)
from cugraphrt_torch.inference.module import GraphedModule  # noqa: E402

from cugraphrt import OptionsError  # noqa: E402
from cugraphrt.adapter import CallPath, HandOut, OutputCheck, OverwriteOrder  # noqa: E402

from .test_autograd_cpu import F64, backward_twice, fake_group, linear_pair  # noqa: E402


@pytest.fixture
def marks(monkeypatch):
    """Replaces torch's storage marker: records (storage key, message)."""
    seen: list[tuple[int, str]] = []
    monkeypatch.setattr(_output_check, "_mark_storage", lambda key, msg: seen.append((key, msg)))
    monkeypatch.delenv("CUGRAPHRT_CHECK_OUTPUTS", raising=False)
    return seen


def key(tensor) -> int:
    return tensor.untyped_storage()._cdata


class FakeReplay:
    def __init__(self, run) -> None:
        self.on_torch_stream = self.launch = run


class _TorchGraph:
    """Stands for torch's graph: gone at once (GraphedModule.torch_graph reads None)."""


def fake_captured(run, seq: int) -> CapturedGraph:
    return CapturedGraph(None, FakeReplay(run), None, seq, _TorchGraph())


def graphed_module(module, *sample, order=None, seq=0, check_outputs=True, copy_outputs=False):
    """A GraphedModule whose "replay" recomputes ``module`` into the static outputs."""
    static = tuple(t.clone() for t in sample)
    with torch.no_grad():
        outputs = module(*static)
    leaves = [outputs] if isinstance(outputs, torch.Tensor) else list(outputs)

    def run():
        with torch.no_grad():
            fresh = module(*static)
            for out, new in zip(leaves, [fresh] if isinstance(fresh, torch.Tensor) else fresh,
                                strict=True):
                out.copy_(new)

    order = order if order is not None else OverwriteOrder()
    check = None if copy_outputs else make_check(
        check_outputs, f"graph_module({type(module).__name__})", FIX_COPY, order)
    return GraphedModule(module, fake_captured(run, seq), static, outputs, copy_outputs, False,
                         order=order, check=check)


class Twice(torch.nn.Module):
    def forward(self, x):
        return x * 2


# -- availability -------------------------------------------------------------------------

@pytest.mark.skipif(hasattr(torch._C, "_set_storage_access_error_msg"),
                    reason="a CUDA build of torch has the markers (test_stale_outputs_gpu.py)")
def test_this_cpu_build_has_no_marker_and_the_check_is_off():
    assert _output_check.available() is None  # CPU builds of torch lack both markers
    assert make_check(True, "f", FIX_COPY, OverwriteOrder()) is None
    module = Twice()
    graphed = graphed_module(module, torch.randn(3))
    assert graphed(torch.randn(3)) is graphed.static_outputs  # the outputs as before


def test_weak_references_to_storages_follow_the_storage_on_this_build():
    assert _output_check._storage_refs_follow_storages()


def test_the_marker_in_use_is_found_once(monkeypatch, marks):
    assert _output_check.available() == "storage"
    monkeypatch.setattr(_output_check, "_BY_STORAGE", False)
    monkeypatch.setattr(_output_check, "_mark_tensor", None)  # as on a CPU build
    assert _output_check.available() is None
    monkeypatch.setattr(_output_check, "_mark_tensor", lambda t, msg: None)
    assert _output_check.available() == "tensor"


def test_what_can_be_handed_out_as_an_alias():
    assert checkable(torch.randn(2, 3)) and checkable(torch.randn(4, 5)[1:, ::2])
    assert checkable(torch.nn.Parameter(torch.randn(2)))
    assert not checkable(torch.randn(2, dtype=torch.complex64).conj())  # DLPack drops the bit
    assert not checkable(torch.randn(3).to_sparse())
    assert not checkable(3.0)


# -- graph_module ---------------------------------------------------------------------------

def test_graph_module_hands_out_fresh_storages_and_marks_the_live_ones(marks):
    graphed = graphed_module(Twice(), torch.randn(4))
    x1, x2, x3 = (torch.randn(4, dtype=torch.float32) for _ in range(3))
    y1 = graphed(x1)
    static = graphed.static_outputs
    assert y1 is not static and y1.data_ptr() == static.data_ptr()
    assert key(y1) != key(static)
    assert torch.equal(y1, x1 * 2)
    y2 = graphed(x2)
    assert marks == [(key(y1), f"cugraphrt: this tensor is output of call #1 of "
                               f"graph_module(Twice), and a later replay has overwritten its "
                               f"memory (got an access after that replay); a graphed callable "
                               f"returns its static outputs, valid until its next call: "
                               f"{FIX_COPY}")]
    assert torch.equal(y2, x2 * 2) and key(y2) != key(y1)
    del y2  # dropped before the next call: nothing to mark
    marks.clear()
    graphed(x3)
    assert marks == []


def test_a_view_of_a_dropped_output_is_marked_through_its_storage(marks):
    graphed = graphed_module(Twice(), torch.randn(4, 3))
    last_row = graphed(torch.randn(4, 3))[-1]  # the output itself is gone at once
    graphed(torch.randn(4, 3))
    assert [k for k, _ in marks] == [key(last_row)]
    assert "output of call #1" in marks[0][1]


def test_a_call_on_its_previous_output_copies_it_in_before_marking(marks, monkeypatch):
    graphed = graphed_module(Twice(), torch.randn(4))
    static_in = graphed.static_inputs[0]
    seen = []
    monkeypatch.setattr(_output_check, "_mark_storage",
                        lambda k, msg: seen.append(torch.equal(static_in, x)))
    x = graphed(torch.randn(4))
    first = x.clone()
    x = graphed(x)  # x = f(x): read before the replay overwrites it
    assert seen == [True] and torch.equal(x, first * 2)


def test_nested_outputs_are_named_by_their_place(marks):
    class Pair(torch.nn.Module):
        def forward(self, x):
            return x + 1, x - 1

    graphed = graphed_module(Pair(), torch.randn(2))
    minus = graphed(torch.randn(2))[1]
    graphed(torch.randn(2))
    assert [(k, m.split(",")[0]) for k, m in marks] == [
        (key(minus), "cugraphrt: this tensor is output[1] of call #1 of graph_module(Pair)")]


def test_check_off_and_copy_outputs_hand_out_what_they_did_before(marks):
    off = graphed_module(Twice(), torch.randn(3), check_outputs=False)
    assert off(torch.randn(3)) is off.static_outputs
    copying = graphed_module(Twice(), torch.randn(3), copy_outputs=True)
    kept = copying(torch.randn(3))
    copying(torch.randn(3))
    assert kept.data_ptr() != copying.static_outputs.data_ptr() and marks == []


def test_the_environment_turns_the_check_off(marks, monkeypatch):
    monkeypatch.setenv("CUGRAPHRT_CHECK_OUTPUTS", "0")
    graphed = graphed_module(Twice(), torch.randn(3), check_outputs=None)
    assert graphed(torch.randn(3)) is graphed.static_outputs


def test_graphs_sharing_a_pool_mark_what_a_replay_may_overwrite(marks):
    order = OverwriteOrder()
    first = graphed_module(Twice(), torch.randn(3), order=order, seq=order.next_seq())
    second = graphed_module(Twice(), torch.randn(3), order=order, seq=order.next_seq())
    a = first(torch.randn(3))
    b = second(a)  # captured later: cannot overwrite the first graph's outputs
    assert marks == []
    first(torch.randn(3))  # captured earlier: may overwrite both
    assert sorted(k for k, _ in marks) == sorted([key(a), key(b)])


def test_the_tensor_marker_marks_returned_tensors_only(monkeypatch):
    seen = []
    monkeypatch.setattr(_output_check, "_mark_storage", None)
    monkeypatch.setattr(_output_check, "_mark_tensor", lambda t, msg: seen.append(t))
    graphed = graphed_module(Twice(), torch.randn(4, 2))
    kept = graphed(torch.randn(4, 2))
    row = graphed(torch.randn(4, 2))[0]  # only a view of the output survives this call
    graphed(torch.randn(4, 2))
    # The view keeps its base tensor alive, and that is what gets marked: the view has a
    # tensor of its own, which this marker cannot reach (the storage marker can).
    assert len(seen) == 2 and seen[0] is kept and seen[1] is row._base


# -- make_graphed_callables ---------------------------------------------------------------

def checked_group(items):
    """fake_group's graphed callables with the check make_graphed_callables would add."""
    runtimes = fake_group(items)
    for rt in runtimes:
        order = rt._back.guard
        check = make_check(True, f"graphed callable {rt.name}", FIX_CLONE, order)
        check.names = [rt._outputs.paths[p] for p in rt._outputs.positions]
        rt._steps.check = check  # the forward's hand-out step
    return runtimes


def test_forward_outputs_of_a_graphed_callable_are_marked_and_gradients_stay_right(marks):
    graphed, control = linear_pair()
    (rt,) = checked_group([(graphed, (torch.randn(5, 8, dtype=F64),), {})])
    x1, x2 = torch.randn(5, 8, dtype=F64), torch.randn(5, 8, dtype=F64)
    y1 = rt(x1)
    assert y1.requires_grad and key(y1) != key(rt.static_outputs[0])
    y2 = rt(x2)
    assert [(k, "output of call #1 of graphed callable Linear" in m, FIX_CLONE in m)
            for k, m in marks] == [(key(y1), True, True)]
    y2.pow(2).sum().backward()
    control(x2).pow(2).sum().backward()
    for p, pc in zip(graphed.parameters(), control.parameters(), strict=True):
        assert torch.allclose(p.grad, pc.grad)


def test_accumulation_stays_exact_with_the_check_on(marks):
    graphed, control = linear_pair()
    (rt,) = checked_group([(graphed, (torch.randn(5, 8, dtype=F64),), {})])
    backward_twice(rt, control)
    for p, pc in zip(graphed.parameters(), control.parameters(), strict=True):
        assert torch.equal(p.grad, pc.grad)
    assert marks == []  # each output was freed by its backward before the next call


def test_a_chain_of_callables_marks_what_the_earlier_one_may_overwrite(marks):
    torch.manual_seed(0)
    first, second = torch.nn.Linear(4, 4).to(F64), torch.nn.Linear(4, 2).to(F64)
    h = torch.randn(3, 4, dtype=F64, requires_grad=True)
    rt1, rt2 = checked_group([(first, (torch.randn(3, 4, dtype=F64),), {}), (second, (h,), {})])
    hidden = rt1(torch.randn(3, 4, dtype=F64))
    out = rt2(hidden)  # captured after rt1: overwrites neither rt1's output nor its input
    assert marks == []
    rt1(torch.randn(3, 4, dtype=F64))  # the next step's first call may overwrite both
    assert sorted(k for k, _ in marks) == sorted([key(hidden), key(out)])


# -- torch.compile pieces -------------------------------------------------------------------

def fake_piece(fn, sample, check_outputs=True):
    """A AotGraph with one recording whose "replay" recomputes fn into its outputs; output 1
    views the copied input buffer, as AOTAutograd's input views do."""
    settings = AotGraphSettings(warmup=1, max_graphs=2, max_rerecords=0, copy_outputs=False,
                             strict=False, check_outputs=check_outputs)
    piece = AotGraph(lambda args: fn(*args), name="graph 0 inference", compiler="aot_eager",
                  names=["x"], static=[], mutated=frozenset(), dynamic=False, reason=None,
                  settings=settings)
    buffer = sample.clone()
    outputs = list(fn(buffer))

    def run():
        for out, new in zip(outputs[:1], fn(buffer)[:1], strict=True):
            out.copy_(new)

    order = OverwriteOrder()
    piece._order = order
    piece._check = make_check(check_outputs, f"torch.compile piece '{piece.name}'", FIX_COMPILE,
                              order)
    seq = order.next_seq()
    # What AotGraph._capture builds: output 0 lives in the pool, output 1 views the input.
    hand_out = HandOut(outputs, TORCH, copy=False, check=piece._check, seq=seq, which=[0],
                       as_list=True)
    path = CallPath(_CopyIn([buffer], [0]), order, seq, FakeReplay(run).on_torch_stream,
                    _HandOut([], hand_out))
    piece._recordings[()] = _Recording(None, path, [None], [0], outputs)
    return piece


def test_piece_outputs_in_the_pool_are_checked_and_input_views_pass_through(marks):
    piece = fake_piece(lambda x: (x.exp(), x[1:]), torch.randn(4))
    x1 = torch.randn(4)
    first, view = piece([x1])
    assert torch.allclose(first, x1.exp()) and view is piece._recordings[()].outputs[1]
    second, _ = piece([torch.randn(4)])
    assert [k for k, _ in marks] == [key(first)]
    assert "output 0 of call #1 of torch.compile piece 'graph 0 inference'" in marks[0][1]
    assert FIX_COMPILE in marks[0][1] and key(second) != key(first)


def test_piece_check_off_returns_the_recordings_outputs(marks):
    piece = fake_piece(lambda x: (x.exp(), x[1:]), torch.randn(4), check_outputs=False)
    out = piece([torch.randn(4)])
    assert out[0] is piece._recordings[()].outputs[0]


# -- options --------------------------------------------------------------------------------

def test_bad_check_outputs_values_name_the_option():
    x = torch.randn(4, 3)
    with pytest.raises(OptionsError, match="'check_outputs'.*True, False and None"):
        cugraphrt_torch.graph_module(torch.nn.Linear(3, 2), x, check_outputs="yes")
    with pytest.raises(OptionsError, match="'check_outputs'"):
        cugraphrt_torch.make_graphed_callables(torch.nn.Linear(3, 2), (x,), check_outputs=1)
    with pytest.raises(OptionsError, match="'check_outputs'"):
        dynamo.backend(torch.fx.symbolic_trace(torch.nn.ReLU()), [torch.randn(2)],
                       options={"check_outputs": "on"})
    assert dynamo.CompileOptions().check_outputs is None


def test_output_check_holds_no_strong_reference_to_an_output(marks):
    import gc
    import weakref

    graphed = graphed_module(Twice(), torch.randn(64))
    ref = weakref.ref(graphed(torch.randn(64)))
    gc.collect()
    assert ref() is None
    assert isinstance(graphed._path.hand_out._check, OutputCheck)
