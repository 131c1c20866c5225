"""The process-wide switches that every replay path reads, held in one place.

Two facts decide how a replay launches: whether the replay-order checks are on
(:func:`cugraphrt.set_pool_checks`, ``CUGRAPHRT_POOL_CHECKS=1``) and whether this process
sees several devices (then another device may be current when a graph replays). ``plain``
is the one test the common case pays: neither of them. Every hot path, the core's and the
adapters' (through :data:`cugraphrt.adapter.FLAGS`), reads the attributes of :data:`FLAGS`;
nothing keeps a copy, so nothing can disagree.
"""

from __future__ import annotations

import os

__all__ = ["FLAGS", "ReplayFlags"]

#: The environment variable that turns the replay-order checks on at import.
POOL_CHECKS_ENV = "CUGRAPHRT_POOL_CHECKS"


class ReplayFlags:
    """The switches (see the module docstring); one instance, :data:`FLAGS`."""

    __slots__ = ("pool_checks", "multi_device", "plain")

    def __init__(self) -> None:
        self.pool_checks = os.environ.get(POOL_CHECKS_ENV, "").strip().lower() in (
            "1", "true", "yes", "on")
        self.multi_device = False
        self.plain = not self.pool_checks

    def set(self, *, pool_checks: bool | None = None, multi_device: bool | None = None) -> None:
        """Change a switch; ``plain`` follows."""
        if pool_checks is not None:
            self.pool_checks = bool(pool_checks)
        if multi_device is not None:
            self.multi_device = bool(multi_device)
        self.plain = not (self.pool_checks or self.multi_device)

    def __repr__(self) -> str:
        return (f"ReplayFlags(pool_checks={self.pool_checks}, "
                f"multi_device={self.multi_device})")


FLAGS = ReplayFlags()
