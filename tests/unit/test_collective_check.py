"""Collectives in graphs without a GPU: the records, the cross-rank comparison and its
message, the store exchange, the first-replay arming and the release of graphs, on fakes."""

from __future__ import annotations

import datetime
import threading
import types

import pytest

from cugraphrt import CaptureError
from cugraphrt.distributed import collectives as distributed
from cugraphrt.distributed import crossrank
from cugraphrt.distributed import log as collective_log
from cugraphrt.distributed import replay as collective_replay
from cugraphrt.distributed.log import Collective, CollectiveLog

AR = Collective("all_reduce", "float32", 4096, "0", "sum")
AG = Collective("all_gather", "float32", 4096, "0")
BC = Collective("broadcast", "bfloat16", 64, "tp", "root 0")


class DictStore:
    """The part of torch.distributed.Store the exchange uses, shared by threads."""

    def __init__(self) -> None:
        self.data: dict[str, bytes] = {}
        self.cond = threading.Condition()

    def set(self, key, value):
        with self.cond:
            self.data[key] = bytes(value)
            self.cond.notify_all()

    def get(self, key):
        with self.cond:
            return self.data[key]

    def check(self, keys):
        with self.cond:
            return all(k in self.data for k in keys)

    def wait(self, keys, timeout: datetime.timedelta):
        with self.cond:
            if not self.cond.wait_for(lambda: all(k in self.data for k in keys),
                                      timeout.total_seconds()):
                raise RuntimeError("Wait timeout")


class StoreExchanger:
    """An exchanger of one rank over a DictStore (what TorchExchanger does over torch's)."""

    def __init__(self, store, rank, ranks=(0, 1)):
        self.store, self.rank, self.ranks = store, rank, tuple(ranks)
        self.count = 0
        self.aborted = 0

    def next_index(self):
        self.count += 1
        return self.count - 1

    def exchange(self, tag, payload, timeout_s):
        return crossrank.exchange_over_store(self.store, f"test/{tag}", self.rank, self.ranks,
                                             payload, timeout_s)

    def default_timeout_s(self):
        return 5.0

    def abort(self):
        self.aborted += 1

    def describe(self):
        return f"rank {self.rank} of {len(self.ranks)}"


def _log(exchanger, *entries):
    log = CollectiveLog(exchanger)
    for entry in entries:
        log.add(entry)
    log.seal()
    return log


def _verify_all(logs, timeout=5.0):
    """Run verify for every rank's log at once (threads); the error each one raised."""
    errors: dict[int, BaseException | None] = {}

    def run(rank, log):
        try:
            crossrank.verify(log, timeout)
            errors[rank] = None
        except BaseException as exc:  # noqa: BLE001 - collected for the assertions
            errors[rank] = exc

    threads = [threading.Thread(target=run, args=item) for item in enumerate(logs)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    return errors


def test_records_describe_and_round_trip():
    assert AR.describe() == "all_reduce float32[4096] sum on group '0'"
    assert Collective("all_to_all", "-", -1, "0").describe() == "all_to_all - on group '0'"
    assert collective_log.decode(collective_log.encode([AR, AG, BC])) == [AR, AG, BC]
    log = _log(StoreExchanger(DictStore(), 0), AR, AG, BC, AR, AG)
    assert log.index == 0 and log.groups == {"0", "tp"}
    assert log.describe().startswith("graph #0 (5 collectives: all_reduce float32[4096] sum")
    assert log.describe().endswith("and 1 more)")


def test_first_difference():
    assert crossrank.first_difference({0: [AR, AG], 1: [AR, AG]}) is None
    assert crossrank.first_difference({0: [], 1: []}) is None
    assert crossrank.first_difference({0: [AR, AG], 1: [AR]}) == (1, {0: AG, 1: None})
    other = Collective("all_reduce", "float16", 4096, "0", "sum")
    assert crossrank.first_difference({0: [AR, AG], 1: [other, AG], 2: [AR, AG]}) == (
        0, {0: AR, 1: other, 2: AR})


def test_one_all_reduce_fewer_fails_on_every_rank_naming_it():
    store = DictStore()
    logs = [_log(StoreExchanger(store, 0), AR, AR, AG), _log(StoreExchanger(store, 1), AR, AG)]
    errors = _verify_all(logs)
    messages = {str(errors[r]) for r in (0, 1)}
    assert all(isinstance(errors[r], CaptureError) for r in (0, 1))
    assert len(messages) == 1  # the same message on both ranks
    (message,) = messages
    assert message.startswith("the ranks captured different collectives into graph #0")
    assert ("got at collective #1: rank 0: all_reduce float32[4096] sum on group '0'; "
            "rank 1: all_gather float32[4096] on group '0'") in message
    assert "make the code under capture take the same path on every rank" in message
    # The verdict sticks: the graph never replays.
    with pytest.raises(CaptureError, match="different collectives"):
        crossrank.verify(logs[0])


def test_a_shorter_capture_names_what_is_missing():
    store = DictStore()
    logs = [_log(StoreExchanger(store, 0), AR, AR), _log(StoreExchanger(store, 1), AR)]
    errors = _verify_all(logs)
    assert "rank 1: nothing (it captured 1 collective)" in str(errors[0])
    assert str(errors[0]) == str(errors[1])


def test_equal_captures_pass_once():
    store = DictStore()
    logs = [_log(StoreExchanger(store, r), AR, AG, BC) for r in (0, 1)]
    assert _verify_all(logs) == {0: None, 1: None}
    assert all(log.verdict is True for log in logs)
    store.data.clear()
    crossrank.verify(logs[0], 0.01)  # checked: no second exchange


def test_a_rank_that_never_arrives_is_named_within_the_timeout():
    store = DictStore()
    log = _log(StoreExchanger(store, 0, ranks=(0, 1, 2)), AR)
    store.set("test/graph0/2", collective_log.encode([AR]))
    with pytest.raises(CaptureError, match=r"rank\(s\) 1 did not publish what they captured "
                                           r"\(test/graph0\) within 0.2 s"):
        crossrank.verify(log, 0.2)


def test_first_replay_checks_once_then_installs_the_steady_replay(monkeypatch):
    monkeypatch.setattr(collective_replay, "collective_timeout", lambda: None)
    store = DictStore()
    launches, installed = [], []
    log = _log(StoreExchanger(store, 0, ranks=(0,)), AR)
    replay = collective_replay.first_replay(log, launches.append, installed.append,
                                            lambda s: 0, device=0)
    replay("stream")
    assert launches == ["stream"] and installed == [launches.append]
    assert log.verdict is True
    log.verdict = CaptureError("not checked again")  # a caller that kept the first function
    replay("again")
    assert launches == ["stream", "again"] and len(installed) == 1


def test_the_steady_replay_watches_with_a_timeout(monkeypatch):
    watched = []
    monkeypatch.setattr(collective_replay, "collective_timeout", lambda: 7.0)
    monkeypatch.setattr(collective_replay, "watch", lambda *a: watched.append(a))
    monkeypatch.setattr(collective_replay, "pending_error", lambda: None)
    log = _log(StoreExchanger(DictStore(), 0, ranks=(0,)), AR)
    launches = []
    steady = collective_replay.steady_replay(log, launches.append, lambda s: 0xAB, 3)
    steady("s")
    assert launches == ["s"] and watched == [(0xAB, 3, log, 7.0)]
    error = CaptureError("fired")
    monkeypatch.setattr(collective_replay, "pending_error", lambda: error)
    with pytest.raises(CaptureError, match="fired"):
        steady("s")
    assert launches == ["s"]  # a fired watchdog: nothing launches any more


class FakeGraph:
    def __init__(self):
        self.is_captured = True
        self.resets = 0

    def reset(self):
        self.resets += 1
        self.is_captured = False


def test_release_graphs_by_group_and_by_exchanger():
    ex_a, ex_b = StoreExchanger(DictStore(), 0), StoreExchanger(DictStore(), 0)
    g_world, g_tp, g_other = FakeGraph(), FakeGraph(), FakeGraph()
    hooks = []
    log = _log(ex_a, AR)
    log.release_hooks.append(lambda: hooks.append("torch graph reset"))
    collective_log.track(g_world, log)
    collective_log.track(g_tp, _log(ex_a, BC))
    collective_log.track(g_other, _log(ex_b, AR))
    assert collective_log.release_graphs(groups=["tp"]) == 1
    assert (g_world.resets, g_tp.resets, g_other.resets) == (0, 1, 0)
    assert collective_log.release_graphs(exchanger=ex_b) == 1 and g_other.resets == 1
    assert collective_log.release_graphs() >= 1 and g_world.resets == 1
    assert hooks == ["torch graph reset"]
    assert collective_log.release_graphs() == 0  # nothing left


class FakeComm:
    def __init__(self, rank=0, size=2):
        self._rank, self._size, self.destroyed, self.aborted = rank, size, 0, 0

    def device_id(self):
        return 0

    def rank_id(self):
        return self._rank

    def size(self):
        return self._size

    def destroy(self):
        self.destroyed += 1

    def abort(self):
        self.aborted += 1


def test_cupy_collectives_record_what_they_capture(monkeypatch):
    nccl = types.SimpleNamespace(get_version=lambda: 22707, NCCL_SUM=0, NCCL_FLOAT32=7)
    monkeypatch.setattr(distributed, "_nccl", lambda: nccl)
    monkeypatch.setattr(distributed._cuda, "current_device", lambda: 0)
    monkeypatch.setattr(distributed._capture, "is_current_stream_capturing", lambda: True)
    capture = types.SimpleNamespace(collectives=None)
    monkeypatch.setattr(distributed._capture, "current_capture", lambda: capture)
    monkeypatch.setattr(distributed.cupy.cuda, "get_current_stream",
                        lambda: types.SimpleNamespace(ptr=1))
    store = DictStore()
    coll = distributed.Collectives(FakeComm(), require_warmup=False, store=store, label="dp")
    coll._run(("all_reduce", "f", 8, "sum"), (), lambda nccl, s: None)
    coll._run(("broadcast", "e", 4, 1), (), lambda nccl, s: None)
    log = capture.collectives
    assert log.entries == [Collective("all_reduce", "float32", 8, "dp", "sum"),
                           Collective("broadcast", "float16", 4, "dp", "root 1")]
    assert log.exchanger.describe() == "rank 0 of 2 (NCCL communicator 'dp' on device 0)"
    log.seal()
    store.set("cugraphrt/dp/graph0/1", collective_log.encode(log.entries[:1]))
    with pytest.raises(CaptureError, match=r"#1: rank 0: broadcast float16\[4\] root 1 on "
                                           r"group 'dp'; rank 1: nothing"):
        crossrank.verify(log, 1.0)
    graph = FakeGraph()
    collective_log.track(graph, log)
    coll.close()
    assert graph.resets == 1 and coll.comm.destroyed == 1


class _Comm:
    """A one-rank communicator that records when it is destroyed (its destructor)."""

    def __init__(self, destroyed: list) -> None:
        self.destroyed = destroyed

    def device_id(self):
        return 0

    def rank_id(self):
        return 0

    def size(self):
        return 1

    def __del__(self):
        self.destroyed.append(True)


def test_a_dropped_collectives_destroys_its_communicator_only_when_no_capture_is_underway():
    """A Collectives and its exchanger reference each other, so the garbage collector frees a
    dropped one: inside another capture, the communicator's destructor (ncclCommDestroy)
    would invalidate that capture. It waits for the capture to end."""
    import gc

    from cugraphrt._memory.backing import capture_activity

    destroyed: list = []
    coll = distributed.Collectives(_Comm(destroyed))
    capture_activity.enter()  # a capture underway in this thread
    try:
        del coll
        gc.collect()
        assert destroyed == []  # freed with the cycle, but its communicator kept
    finally:
        capture_activity.exit()  # the last capture ends: the deferred release runs
    assert destroyed == [True]
    # Outside a capture it goes with the collection.
    coll = distributed.Collectives(_Comm(destroyed))
    del coll
    gc.collect()
    assert destroyed == [True, True]
