"""The Philox kernels on a device, and the checks every graph-safe generator shares.

The kernels (:mod:`cugraphrt._libraries.philox`) are compiled once per device, on first use,
with NVRTC through CuPy. :mod:`cugraphrt.random`'s ``Generator`` and ``RowGenerator`` launch
them; both refuse to read or write their state during a capture, and check seeds alike.
"""

from __future__ import annotations

import os
import threading

import cupy
import numpy as np

from cugraphrt._capture import stream_capture as _capture
from cugraphrt._libraries import philox as _philox
from cugraphrt.errors import CaptureError, OptionsError

__all__ = ["THREADS", "MAX_BLOCKS", "kernel", "blocks_for", "check_seed", "random_seed",
           "refuse_in_capture"]

THREADS = 256
MAX_BLOCKS = 1024

_modules: dict[int, cupy.RawModule] = {}
_modules_lock = threading.Lock()


def kernel(name: str, device_id: int):
    """The kernel ``name`` on ``device_id`` (the whole module compiled and loaded on first
    use)."""
    module = _modules.get(device_id)
    if module is None:
        with _modules_lock:
            module = _modules.get(device_id)
            if module is None:
                module = cupy.RawModule(code=_philox.KERNEL_SOURCE,
                                        options=("--std=c++14",),
                                        name_expressions=None)
                for kernel_name in _philox.KERNEL_NAMES:
                    module.get_function(kernel_name)  # compile and load now
                _modules[device_id] = module
    return module.get_function(name)


def blocks_for(counters: int) -> int:
    """Thread blocks of :data:`THREADS` for ``counters`` Philox counters (grid-stride beyond
    :data:`MAX_BLOCKS`)."""
    return max(1, min(-(-counters // THREADS), MAX_BLOCKS))


def check_seed(seed) -> int:
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) \
            or not 0 <= int(seed) < 2**64:
        raise OptionsError("seed", seed, "allowed values are integers in [0, 2**64)")
    return int(seed)


def random_seed() -> int:
    return int.from_bytes(os.urandom(8), "little")


def refuse_in_capture(what: str) -> None:
    if _capture.current_capture() is not None or _capture.is_current_stream_capturing():
        raise CaptureError(
            f"{what} during capture (got a capture underway on the current stream); it "
            f"writes or reads the generator state eagerly: do it before or after capturing"
        )
