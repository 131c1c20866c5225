"""cupy.linalg's solvers are refused inside a capture by their public name (no GPU needed)."""

from __future__ import annotations

import cupy.linalg
import pytest

from cugraphrt import CaptureError
from cugraphrt._capture import stream_capture as _capture
from cugraphrt._libraries import capture_setup as _libs


@pytest.fixture
def guarded(monkeypatch):
    _libs._guard_linalg()
    capture = {"on": False}
    monkeypatch.setattr(_capture, "current_capture",
                        lambda: object() if capture["on"] else None)
    return capture


@pytest.mark.parametrize("name", ["svd", "eig", "eigvals", "qr", "lstsq", "inv", "pinv",
                                  "solve", "cholesky", "eigh", "eigvalsh", "matrix_rank",
                                  "tensorinv", "tensorsolve", "cond", "det", "slogdet"])
def test_each_solver_is_refused_by_name_during_capture(guarded, name):
    fn = getattr(cupy.linalg, name)
    guarded["on"] = True
    library = "cuBLAS" if name in ("det", "slogdet") else "cuSOLVER"
    with pytest.raises(CaptureError, match=rf"{library} call cupy\.linalg\.{name} cannot be "
                                           rf"captured.*outside the captured region"):
        fn(None)
    guarded["on"] = False
    original = fn.__cugraphrt_original__
    assert fn.__wrapped__ is original and fn.__name__ == original.__name__


def test_guards_are_installed_once_and_call_through_outside_captures(guarded):
    svd = cupy.linalg.svd
    _libs._guard_linalg()
    assert cupy.linalg.svd is svd  # idempotent: no guard around the guard
    calls = []
    guard = _libs._refusing(lambda *a: calls.append(a) or "ran", "cupy.linalg.svd",
                            "cuSOLVER", "advice")
    assert guard(1, 2) == "ran" and calls == [(1, 2)]  # no capture: the original runs
    guarded["on"] = True
    with pytest.raises(CaptureError):
        guard(3)
    assert calls == [(1, 2)]


def test_matrix_power_and_norm_are_left_alone(guarded):
    # They reach cuSOLVER only for some arguments (negative powers, nuclear norms): the
    # solver they call is refused instead.
    assert not hasattr(cupy.linalg.matrix_power, "__cugraphrt_original__")
    assert not hasattr(cupy.linalg.norm, "__cugraphrt_original__")
