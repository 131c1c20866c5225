"""cugraphrt.while_loop / cond without a GPU: arguments, eager semantics, version checks."""

from __future__ import annotations

import sys

import numpy as np
import pytest

import cugraphrt
from cugraphrt import CaptureError, OptionsError
from cugraphrt._control import loops as control
from cugraphrt._cuda import conditional as _conditional


@pytest.mark.parametrize("bad", [-1, 2.5, "3", True, 2**63])
def test_max_iters_must_be_a_nonnegative_integer(bad):
    with pytest.raises(OptionsError, match="'max_iters'") as info:
        cugraphrt.while_loop(lambda: None, lambda: None, max_iters=bad)
    assert info.value.value is bad


def test_functions_must_be_callable():
    with pytest.raises(OptionsError, match="'cond_fn'"):
        cugraphrt.while_loop(True, lambda: None)
    with pytest.raises(OptionsError, match="'body_fn'"):
        cugraphrt.while_loop(lambda: None, None)
    with pytest.raises(OptionsError, match="'true_fn'"):
        cugraphrt.cond(np.True_, 1)
    with pytest.raises(OptionsError, match="'false_fn'"):
        cugraphrt.cond(np.True_, lambda: None, "no")


def test_limits():
    assert control.check_loop_args(len, len, None) == 2**63 - 1
    assert control.check_loop_args(len, len, np.int32(0)) == 0


@pytest.mark.parametrize("pred", [True, 1, np.array(True), np.int64(3), None])
def test_predicate_must_be_a_device_array(pred):
    with pytest.raises(CaptureError, match=r"pred must be a 0-d bool or integer device array "
                                           r"\(got (builtins|numpy)\.\w+"):
        cugraphrt.cond(pred, lambda: None)


@pytest.mark.parametrize("stop,limit,want", [(5, 100, 5), (5, 3, 3), (0, 10, 0), (4, 0, 0)])
def test_eager_loop_reads_the_condition_before_each_iteration(stop, limit, want):
    state = {"i": 0, "reads": 0}

    def read():
        state["reads"] += 1
        return state["i"] < stop

    def body():
        state["i"] += 1

    assert control.run_eagerly(read, body, limit) == want
    assert state["i"] == want
    # One read per iteration plus the one that ended the loop, unless max_iters ended it.
    assert state["reads"] == (want if want == limit else want + 1)


@pytest.mark.parametrize("found,name", [((12030, 13020), "driver version 12.3"),
                                        ((13000, 12020), "CUDA runtime of CuPy version 12.2")])
def test_old_cuda_is_refused_with_the_versions(monkeypatch, found, name):
    pytest.importorskip("cuda.bindings")
    monkeypatch.setattr(_conditional, "versions", lambda: found)
    with pytest.raises(CaptureError, match=rf"need CUDA 12\.4 or newer \(got {name};"):
        _conditional.require("cugraphrt.while_loop")


def test_recent_cuda_is_accepted_and_if_else_needs_12_8(monkeypatch):
    pytest.importorskip("cuda.bindings")
    monkeypatch.setattr(_conditional, "versions", lambda: (12040, 12060))
    _conditional.require("cugraphrt.cond")
    assert not _conditional.if_else_supported()
    monkeypatch.setattr(_conditional, "versions", lambda: (13000, 12080))
    assert _conditional.if_else_supported()


def test_missing_cuda_bindings_is_named(monkeypatch):
    monkeypatch.setitem(sys.modules, "cuda.bindings", None)  # makes the import fail
    with pytest.raises(CaptureError, match="needs NVIDIA's cuda-bindings package"):
        _conditional.require("cugraphrt.while_loop")


def test_the_capture_calls_exist_in_the_installed_bindings():
    pytest.importorskip("cuda.bindings")
    driver, get_info, add_node, update = _conditional._api()
    for fn, arguments in ((get_info, "hStream"), (add_node, "dependencyData"),
                          (update, "dependencyData")):
        assert callable(fn) and arguments in fn.__doc__.splitlines()[0], fn.__doc__[:200]
    assert driver.CUgraphConditionalNodeType.CU_GRAPH_COND_TYPE_WHILE is not None
