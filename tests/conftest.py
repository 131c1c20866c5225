"""Test-suite wiring: GPU tests skip without a GPU, and fail instead under
CUGRAPHRT_REQUIRE_GPU=1 (the GPU machine's setting)."""

from __future__ import annotations

import os

import pytest

REQUIRE_GPU = os.environ.get("CUGRAPHRT_REQUIRE_GPU", "") == "1"


def pytest_addoption(parser):
    parser.addoption("--stress", action="store_true", default=False,
                     help="run the long reliability runs (tests marked 'stress'); also "
                          "enabled by CUGRAPHRT_STRESS=1")
    parser.addoption("--long", action="store_true", default=False,
                     help="run the long GPU tests (marked 'long': torchrun launches, Inductor "
                          "compiles, the slowest examples, a real-model bench run); also "
                          "enabled by CUGRAPHRT_LONG=1")


def pytest_report_header(config):
    # Which copy of the packages runs: the source tree, or an installed wheel (.ci/run's
    # wheel job checks this line). find_spec does not import cugraphrt_torch (and torch).
    from importlib.util import find_spec

    where = []
    for name in ("cugraphrt", "cugraphrt_torch"):
        spec = find_spec(name)
        where.append(f"{name} from {spec.origin if spec else 'nowhere (not importable)'}")
    return "; ".join(where)


def stress_enabled(config) -> bool:
    """Whether the long runs of tests/stress are on (--stress or CUGRAPHRT_STRESS=1)."""
    return bool(config.getoption("--stress")) or os.environ.get("CUGRAPHRT_STRESS") == "1"


def long_enabled(config) -> bool:
    """Whether the tests marked 'long' run (--long or CUGRAPHRT_LONG=1)."""
    return bool(config.getoption("--long")) or os.environ.get("CUGRAPHRT_LONG") == "1"


def _gpu_reason() -> str | None:
    """None when a CUDA GPU is usable, else why not."""
    try:
        import cupy
    except Exception as exc:  # noqa: BLE001
        return f"CuPy does not import ({exc})"
    try:
        if cupy.cuda.is_available():
            return None
        return "cupy.cuda.is_available() is False"
    except Exception as exc:  # noqa: BLE001
        return f"no CUDA device ({exc})"


NO_GPU_REASON = _gpu_reason()


def pytest_collection_modifyitems(config, items):
    if not stress_enabled(config):
        _skip_marked(items, "stress", "long reliability run: pass --stress or set "
                                      "CUGRAPHRT_STRESS=1")
    if not long_enabled(config):
        # Kept out of the default GPU run to hold it near four minutes; what they cover has
        # a shorter test that runs by default.
        _skip_marked(items, "long", "long GPU test: pass --long or set CUGRAPHRT_LONG=1")
    if NO_GPU_REASON is None:
        return
    if REQUIRE_GPU:
        return  # pytest_runtest_setup fails them instead
    for item in items:
        if item.get_closest_marker("gpu") is not None:
            item.add_marker(pytest.mark.skip(reason=f"needs a CUDA GPU: {NO_GPU_REASON}"))


def torch_gpu_marks(torch) -> list:
    """The ``pytestmark`` of a torch GPU test module, whose tests need a CUDA build of torch.

    With one: ``gpu``. Without one, the module is skipped, except under
    ``CUGRAPHRT_REQUIRE_GPU=1`` (the GPU machine's setting): there a CPU build of torch
    would silently skip every test of the module, so they are collected and each fails,
    saying why (``needs_torch_cuda``, read by :func:`pytest_runtest_setup`).
    """
    if torch.cuda.is_available():
        return [pytest.mark.gpu]
    reason = (f"needs a CUDA build of torch (got torch {torch.__version__}, whose "
              f"torch.cuda.is_available() is False)")
    if not REQUIRE_GPU:
        pytest.skip(reason, allow_module_level=True)
    return [pytest.mark.gpu, pytest.mark.needs_torch_cuda(reason)]


def pytest_runtest_setup(item):
    # A hook, not a fixture added to the marks: fixtures are resolved when the test is
    # collected, so one named by a mark added afterwards never runs.
    torch_cuda = item.get_closest_marker("needs_torch_cuda")
    if torch_cuda is not None:  # only ever set under CUGRAPHRT_REQUIRE_GPU=1
        pytest.fail(f"CUGRAPHRT_REQUIRE_GPU=1 but this test {torch_cuda.args[0]}",
                    pytrace=False)
    if REQUIRE_GPU and NO_GPU_REASON is not None and item.get_closest_marker("gpu") is not None:
        pytest.fail(f"CUGRAPHRT_REQUIRE_GPU=1 but no CUDA GPU is usable: {NO_GPU_REASON}",
                    pytrace=False)


#: Skip reasons that mean "a package the GPU machine has is missing here": on a GPU host
#: under CUGRAPHRT_REQUIRE_GPU=1 they fail instead. Without this, a test module behind
#: ``importorskip("transformers")`` or a launch without NCCL skipped there silently.
MISSING_ON_GPU_HOST = ("could not import 'transformers'", "No module named 'transformers'",
                       "could not import 'torchvision'", "cannot load NCCL",
                       "could not import 'cuda.bindings")


def fails_instead(reason: str) -> bool:
    """Whether a skip for ``reason`` must fail here: under CUGRAPHRT_REQUIRE_GPU=1, on a host
    whose GPU is usable, when ``reason`` names a missing package of :data:`MISSING_ON_GPU_HOST`."""
    return REQUIRE_GPU and NO_GPU_REASON is None and any(
        text in reason for text in MISSING_ON_GPU_HOST)


def _skip_reason(report) -> str:
    longrepr = report.longrepr
    if isinstance(longrepr, tuple) and len(longrepr) == 3:
        return str(longrepr[2])
    return str(longrepr)


def fail_required_skip(report) -> None:
    """Turn ``report`` (a skipped test or module) into a failure when :func:`fails_instead`."""
    if report.skipped and fails_instead(reason := _skip_reason(report)):
        report.outcome = "failed"
        report.longrepr = (f"CUGRAPHRT_REQUIRE_GPU=1 on a GPU host, but this skipped for a "
                           f"missing package ({reason}); install it there")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    fail_required_skip(outcome.get_result())


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector):
    outcome = yield
    fail_required_skip(outcome.get_result())


def _skip_marked(items, marker: str, reason: str) -> None:
    skip = pytest.mark.skip(reason=reason)
    for item in items:
        # The marker, not item.keywords: those hold directory names too (tests/stress).
        if item.get_closest_marker(marker) is not None:
            item.add_marker(skip)

