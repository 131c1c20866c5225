"""Check, before a graph's first replay, that every rank captured the same collectives.

A captured collective is a promise that every other rank will run the same collective, in
the same order, on the same group, when it replays its graph. If one rank captured one
all-reduce fewer, or another size, the replays pair up wrongly and every rank waits forever
inside NCCL with nothing to show for it. So before the first replay of a graph that holds
collectives, the ranks exchange what they captured (:class:`cugraphrt.distributed.log.
CollectiveLog`, a few hundred bytes) over a channel that cannot deadlock on the NCCL streams
(torch: the process group's store; CuPy: an eager all-gather, or a store), and every rank
raises the same :class:`~cugraphrt.CaptureError` naming the first collective that differs,
before any of them launches the graph.

The check costs one exchange per graph, once; later replays skip it.
"""

from __future__ import annotations

import datetime
from collections.abc import Mapping, Sequence
from typing import Any

from cugraphrt.distributed.log import Collective, CollectiveLog, decode, encode
from cugraphrt.errors import CaptureError

__all__ = ["first_difference", "mismatch_error", "exchange_over_store", "verify",
           "missing_ranks_error"]


def first_difference(captured: Mapping[int, Sequence[Collective]]
                     ) -> tuple[int, dict[int, Collective | None]] | None:
    """The first position where the ranks' collectives differ, or None if they all agree.

    Parameters
    ----------
    captured : mapping of rank to list of Collective
        What each rank captured, in order.

    Returns
    -------
    (int, dict) or None
        The position and what each rank holds there (None past the end of its list).
    """
    ranks = sorted(captured)
    longest = max((len(captured[r]) for r in ranks), default=0)
    for i in range(longest):
        at = {r: (captured[r][i] if i < len(captured[r]) else None) for r in ranks}
        if len(set(at.values())) > 1:
            return i, at
    return None


def mismatch_error(log: CollectiveLog, position: int, at: Mapping[int, Collective | None],
                   counts: Mapping[int, int]) -> CaptureError:
    """The error every rank raises when the ranks' captures differ at ``position``."""
    def held(rank: int) -> str:
        collective = at[rank]
        if collective is None:
            n = counts[rank]
            return f"rank {rank}: nothing (it captured {n} collective{'s' if n != 1 else ''})"
        return f"rank {rank}: {collective.describe()}"

    return CaptureError(
        f"the ranks captured different collectives into graph #{log.index}, so its replay "
        f"would hang every rank (got at collective #{position}: "
        f"{'; '.join(held(r) for r in sorted(at))}); every rank must capture the same "
        f"collectives in the same order (same kind, dtype, count and group): make the code "
        f"under capture take the same path on every rank. The graph was not replayed")


def missing_ranks_error(missing: Sequence[int], what: str, timeout_s: float) -> CaptureError:
    """The error of a rank that waited for others that never arrived."""
    names = ", ".join(str(r) for r in missing)
    return CaptureError(
        f"rank(s) {names} did not publish {what} within {timeout_s:g} s (got no answer from "
        f"them); they captured no collectives there, replay their graphs in another order, "
        f"or are stuck: see their stacks")


def exchange_over_store(store: Any, prefix: str, rank: int, ranks: Sequence[int],
                        payload: bytes, timeout_s: float) -> dict[int, bytes]:
    """Publish ``payload`` and read every rank's, through a key-value store.

    ``store`` is a ``torch.distributed.Store`` or anything with its ``set``, ``get``,
    ``check`` and ``wait(keys, timedelta)``. The store lives on the host, outside NCCL, so a
    rank that never arrives makes this raise (naming it) instead of hanging.

    Raises
    ------
    CaptureError
        When some ranks have not published within ``timeout_s`` seconds.
    """
    keys = {r: f"{prefix}/{r}" for r in ranks}
    store.set(keys[rank], payload)
    try:
        store.wait(list(keys.values()), datetime.timedelta(seconds=timeout_s))
    except Exception as exc:  # torch raises DistStoreError (a RuntimeError) on time-out
        missing = [r for r, key in keys.items() if not store.check([key])]
        if not missing:  # a store error, not a time-out
            raise
        raise missing_ranks_error(missing, f"what they captured ({prefix})",
                                  timeout_s) from exc
    return {r: bytes(store.get(key)) for r, key in keys.items()}


def verify(log: CollectiveLog, timeout_s: float | None = None) -> None:
    """Check ``log`` against the other ranks' logs of the same graph, once.

    Raises
    ------
    CaptureError
        On every rank, when the ranks' collectives differ (naming the first difference) or
        a rank does not take part within the timeout; raised again on every later call.
    """
    verdict = log.verdict
    if verdict is True:
        return
    if verdict is not None:
        raise verdict
    exchanger = log.exchanger
    timeout = timeout_s if timeout_s is not None else exchanger.default_timeout_s()
    try:
        payloads = exchanger.exchange(f"graph{log.index}", encode(log.entries), timeout)
        captured = {r: decode(p) for r, p in payloads.items()}
    except CaptureError as exc:
        log.verdict = exc
        raise
    found = first_difference(captured)
    if found is None:
        log.verdict = True
        return
    position, at = found
    error = mismatch_error(log, position, at, {r: len(c) for r, c in captured.items()})
    log.verdict = error
    raise error
