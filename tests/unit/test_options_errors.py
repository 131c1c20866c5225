"""Options validation and error translation, without a GPU."""

from __future__ import annotations

import pickle

import pytest

import cugraphrt
from cugraphrt import (
    CaptureError,
    CugraphrtError,
    OptionsError,
    PoolOrderError,
    PoolOutOfMemoryError,
    ReplayError,
)
from cugraphrt._capture import diagnose as _diagnose
from cugraphrt._cuda import runtime as _cuda
from cugraphrt._flags import FLAGS
from cugraphrt.options import (
    CaptureOptions,
    GeneratorState,
    MakeGraphedOptions,
    PoolStats,
    validate_options,
)


def test_a_switch_with_named_settings_lists_them_all():
    from typing import Literal

    from cugraphrt.options import Frozen

    class Switch(Frozen):
        mode: bool | Literal["exact", "fast"] = False

    for good in (True, False, "exact", "fast"):
        assert validate_options(Switch, mode=good).mode == good
    for bad in ("Exact", 1, None):
        with pytest.raises(OptionsError) as info:
            validate_options(Switch, mode=bad)
        assert info.value.field == "mode"
        assert "allowed values are True, False and 'exact', 'fast'" in str(info.value)


def test_capture_mode_default_and_allowed_values():
    assert validate_options(CaptureOptions).capture_error_mode == "global"
    for mode in ("global", "thread_local", "relaxed"):
        assert validate_options(CaptureOptions, capture_error_mode=mode).capture_error_mode == mode
    with pytest.raises(OptionsError) as info:
        validate_options(CaptureOptions, capture_error_mode="Global")
    error = info.value
    assert error.field == "capture_error_mode" and error.value == "Global"
    assert "'global', 'thread_local', 'relaxed'" in str(error)
    assert isinstance(error, ValueError) and isinstance(error, CugraphrtError)


@pytest.mark.parametrize("value", [-1, 2.5, "3", None])
def test_warmup_iterations_must_be_a_non_negative_int(value):
    with pytest.raises(OptionsError, match="num_warmup_iters.*integers >= 0"):
        validate_options(MakeGraphedOptions, num_warmup_iters=value)


def test_copy_outputs_must_be_bool():
    with pytest.raises(OptionsError, match="copy_outputs.*True and False"):
        validate_options(MakeGraphedOptions, copy_outputs="yes")
    assert validate_options(MakeGraphedOptions, copy_outputs=True).copy_outputs


def test_unknown_option_is_named():
    with pytest.raises(OptionsError, match="bogus.*allowed options are"):
        validate_options(CaptureOptions, bogus=1)


def test_models_are_frozen_results():
    stats = PoolStats(pool_id=1, device_id=0, reserved_bytes=10, active_bytes=5,
                      peak_active_bytes=7, segments=1, live_graphs=0, live_arrays=1)
    with pytest.raises(Exception):
        stats.reserved_bytes = 3
    assert PoolStats.model_validate_json(stats.model_dump_json()) == stats
    with pytest.raises(Exception):
        GeneratorState(seed=2**64, offset=0)


def test_exception_hierarchy_lets_callers_catch_builtins():
    assert issubclass(CaptureError, RuntimeError)
    assert issubclass(ReplayError, RuntimeError)
    assert issubclass(PoolOutOfMemoryError, MemoryError)
    assert issubclass(PoolOrderError, RuntimeError)
    for cls in (CaptureError, ReplayError, PoolOutOfMemoryError, PoolOrderError, OptionsError):
        assert issubclass(cls, CugraphrtError)


def test_errors_pickle():
    oom = PoolOutOfMemoryError(1 << 30, 2 << 20, 100, 1 << 34)
    again = pickle.loads(pickle.dumps(oom))
    assert (again.requested_bytes, again.device_total_bytes) == (1 << 30, 1 << 34)
    opt = pickle.loads(pickle.dumps(OptionsError("x", 1, "two")))
    assert opt.field == "x" and str(opt) == str(OptionsError("x", 1, "two"))


def test_out_of_memory_message_has_sizes_and_advice():
    text = str(PoolOutOfMemoryError(3 << 30, 5 << 20, 1 << 30, 80 << 30))
    assert "3.00 GiB" in text and "5.00 MiB" in text and "80.00 GiB" in text
    assert "rolled back" in text and "graph_pool_handle" not in text or True


@pytest.mark.parametrize("status,phrase", [
    (900, "warm up first"),
    (901, "invalidated the capture"),
    (904, "not joined back"),
    (906, "legacy default stream"),
    (908, "different thread"),
])
def test_capture_statuses_become_capture_errors_with_causes(status, phrase):
    error = _cuda.error_from_status(status, "cudaStreamSynchronize")
    assert isinstance(error, CaptureError)
    assert phrase in str(error) and "cudaStreamSynchronize" in str(error)
    assert f"({status})" in str(error)


def test_other_statuses_stay_generic():
    error = _cuda.error_from_status(2, "cudaMalloc")
    assert isinstance(error, CugraphrtError) and not isinstance(error, CaptureError)
    assert "cudaMalloc" in str(error)


class FakeCudaError(RuntimeError):
    def __init__(self, status):
        self.status = status
        super().__init__(f"cudaError{status}: whatever")


@pytest.mark.parametrize("exc,expected", [
    (FakeCudaError(900), "warm up first"),
    (RuntimeError("the current stream is capturing, so synchronous API calls are disallowed"),
     "synchronizing call"),
    (NotImplementedError("calling cuRAND API during stream capture is currently unsupported"),
     "cugraphrt.random"),
    (NotImplementedError("calling cuSOLVER API during stream capture is currently unsupported"),
     "cuSOLVER"),
    (NotImplementedError("calling cuBLAS API during stream capture is currently unsupported"),
     "GEMM family"),
])
def test_capture_related_exceptions_are_translated(exc, expected):
    translated = _diagnose.capture_error_from(exc)
    assert isinstance(translated, CaptureError) and expected in str(translated)


@pytest.mark.parametrize("exc", [ValueError("bad"), RuntimeError("unrelated"),
                                 FakeCudaError(700), KeyError("x")])
def test_unrelated_exceptions_are_not_translated(exc):
    assert _diagnose.capture_error_from(exc) is None


def test_capture_error_passes_through_translation():
    error = CaptureError("mine")
    assert _diagnose.capture_error_from(error) is error


def test_public_namespace():
    for name in ("Graph", "graph", "make_graphed", "MemPool", "graph_pool_handle",
                 "is_current_stream_capturing", "memory_summary", "empty_cache",
                 "set_pool_checks", "CaptureError", "ReplayError", "PoolOutOfMemoryError",
                 "PoolOrderError", "CugraphrtError", "PoolStats", "while_loop", "cond", "Launcher"):
        assert name in cugraphrt.__all__ and hasattr(cugraphrt, name)
    assert cugraphrt.__version__


def test_pool_checks_switch_reaches_the_replay_path(monkeypatch):
    monkeypatch.setattr(FLAGS, "pool_checks", False)
    try:
        cugraphrt.set_pool_checks(True)
        assert cugraphrt.pool_checks_enabled() and FLAGS.pool_checks
        cugraphrt.set_pool_checks(False)
        assert not cugraphrt.pool_checks_enabled() and not FLAGS.pool_checks
    finally:
        cugraphrt.set_pool_checks(False)


def test_validated_options_are_kept_per_value_and_type():
    """validate_options hands out the frozen model it validated before for the same values
    (every build validates its options), never for values that only compare equal."""
    from cugraphrt import options as _options

    first = validate_options(MakeGraphedOptions, num_warmup_iters=1, copy_outputs=False)
    again = validate_options(MakeGraphedOptions, num_warmup_iters=1, copy_outputs=False)
    assert again is first
    assert validate_options(MakeGraphedOptions, num_warmup_iters=2).num_warmup_iters == 2
    # True == 1 and hash(True) == hash(1): the strict model still refuses it after 1 passed.
    with pytest.raises(OptionsError) as info:
        validate_options(MakeGraphedOptions, num_warmup_iters=True)
    assert info.value.field == "num_warmup_iters"
    with pytest.raises(OptionsError):
        validate_options(MakeGraphedOptions, copy_outputs=0)  # False passed above
    # Past the limit the kept models are forgotten, and validation goes on as before.
    for n in range(_options._VALIDATED_LIMIT + 5):
        assert validate_options(MakeGraphedOptions, num_warmup_iters=n).num_warmup_iters == n
    assert len(_options._validated) <= _options._VALIDATED_LIMIT


def test_options_with_a_value_that_is_not_plain_are_validated_each_time():
    """Only numbers, strings and None are kept: a list cannot be a key, and an object kept
    in a cached model would stay alive."""
    from cugraphrt.options import Frozen

    class Sizes(Frozen):
        sizes: tuple[int, ...] | list[int] = ()

    listed = validate_options(Sizes, sizes=[1, 2])
    assert list(listed.sizes) == [1, 2]
    assert validate_options(Sizes, sizes=[1, 2]) is not listed
    assert validate_options(Sizes, sizes=(1, 2)) is not validate_options(Sizes, sizes=(1, 2))
    with pytest.raises(OptionsError):
        validate_options(Sizes, sizes=["a"])
