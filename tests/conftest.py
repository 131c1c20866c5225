"""Test-suite wiring: GPU tests skip without a GPU, and fail instead under
CUGRAPHRT_REQUIRE_GPU=1 (the GPU machine's setting)."""

from __future__ import annotations

import os

import pytest

REQUIRE_GPU = os.environ.get("CUGRAPHRT_REQUIRE_GPU", "") == "1"


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
    if NO_GPU_REASON is None:
        return
    for item in items:
        if "gpu" not in item.keywords:
            continue
        if REQUIRE_GPU:
            item.add_marker(pytest.mark.usefixtures("_fail_without_gpu"))
        else:
            item.add_marker(pytest.mark.skip(reason=f"needs a CUDA GPU: {NO_GPU_REASON}"))


@pytest.fixture
def _fail_without_gpu():
    pytest.fail(f"CUGRAPHRT_REQUIRE_GPU=1 but no CUDA GPU is usable: {NO_GPU_REASON}",
                pytrace=False)
