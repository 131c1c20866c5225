"""The NCCL capture checks without a GPU or NCCL: environment, version, device and warm-up,
on a fake communicator."""

from __future__ import annotations

import types

import pytest

from cugraphrt import CaptureError, OptionsError
from cugraphrt._capture import stream_capture as _capture
from cugraphrt._cuda import runtime as _cuda
from cugraphrt.distributed import collectives as distributed


class FakeComm:
    def __init__(self, device=1, rank=0, size=2):
        self._device, self._rank, self._size = device, rank, size

    def device_id(self):
        return self._device

    def rank_id(self):
        return self._rank

    def size(self):
        return self._size


@pytest.fixture
def fake_nccl(monkeypatch):
    module = types.SimpleNamespace(get_version=lambda: 22707, NCCL_SUM=0, NCCL_FLOAT32=7)
    monkeypatch.setattr(distributed, "_nccl", lambda: module)
    monkeypatch.setattr(_cuda, "current_device", lambda: 1)
    state = {"capturing": False}
    monkeypatch.setattr(_capture, "is_current_stream_capturing", lambda: state["capturing"])
    monkeypatch.setattr(distributed.cupy.cuda, "get_current_stream",
                        lambda: types.SimpleNamespace(ptr=0xCA))
    return module, state


@pytest.mark.parametrize("name", ["TORCH_NCCL_BLOCKING_WAIT", "NCCL_BLOCKING_WAIT"])
@pytest.mark.parametrize("value", ["1", "true", "ON"])
def test_blocking_wait_variables_are_found(name, value):
    assert distributed.blocking_wait_variable({name: value}) == name


@pytest.mark.parametrize("env", [{}, {"TORCH_NCCL_BLOCKING_WAIT": "0"},
                                 {"NCCL_BLOCKING_WAIT": ""},
                                 {"TORCH_NCCL_ASYNC_ERROR_HANDLING": "1"}])
def test_other_settings_are_not_blocking_waits(env):
    assert distributed.blocking_wait_variable(env) is None


def test_old_nccl_cannot_capture():
    distributed.check_nccl_version(distributed.MIN_NCCL_VERSION)
    with pytest.raises(CaptureError, match=r"NCCL 20905 cannot capture.*install a newer NCCL"):
        distributed.check_nccl_version(20905)


def test_a_captured_collective_needs_an_eager_warm_up(fake_nccl):
    _, state = fake_nccl
    coll = distributed.Collectives(FakeComm())
    calls = []
    key = ("all_reduce", "f", 1024, "sum")
    state["capturing"] = True
    with pytest.raises(CaptureError, match=r"all_reduce of 1024 float32 values \(sum\) was "
                                           r"captured before it ran eagerly"):
        coll._run(key, (), lambda nccl, s: calls.append(s))
    assert calls == []
    state["capturing"] = False
    coll._run(key, (), lambda nccl, s: calls.append(s))  # eager: the warm-up
    state["capturing"] = True
    coll._run(key, (), lambda nccl, s: calls.append(s))  # now capturable
    assert calls == [0xCA, 0xCA]
    other = ("all_reduce", "f", 2048, "sum")  # another size selects another algorithm
    with pytest.raises(CaptureError, match="2048"):
        coll._run(other, (), lambda nccl, s: calls.append(s))
    relaxed = distributed.Collectives(FakeComm(), require_warmup=False)
    relaxed._run(other, (), lambda nccl, s: calls.append(s))
    assert len(calls) == 3


def test_old_nccl_is_refused_at_capture(fake_nccl):
    module, state = fake_nccl
    module.get_version = lambda: 20800
    coll = distributed.Collectives(FakeComm(), require_warmup=False)
    coll._run(("broadcast", "f", 4, 0), (), lambda nccl, s: None)  # eager is fine
    state["capturing"] = True
    with pytest.raises(CaptureError, match="cannot capture"):
        coll._run(("broadcast", "f", 4, 0), (), lambda nccl, s: None)


def test_collective_on_another_device_is_refused(fake_nccl, monkeypatch):
    monkeypatch.setattr(_cuda, "current_device", lambda: 0)
    coll = distributed.Collectives(FakeComm(device=1))
    with pytest.raises(OptionsError, match=r"communicator's device 1.*cupy.cuda.Device\(1\)"):
        coll._run(("all_reduce", "f", 4, "sum"), (), lambda nccl, s: None)


def test_bad_options(fake_nccl):
    with pytest.raises(OptionsError, match="require_warmup"):
        distributed.Collectives(FakeComm(), require_warmup=1)
    module, _ = fake_nccl
    with pytest.raises(OptionsError, match="one of sum, prod"):
        distributed.Collectives._op(module, "mean")
