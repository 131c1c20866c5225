"""The failure paths of collectives in graphs turn into errors, not hangs (torchrun script).

Parts (argv, one per launch):

* ``mismatch`` (2 ranks): rank 1 captures one all-reduce fewer than rank 0. The first replay
  raises the same CaptureError on both ranks, naming collective #1 and what each rank holds;
  nothing was launched, so the process group still works afterwards.
* ``watchdog``: with a collective timeout of 3 s, a replay that cannot finish raises
  CollectiveTimeoutError in the replaying thread, naming the rank, the graph and its
  collectives. On 2 ranks, rank 1 never replays the graph rank 0 replays (the real hang);
  on 1 rank, the graph sleeps on the GPU (torch.cuda._sleep) longer than the timeout.
* ``loop_watchdog`` (2 ranks): a ``cugraphrt_torch.while_loop`` with an all-reduce in its
  body ends after 3 iterations on every rank but rank 0, where it never ends (its bound is
  far beyond the timeout): rank 0's replay raises CollectiveTimeoutError naming the
  collective in the loop's body, instead of waiting forever for a peer that stopped.
"""

from __future__ import annotations

import datetime
import os
import sys
import time

import cugraphrt_torch
import torch
import torch.distributed as dist
from _dist import ok, setup, teardown
from cugraphrt_torch.distributed import capture_stream, check_capture

import cugraphrt
from cugraphrt import CaptureError, CollectiveTimeoutError
from cugraphrt.distributed.collectives import set_collective_timeout
from cugraphrt.distributed.watchdog import pending_error

N = 4096
TIMEOUT_S = 3.0


def _warm(*tensors) -> None:
    stream = capture_stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for t in tensors:
            dist.all_reduce(t)
    torch.cuda.current_stream().wait_stream(stream)
    torch.cuda.synchronize()


def part_mismatch(rank: int, world: int, device) -> None:
    check_capture()
    x = torch.randn(N, device=device)
    _warm(x.clone())
    g = cugraphrt.Graph()
    with cugraphrt_torch.graph(g):
        y = x * 2
        dist.all_reduce(y)
        if rank == 0:  # the bug under test: rank 1 captures one all-reduce fewer
            dist.all_reduce(y)
    group = dist.group.WORLD.group_name
    start = time.monotonic()
    try:
        g.replay(torch.cuda.current_stream())
    except CaptureError as exc:
        message = str(exc)
    else:
        raise AssertionError("a graph whose collectives differ between the ranks replayed")
    expected = (f"got at collective #1: rank 0: all_reduce float32[{N}] sum on group "
                f"'{group}'; rank 1: nothing (it captured 1 collective)")
    assert expected in message, message
    assert time.monotonic() - start < 60
    try:
        g.replay(torch.cuda.current_stream())  # and again: the graph never runs
    except CaptureError as exc:
        assert str(exc) == message
    else:
        raise AssertionError("the second replay of a mismatched graph did not raise")
    ok("mismatch")
    z = torch.randn(N, device=device)  # nothing was launched: NCCL is still in step
    expected_sum = z.clone()
    dist.all_reduce(expected_sum)
    torch.cuda.synchronize()
    ok("mismatch-then-eager")


def _watchdog_error(replay) -> tuple[str, float]:
    """Replay, wait for the watchdog's error in this thread; its message and the seconds it
    took."""
    start = time.monotonic()
    try:
        replay()
        torch.cuda.synchronize()
        while time.monotonic() - start < 120:  # the error arrives here at the latest
            time.sleep(0.05)
    except CollectiveTimeoutError as exc:
        message = str(exc)
    except RuntimeError:  # the aborted communicator may surface first as its own error
        pending = pending_error()
        if pending is None:
            raise
        message = str(pending)
        try:
            time.sleep(2)  # let the watchdog's copy arrive here rather than later
        except CollectiveTimeoutError:
            pass
    else:
        raise AssertionError("the watchdog did not fire")
    return message, time.monotonic() - start


def part_watchdog(rank: int, world: int, device) -> None:
    check_capture()
    set_collective_timeout(TIMEOUT_S)
    x = torch.randn(N, device=device)
    _warm(x.clone())
    khz = getattr(torch.cuda.get_device_properties(device), "clock_rate", 2_000_000)
    cycles = int(khz * 1000 * 15)  # about 15 s of GPU time
    g = cugraphrt.Graph()
    with cugraphrt_torch.graph(g):
        if world == 1:
            torch.cuda._sleep(cycles)  # one rank cannot miss a peer: make the replay slow
        y = x * 2
        dist.all_reduce(y)
    current = torch.cuda.current_stream()
    if world > 1:
        g.replay(current)  # the checked first replay, on every rank
        torch.cuda.synchronize()
    store = dist.distributed_c10d._get_default_store()
    if rank == 0:
        # on 2 ranks, rank 1 never replays this one
        message, elapsed = _watchdog_error(lambda: g.replay(current))
        assert f"graph #0 (1 collective: all_reduce float32[{N}] sum on group" in message, message
        assert f"did not finish within {TIMEOUT_S:g} s of its replay" in message, message
        assert message.startswith(f"rank 0 of ranks {list(range(world))}"), message
        assert TIMEOUT_S <= elapsed < 60, elapsed
        store.set("cugraphrt-test/watchdog", b"fired")
    else:
        store.wait(["cugraphrt-test/watchdog"], datetime.timedelta(seconds=120))
    ok("watchdog")


def part_loop_watchdog(rank: int, world: int, device) -> None:
    check_capture()
    set_collective_timeout(TIMEOUT_S)
    y = torch.randn(N, device=device)
    _warm(y.clone())
    count = torch.zeros((), dtype=torch.int64, device=device)
    # The bug under test: rank 0's loop never ends (its peer stops after 3 iterations). When
    # the watchdog fires, the aborted all-reduce returns and the loop, whose body holds a
    # collective, stops at its next condition.
    bound = torch.tensor(2**62 if rank == 0 else 3, device=device)

    def body():
        dist.all_reduce(y)
        y.mul_(0.5)
        count.add_(1)

    g = cugraphrt.Graph()
    with cugraphrt_torch.graph(g):
        count.zero_()
        cugraphrt_torch.while_loop(lambda: count < bound, body)
    store = dist.distributed_c10d._get_default_store()
    current = torch.cuda.current_stream()
    if rank == 0:
        # checked across the ranks (they agree), then launched
        message, elapsed = _watchdog_error(lambda: g.replay(current))
        assert f"all_reduce float32[{N}] sum on group" in message, message
        assert "in a while_loop body" in message, message
        assert int(count) < 1000, int(count)  # the loop was stopped, not run out
        assert f"did not finish within {TIMEOUT_S:g} s of its replay" in message, message
        assert TIMEOUT_S <= elapsed < 60, elapsed
        store.set("cugraphrt-test/loop-watchdog", b"fired")
    else:
        g.replay(current)
        torch.cuda.synchronize()
        assert int(count) == 3
        store.wait(["cugraphrt-test/loop-watchdog"], datetime.timedelta(seconds=120))
    ok("loop_watchdog")


if __name__ == "__main__":
    rank, world, device = setup()
    part = sys.argv[1]
    {"mismatch": part_mismatch, "watchdog": part_watchdog,
     "loop_watchdog": part_loop_watchdog}[part](rank, world, device)
    if part in ("watchdog", "loop_watchdog"):
        # The communicator was aborted (on rank 0): leave without touching it again.
        sys.stdout.flush()
        os._exit(0)
    teardown()
