"""The hang watchdog without a GPU: events are fakes, the rest is the real watcher thread."""

from __future__ import annotations

import contextlib
import threading
import time

import pytest

from cugraphrt import CollectiveTimeoutError, OptionsError
from cugraphrt.distributed import watchdog as collective_watchdog
from cugraphrt.distributed.log import Collective, CollectiveLog


class FakeEvents:
    def __init__(self) -> None:
        self.created = 0
        self.done: set[int] = set()
        self.recorded: list[tuple[int, int]] = []

    def create(self):
        self.created += 1
        return 100 + self.created

    def record(self, event, stream):
        self.recorded.append((event, stream))
        self.done.discard(event)


class Exchanger:
    rank, ranks = 1, (0, 1)

    def __init__(self) -> None:
        self.aborted = threading.Event()

    def abort(self):
        self.aborted.set()

    def describe(self):
        return "rank 1 of ranks [0, 1] (group '0')"


@pytest.fixture
def events(monkeypatch):
    fake = FakeEvents()
    monkeypatch.setattr(collective_watchdog, "_on_device", lambda device: contextlib.nullcontext())
    cuda = collective_watchdog._cuda
    monkeypatch.setattr(cuda, "event_create", fake.create)
    monkeypatch.setattr(cuda, "event_record", fake.record)
    monkeypatch.setattr(cuda, "event_done", lambda e: e in fake.done)
    monkeypatch.setattr(cuda, "driver", lambda: type("D", (), {
        "exchange_mode": staticmethod(lambda mode: 0)})())
    collective_watchdog.reset()
    yield fake
    collective_watchdog.reset()


def _log(exchanger):
    log = CollectiveLog(exchanger)
    log.add(Collective("all_reduce", "float32", 4096, "0", "sum"))
    log.index = 3
    return log


def test_the_timeout_setting(monkeypatch):
    monkeypatch.setattr(collective_watchdog, "_timeout", collective_watchdog._UNSET)
    monkeypatch.delenv(collective_watchdog.ENV, raising=False)
    assert collective_watchdog.collective_timeout() is None
    monkeypatch.setattr(collective_watchdog, "_timeout", collective_watchdog._UNSET)
    monkeypatch.setenv(collective_watchdog.ENV, "2.5")
    assert collective_watchdog.collective_timeout() == 2.5
    collective_watchdog.set_collective_timeout(None)
    assert collective_watchdog.collective_timeout() is None
    collective_watchdog.set_collective_timeout(30)
    assert collective_watchdog.collective_timeout() == 30.0
    for bad in (-1, "soon", float("nan")):
        with pytest.raises(OptionsError, match=r"'seconds' \(got .*\): a number of seconds"):
            collective_watchdog.set_collective_timeout(bad)
    monkeypatch.setattr(collective_watchdog, "_timeout", collective_watchdog._UNSET)
    monkeypatch.setenv(collective_watchdog.ENV, "x")
    with pytest.raises(OptionsError, match="CUGRAPHRT_COLLECTIVE_TIMEOUT"):
        collective_watchdog.collective_timeout()
    collective_watchdog.set_collective_timeout(None)


def test_finished_replays_recycle_their_events(events):
    log = _log(Exchanger())
    for _ in range(3):
        collective_watchdog.watch(0xAA, 0, log, 5.0)
        events.done.update(e for e, _ in events.recorded)
        time.sleep(0.05)
    assert events.created == 1  # one event, recycled
    assert collective_watchdog.pending_error() is None


def test_a_stuck_replay_raises_in_the_replaying_thread_and_aborts(events, capsys):
    exchanger = Exchanger()
    log = _log(exchanger)
    caught: list[BaseException] = []
    started = threading.Event()

    def replaying_thread():
        collective_watchdog.watch(0xBEEF, 1, log, 0.2)
        started.set()
        try:
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline:  # "blocked": the GPU never finishes
                time.sleep(0.01)
        except CollectiveTimeoutError as exc:
            caught.append(exc)

    thread = threading.Thread(target=replaying_thread)
    thread.start()
    thread.join(15)
    assert started.is_set() and caught, "the watchdog did not raise in the replaying thread"
    message = str(caught[0])
    assert message.startswith("rank 1 of ranks [0, 1] (group '0'): graph #3 (1 collective: "
                              "all_reduce float32[4096] sum on group '0') did not finish "
                              "within 0.2 s of its replay")
    assert "stream 0xbeef of device 1" in message
    assert "another rank did not replay the same graph" in message
    assert exchanger.aborted.wait(5)
    assert str(collective_watchdog.pending_error()) == message
    assert "cugraphrt collective watchdog:" in capsys.readouterr().err
