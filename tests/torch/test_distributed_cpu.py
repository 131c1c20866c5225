"""cugraphrt_torch.distributed without a GPU: the capture checks on a faked process group,
and the capture error a collective gets."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from cugraphrt_torch.capture import _errors  # noqa: E402
from cugraphrt_torch.distributed import groups as distributed  # noqa: E402

from cugraphrt import CaptureError, OptionsError  # noqa: E402


@pytest.fixture
def nccl_group(monkeypatch):
    """torch.distributed initialized with an NCCL group bound to no device, device 0."""
    dist = torch.distributed
    monkeypatch.setattr(dist, "is_available", lambda: True)
    monkeypatch.setattr(dist, "is_initialized", lambda: True)
    state = {"backend": "nccl", "bound": None, "version": 22707}
    monkeypatch.setattr(dist, "get_backend", lambda group=None: state["backend"])
    monkeypatch.setattr(distributed, "_bound_device", lambda group: state["bound"])
    monkeypatch.setattr(distributed, "nccl_version", lambda: state["version"])
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    for name in ("TORCH_NCCL_BLOCKING_WAIT", "NCCL_BLOCKING_WAIT"):
        monkeypatch.delenv(name, raising=False)
    return state


def test_uninitialized_distributed_is_refused(monkeypatch):
    monkeypatch.setattr(torch.distributed, "is_initialized", lambda: False)
    with pytest.raises(OptionsError, match="init_process_group"):
        distributed.check_capture()


def test_a_ready_nccl_group_passes(nccl_group):
    distributed.check_capture()
    nccl_group["backend"] = "cpu:gloo,cuda:nccl"
    nccl_group["bound"] = 0
    distributed.check_capture()


def test_a_gloo_group_is_refused(nccl_group):
    nccl_group["backend"] = "gloo"
    with pytest.raises(OptionsError, match=r"'backend' \(got 'gloo'\).*NCCL backend"):
        distributed.check_capture()


@pytest.mark.parametrize("name", ["TORCH_NCCL_BLOCKING_WAIT", "NCCL_BLOCKING_WAIT"])
def test_blocking_wait_is_a_capture_error(nccl_group, monkeypatch, name):
    monkeypatch.setenv(name, "1")
    with pytest.raises(CaptureError, match=rf"{name} is set.*block the host.*unset it"):
        distributed.check_capture()


def test_old_nccl_is_a_capture_error(nccl_group):
    nccl_group["version"] = 20804
    with pytest.raises(CaptureError, match="NCCL 20804 cannot capture"):
        distributed.check_capture()


def test_a_group_of_another_device_is_refused(nccl_group):
    nccl_group["bound"] = 1
    with pytest.raises(OptionsError, match=r"process group's device 1.*torch.cuda.device\(1\)"):
        distributed.check_capture()


def test_a_failed_collective_names_the_nccl_requirements():
    namespace: dict = {}
    # The collective's own frames live in torch (as the real one's do): the caller's line
    # is the one the error names.
    exec(compile("def all_reduce(tensor):\n    raise RuntimeError('CUDA error: operation not "
                 "permitted when stream is capturing')\n", torch.__file__, "exec"), namespace)

    class dist:
        all_reduce = staticmethod(namespace["all_reduce"])

    try:
        dist.all_reduce(None)
    except RuntimeError as exc:
        error = _errors.capture_error(exc)
    assert isinstance(error, CaptureError)
    assert "`dist.all_reduce(None)`" in str(error)
    assert "TORCH_NCCL_BLOCKING_WAIT" in str(error) and "check_capture()" in str(error)
