"""cuFFT plans created during a capture belong to its graph (issue 23.4): the bookkeeping,
against a fake plan class, a fake CuPy plan cache (its public interface: iteration over
(key, node) pairs, node.plan, del cache[key]) and a fake capture. The GPU half is in
tests/gpu/test_libs_gpu.py."""

from __future__ import annotations

import contextlib
import gc
import weakref

import pytest

from cugraphrt import CaptureError
from cugraphrt._capture import stream_capture as _capture
from cugraphrt._cuda import runtime as _cuda
from cugraphrt._libraries import capture_setup as _libs
from cugraphrt._libraries import fft_plans as _fft_plans
from cugraphrt._memory.backing import capture_activity


class FakePlan:
    def __init__(self, *args, devices=None):
        self.args = args
        self.devices = devices


class Node:
    def __init__(self, plan):
        self.plan = plan


class FakeCache:
    """CuPy's PlanCache interface as _fft_plans uses it."""

    def __init__(self):
        self.nodes: dict[tuple, Node] = {}

    def __setitem__(self, key, plan):
        self.nodes[key] = Node(plan)

    def __delitem__(self, key):
        del self.nodes[key]

    def __iter__(self):
        return iter(list(self.nodes.items()))


class FakeCapture:
    def __init__(self):
        self.finish_hooks = []
        self.keepalive = []
        self.aborted_by = None


@pytest.fixture
def setup(monkeypatch):
    cache = FakeCache()
    relaxed = []

    @contextlib.contextmanager
    def relaxed_mode():
        relaxed.append("enter")
        try:
            yield
        finally:
            relaxed.append("exit")

    monkeypatch.setattr(_fft_plans, "_current_cache", lambda: cache)
    monkeypatch.setattr(_cuda, "relaxed_capture_mode", relaxed_mode)
    return cache, relaxed


def _finish(capture, failed=False):
    if failed:
        capture.aborted_by = CaptureError("rolled back")
    for hook in capture.finish_hooks:
        hook(capture)


def test_plan_made_in_a_capture_leaves_the_cache_and_joins_the_graph(setup):
    cache, relaxed = setup
    capture = FakeCapture()
    eager = FakePlan("eager")
    cache[("eager",)] = eager
    plan = _fft_plans.create_in_capture(FakePlan, (100, 0x69, 1), {}, capture)
    assert plan.args == (100, 0x69, 1) and relaxed == ["enter", "exit"]
    cache[(100, 0x69, 1)] = plan  # what CuPy does right after creating it
    again = _fft_plans.create_in_capture(FakePlan, (64, 0x69, 2), {}, capture)
    cache[(64, 0x69, 2)] = again
    assert len(capture.finish_hooks) == 1  # one hook per capture, however many plans
    _finish(capture)
    assert [key for key, _ in cache] == [("eager",)]  # eager FFTs never find them
    assert plan in capture.keepalive and again in capture.keepalive  # the graph keeps them


def test_eager_plans_are_held_until_the_capture_ends(setup):
    cache, _ = setup
    capture = FakeCapture()
    eager = FakePlan("eager")
    cache[("eager",)] = eager
    watch = weakref.ref(eager)
    plan = _fft_plans.create_in_capture(FakePlan, (8,), {}, capture)
    cache[(8,)] = plan
    del cache.nodes[("eager",)], eager  # CuPy evicts the eager plan to make room
    gc.collect()
    assert watch() is not None  # not destroyed during the capture
    _finish(capture)
    gc.collect()
    assert watch() is None  # released once the capture ended


def test_plans_of_a_failed_capture_are_released_not_kept(setup):
    cache, _ = setup
    capture = FakeCapture()
    plan = _fft_plans.create_in_capture(FakePlan, (8,), {}, capture)
    cache[(8,)] = plan
    watch = weakref.ref(plan)
    del plan
    _finish(capture, failed=True)
    gc.collect()
    assert watch() is None and capture.keepalive == [] and list(cache) == []


def test_release_waits_for_other_captures_to_end(setup):
    cache, _ = setup
    capture = FakeCapture()
    plan = _fft_plans.create_in_capture(FakePlan, (8,), {}, capture)
    watch = weakref.ref(plan)
    del plan
    capture_activity.enter()  # another capture is still underway
    try:
        _finish(capture, failed=True)
        gc.collect()
        assert watch() is not None  # destroying a plan frees memory: not during a capture
    finally:
        capture_activity.exit()
    gc.collect()
    assert watch() is None


def test_multi_gpu_plans_are_refused_as_not_implemented(setup):
    with pytest.raises(NotImplementedError, match=r"multi-GPU cuFFT plan.*devices=\[0, 1\]"):
        _fft_plans.create_in_capture(FakePlan, (8,), {"devices": [0, 1]}, FakeCapture())


class CuFFTError(RuntimeError):  # CuPy's class, by name and by its ``result``
    def __init__(self, result):
        super().__init__(f"CUFFT status {result}")
        self.result = result


class FailingPlan:
    def __init__(self, *args, devices=None):
        raise CuFFTError(5)


def test_a_plan_cufft_cannot_make_in_a_capture_is_also_a_cufft_error(setup):
    _, relaxed = setup
    with pytest.raises(CaptureError) as caught:
        _fft_plans.create_in_capture(FailingPlan, (3001, 0x29, 1), {}, FakeCapture())
    error = caught.value
    assert isinstance(error, CuFFTError) and error.result == 5
    assert "shape 3001" in str(error) and "warm-up" in str(error)
    assert "_fft_plans.create_in_capture(FailingPlan" in str(error)  # the caller's line
    assert relaxed == ["enter", "exit"]  # the thread's capture mode restored


def test_forget_survives_a_cache_cleared_meanwhile():
    class Broken:
        def __iter__(self):
            raise RuntimeError("cache cleared")

    _fft_plans.forget(Broken(), [FakePlan()])  # no exception out of a finish hook


def test_plan_guard_routes_construction_during_capture(monkeypatch):
    made = []
    guard = _libs._PlanGuardMeta.wrapping(FakePlan)
    capture = FakeCapture()
    monkeypatch.setattr(_fft_plans, "create_in_capture",
                        lambda cls, args, kwargs, cap: made.append((cls, args, cap)) or "owned")
    monkeypatch.setattr(_capture, "current_capture", lambda: capture)
    assert guard(4, 5) == "owned" and made == [(FakePlan, (4, 5), capture)]
    monkeypatch.setattr(_capture, "current_capture", lambda: None)
    eager = guard(4, 5)
    assert isinstance(eager, FakePlan) and isinstance(eager, guard) and len(made) == 1
