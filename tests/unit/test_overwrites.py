"""The overwritten-output bookkeeping without a GPU: capture order, hand-outs, expiry, messages.

The framework side is faked (:class:`ViewOps`: NumPy views stand in for torch's fresh
storages, and "marking" is recorded), except for CuPy's checked views, whose arrays are built
over fake device pointers: nothing here launches a kernel.
"""

from __future__ import annotations

import gc
import weakref

import numpy as np
import pytest

from cugraphrt import OptionsError, OverwrittenOutputError, ReplayError
from cugraphrt._callables.checked_views import FIX, CupyViews
from cugraphrt._memory.overwrites import (
    ENV,
    OutputCheck,
    OverwriteOrder,
    order_for,
    resolve_check_outputs,
)

from .test_buckets import make


class ViewOps:
    """Aliases are NumPy views; expiring one records (alias, message, arguments)."""

    array_type = np.ndarray

    def __init__(self) -> None:
        self.marked: list[tuple] = []

    @staticmethod
    def hand_out(static):
        alias = static.view()
        return alias, weakref.ref(alias)

    def expire(self, held, message, arguments):
        self.marked.append((held, message, tuple(arguments)))

    @staticmethod
    def message(what, fix):
        return f"{what}: {fix}"


def checked(label="f", order=None):
    ops = ViewOps()
    return OutputCheck(label, "clone it", order or OverwriteOrder(), ops), ops


class Holder:
    def __init__(self) -> None:
        self.settled: list[tuple] = []

    def settle(self, a, b):
        self.settled.append((a, b))


# -- which replay settles what -------------------------------------------------------------

def test_a_replay_settles_what_graphs_captured_at_or_after_it_handed_out():
    order = OverwriteOrder()
    assert [order.next_seq() for _ in range(3)] == [0, 1, 2]
    holders = [Holder() for _ in range(3)]
    for seq, holder in enumerate(holders):
        order.record(seq, holder, f"a{seq}", f"b{seq}")
    assert order.max_seq == 2
    order.settle(1)  # graph 1 may overwrite graphs 1 and 2, never graph 0
    assert [h.settled for h in holders] == [[], [("a1", "b1")], [("a2", "b2")]]
    assert [entry[0] for entry in order.pending] == [0] and order.max_seq == 0
    order.settle(0)
    assert holders[0].settled == [("a0", "b0")]
    assert order.pending == [] and order.max_seq == -1


def test_settle_filters_in_place_and_raises_the_first_error_after_all_are_settled():
    order = OverwriteOrder()
    pending = order.pending

    class Failing:
        def settle(self, a, b):
            raise OverwrittenOutputError(f"refused {a}")

    later = Holder()
    order.record(0, Holder(), 0, 0)
    order.record(1, Failing(), "first", 0)
    order.record(2, Failing(), "second", 0)
    order.record(3, later, 3, 0)
    with pytest.raises(OverwrittenOutputError, match="refused first"):
        order.settle(1)
    assert later.settled == [(3, 0)]  # an error does not leave later entries pending
    assert order.pending is pending and len(pending) == 1 and order.max_seq == 0


def test_one_order_per_pool():
    class Pool:
        pass

    first, second = Pool(), Pool()
    assert order_for(first) is order_for(first)
    assert order_for(first) is not order_for(second)
    ref = weakref.ref(order_for(second))
    del second
    gc.collect()
    assert ref() is None  # the order goes with its pool


# -- what a call hands out and what a replay expires ---------------------------------------

def test_each_call_hands_out_fresh_aliases_and_the_next_replay_expires_the_live_ones():
    check, ops = checked("graph_module(Net)")
    static = np.arange(6.0)
    first = check.hand_out_one(0, static)  # call 1, kept
    assert first is not static and np.shares_memory(first, static)
    assert ops.marked == []  # nothing is expired by a hand-out
    check.before_replay(0)  # call 2's replay: call 1's output is alive
    dropped = check.hand_out_one(0, static)
    assert dropped is not first
    del dropped
    check.before_replay(0)  # call 3's replay: call 2's output is gone, nothing to do
    second = check.hand_out_one(0, static)
    check.before_replay(0)
    assert [m[0] for m in ops.marked] == [first, second]
    assert [m[1] for m in ops.marked] == [
        "output 0 of call #1 of graph_module(Net): clone it",
        "output 0 of call #3 of graph_module(Net): clone it"]
    assert check.calls == 3


def test_the_order_of_a_call_settles_before_its_replay():
    check, ops = checked()
    static = np.zeros(3)
    kept = [check.hand_out_one(0, static)]
    check.before_replay(0)
    assert len(ops.marked) == 1 and ops.marked[0][0] is kept[0]
    assert "call #1" in ops.marked[0][1]
    check.before_replay(0)  # nothing pending any more: already marked once
    assert len(ops.marked) == 1


def test_nested_outputs_alias_arrays_only_and_name_their_index():
    check, ops = checked("make_graphed(step)")
    a, b = np.ones(2), np.zeros((2, 2))
    out = check.hand_out_tree(0, {"logits": a, "extra": [None, b, 3]})
    assert out["extra"][0] is None and out["extra"][2] == 3
    assert out["logits"] is not a and np.shares_memory(out["logits"], a)
    assert out["extra"][1] is not b and np.shares_memory(out["extra"][1], b)
    keep = out["extra"][1]
    del out
    check.before_replay(0, arguments=("arg",))
    # Named by its place in what the callable returned.
    assert [(m[0] is keep, m[1], m[2]) for m in ops.marked] == [
        (True, "output['extra'][1] of call #1 of make_graphed(step): clone it", ("arg",))]


def test_hand_out_passes_through_what_is_not_in_which():
    check, _ = checked()
    static = [np.ones(2), np.zeros(2)]
    out = check.hand_out(0, static, which=(1,))
    assert out[0] is static[0] and out[1] is not static[1]


def test_a_shared_pool_marks_later_captures_only():
    order = OverwriteOrder()
    early, early_ops = checked("early", order)
    late, late_ops = checked("late", order)
    early_seq, late_seq = order.next_seq(), order.next_seq()
    kept_early = early.hand_out_one(early_seq, np.zeros(1))
    kept_late = late.hand_out_one(late_seq, np.zeros(1))
    late.before_replay(late_seq)  # the later capture never got the earlier one's memory
    assert early_ops.marked == [] and [m[0] is kept_late for m in late_ops.marked] == [True]
    kept_late = late.hand_out_one(late_seq, np.zeros(1))
    early.before_replay(early_seq)  # the earlier one may have used it as scratch
    assert [m[0] is kept_early for m in early_ops.marked] == [True]
    assert [m[0] is kept_late for m in late_ops.marked[1:]] == [True]


def test_bucketed_calls_hand_out_checked_views_and_expire_them_before_the_next_replay():
    ops = ViewOps()
    bucketed, _, (_, w) = make(check=lambda pool: OutputCheck("rowwise", "fix", order_for(pool),
                                                              ops))
    rng = np.random.default_rng(2)
    x1 = rng.standard_normal((3, 4))
    y1, s1 = bucketed(x1, w)
    expected = (y1.copy(), s1.copy())
    bucketed(rng.standard_normal((5, 4)), w)  # another bucket: same seq 0 here, so settled
    assert [m[0] is y1 for m in ops.marked[:1]] == [True] and len(ops.marked) == 2
    assert ops.marked[0][1] == "output[0] of call #1 of rowwise: fix"
    assert ops.marked[0][2][0] is not None  # the call's arguments are handed over
    x3 = rng.standard_normal((3, 4))
    y3, _ = bucketed(x3, w)
    assert np.allclose(y3, np.tanh(x3 @ w)) and not np.allclose(y3, expected[0])


# -- the option ----------------------------------------------------------------------------

@pytest.mark.parametrize("raw, expected", [(None, True), ("", True), ("0", False),
                                           ("off", False), ("1", True), ("yes", True)])
def test_the_environment_sets_the_default(monkeypatch, raw, expected):
    if raw is None:
        monkeypatch.delenv(ENV, raising=False)
    else:
        monkeypatch.setenv(ENV, raw)
    assert resolve_check_outputs(None) is expected
    assert resolve_check_outputs(False) is False and resolve_check_outputs(True) is True
    if raw is None:
        assert resolve_check_outputs(None, default=False) is False


def test_a_bad_environment_value_names_the_variable(monkeypatch):
    monkeypatch.setenv(ENV, "sometimes")
    with pytest.raises(OptionsError, match=r"CUGRAPHRT_CHECK_OUTPUTS.*'sometimes'.*1 or 0"):
        resolve_check_outputs(None)


# -- CuPy's checked views (arrays over fake pointers: no kernel runs) ----------------------

def fake_array(shape=(4, 3), ptr=1 << 20):
    import cupy
    from cupy.cuda import memory

    nbytes = int(np.prod(shape)) * 4
    owner = memory.UnownedMemory(ptr, nbytes, None, 0)
    return cupy.ndarray(shape, cupy.float32, memory.MemoryPointer(owner, 0))


def test_cupy_views_alias_the_static_memory_with_a_memory_object_per_call():
    ops = CupyViews()
    static = fake_array()
    (first, handle), (second, _) = ops.hand_out(static), ops.hand_out(static.T)
    assert first.data.ptr == static.data.ptr and first.strides == static.strides
    assert second.strides == static.T.strides and second.shape == (3, 4)
    assert first.data.mem is not static.data.mem and first.data.mem is not second.data.mem
    assert handle() is first.data.mem
    view = first[1:, ::2]
    del first
    assert handle() is not None  # a view holds the call's memory object
    del view
    assert handle() is None


def test_cupy_expiry_raises_for_a_live_output_unless_it_is_an_argument():
    ops = CupyViews()
    check = OutputCheck("make_graphed(step)", FIX, OverwriteOrder(), ops)
    static = fake_array()
    out = check.hand_out_one(0, static)
    check.before_replay(0, arguments=(out[1:],))  # x = f(x): copied in before the replay
    out = check.hand_out_one(0, static)
    with pytest.raises(OverwrittenOutputError,
                       match=r"^output 0 of call #2 of make_graphed\(step\) is still referenced"
                             r".*del.*\.copy\(\).*copy_outputs=True") as info:
        check.before_replay(0, arguments=(static,))
    assert isinstance(info.value, ReplayError)
    del out
    check.hand_out_one(0, static)
    check.before_replay(0)  # dropped: nothing to say


def test_a_checked_graphed_function_refuses_a_replay_over_a_referenced_output():
    from cugraphrt._callables.graphed import GraphedFunction

    class FakeGraph:
        _device = 0

        def __init__(self) -> None:
            self.replays = 0

        def replay(self) -> None:
            self.replays += 1

    static_in, static_out = fake_array(ptr=1 << 20), fake_array(ptr=1 << 21)
    graph, order = FakeGraph(), OverwriteOrder()
    check = OutputCheck("make_graphed(step)", FIX, order, CupyViews())
    fn = GraphedFunction(graph, lambda a: a, (static_in,), {"y": static_out}, False,
                         order=order, seq=order.next_seq(), check=check)
    out = fn(static_in)  # the static input itself: nothing to copy in
    assert out["y"] is not static_out and out["y"].data.ptr == static_out.data.ptr
    with pytest.raises(OverwrittenOutputError, match=r"output\['y'\] of call #1"):
        fn(static_in)
    assert graph.replays == 1  # refused before the replay
    del out
    fn(static_in)
    assert graph.replays == 2 and check.calls == 2
