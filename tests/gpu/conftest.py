"""Shared fixtures of the GPU tests."""

from __future__ import annotations

import numpy as np
import pytest


@pytest.fixture
def rng():
    """A NumPy generator with a fresh seed per test (the seed is printed for reruns)."""
    seed = int(np.random.SeedSequence().entropy % (2**32))
    print(f"numpy seed: {seed}")  # shown with the output of a failing test
    return np.random.default_rng(seed)


@pytest.fixture
def randn(rng):
    """Fresh normal random CuPy arrays: randn(shape, dtype=float32)."""
    import cupy

    def make(shape, dtype=np.float32):
        data = rng.standard_normal(shape)
        if np.dtype(dtype).kind == "c":
            data = data + 1j * rng.standard_normal(shape)
        return cupy.asarray(data.astype(dtype))

    return make


@pytest.fixture
def one_rank():
    """A new one-rank CuPy NCCL communicator maker; skips where CuPy cannot load NCCL."""
    try:
        from cupy.cuda import nccl
    except Exception as exc:  # noqa: BLE001
        pytest.skip(f"CuPy's NCCL bindings do not import ({exc})")
    if not nccl.available:
        pytest.skip("CuPy cannot load NCCL (pip install nvidia-nccl-cu13)")
    return lambda: nccl.NcclCommunicator(1, nccl.get_unique_id(), 0)


@pytest.fixture
def solo(one_rank):
    """``cugraphrt.distributed.Collectives`` of a one-rank CuPy NCCL communicator (an
    all-reduce is a copy); skips where CuPy cannot load NCCL."""
    from cugraphrt.distributed.collectives import Collectives

    return Collectives(one_rank(), label="solo")


@pytest.fixture(autouse=True)
def _clean_state():
    """Each test starts and ends with no capture underway and pool checks off."""
    import cupy

    import cugraphrt
    from cugraphrt._capture import stream_capture as _capture

    cugraphrt.set_pool_checks(False)
    yield
    leaked = list(_capture._tls.captures)
    for capture in leaked:
        _capture.abort(capture)
    cugraphrt.set_pool_checks(False)
    cupy.cuda.runtime.deviceSynchronize()
    assert not leaked, "a test left a capture underway"
