"""CUGRAPHRT_REQUIRE_GPU=1 on a GPU host: a skip for a missing package fails (GPU-free)."""

from __future__ import annotations

import pytest

from tests import conftest


def _report(reason: str, outcome: str = "skipped") -> pytest.TestReport:
    longrepr = ("tests/torch/test_generation_gpu.py", 14, f"Skipped: {reason}")
    return pytest.TestReport("t::x", ("t", 1, "x"), {}, outcome,
                             longrepr if outcome == "skipped" else None, "call")


@pytest.fixture
def gpu_host(monkeypatch):
    monkeypatch.setattr(conftest, "REQUIRE_GPU", True)
    monkeypatch.setattr(conftest, "NO_GPU_REASON", None)


@pytest.mark.parametrize("reason", ["could not import 'transformers': No module named "
                                    "'transformers'",
                                    "CuPy cannot load NCCL (pip install nvidia-nccl-cu13)"])
def test_a_missing_package_fails_on_a_gpu_host(gpu_host, reason):
    report = _report(reason)
    conftest.fail_required_skip(report)
    assert report.failed
    assert "CUGRAPHRT_REQUIRE_GPU=1" in str(report.longrepr) and reason in str(report.longrepr)


def test_other_skips_stay_skips(gpu_host):
    report = _report("needs 2 CUDA GPU(s) seen by torch (got 1)")
    conftest.fail_required_skip(report)
    assert report.skipped
    passed = _report("", "passed")
    conftest.fail_required_skip(passed)
    assert passed.passed


@pytest.mark.parametrize("require, no_gpu", [(False, None), (True, "no CUDA device")])
def test_without_the_setting_or_a_gpu_a_missing_package_skips(monkeypatch, require, no_gpu):
    monkeypatch.setattr(conftest, "REQUIRE_GPU", require)
    monkeypatch.setattr(conftest, "NO_GPU_REASON", no_gpu)
    report = _report("could not import 'transformers': No module named 'transformers'")
    conftest.fail_required_skip(report)
    assert report.skipped


class _Outcome:
    def __init__(self, report) -> None:
        self.report = report

    def get_result(self):
        return self.report


@pytest.mark.parametrize("hook", ["pytest_runtest_makereport", "pytest_make_collect_report"])
def test_the_hooks_turn_a_test_or_a_module_skip_into_a_failure(gpu_host, hook):
    report = _report("could not import 'transformers': No module named 'transformers'")
    args = (None, None) if hook == "pytest_runtest_makereport" else (None,)
    wrapper = getattr(conftest, hook)(*args)
    next(wrapper)
    with pytest.raises(StopIteration):
        wrapper.send(_Outcome(report))
    assert report.failed
