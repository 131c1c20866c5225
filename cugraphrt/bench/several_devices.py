"""The replay path of a process that sees several GPUs, run in a process that sees one.

``Graph.replay()`` takes one of two paths on the graph's own device (docs/performance.md,
"What remains on the replay path"): with one device visible it asks CUDA nothing; with
several it asks which device is current (``cudaGetDevice``) before it launches, and switches
when another one is. :func:`cugraphrt._capture.graphs._note_devices` picks the path once, from the
device count, through two module flags. The ``replay`` workload's row ``graph launch,
several devices`` sets the same flags around its batches, so that a one-GPU host times the
Python a several-GPU host runs (issue 24 asks for both). On the graph's device, that path
launches what the one-device path launches; what it cannot show is a driver that answers
``cudaGetDevice`` more slowly when it holds several contexts. Where the process does see
several devices, the flags are already set and the row times the real thing; the versions
line (``gpus``) says which it was.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from cugraphrt._flags import FLAGS

__all__ = ["several_devices_path"]


@contextmanager
def several_devices_path() -> Iterator[None]:
    """Replays inside take the several-device path; the flag comes back on exit.

    """
    saved = FLAGS.multi_device
    FLAGS.set(multi_device=True)
    try:
        yield
    finally:
        FLAGS.set(multi_device=saved)
