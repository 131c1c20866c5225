"""NCCL collectives inside graphs: capture them, check them across ranks, watch their replays.

:class:`Collectives` (in :mod:`.collectives`) wraps one rank's NCCL communicator for CuPy
arrays; :mod:`.log` records the collectives a capture holds, :mod:`.crossrank` checks that
every rank captured the same ones, :mod:`.replay` arms a graph holding some and
:mod:`.watchdog` bounds how long a replay may wait for its peers.

The names are loaded on first use (NCCL is optional): ``cugraphrt.distributed.Collectives``.
"""

from __future__ import annotations

import importlib
from typing import Any

__all__ = ["Collectives", "MIN_NCCL_VERSION", "nccl_version", "check_nccl_version",
           "blocking_wait_variable", "collective_timeout", "set_collective_timeout",
           "release_graphs"]


def __getattr__(name: str) -> Any:
    # The graph layer imports .log and .replay: importing the package must not pull
    # .collectives (and the whole capture layer) in with them.
    if name in __all__:
        return getattr(importlib.import_module(".collectives", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
