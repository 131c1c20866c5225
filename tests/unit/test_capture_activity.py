"""The process-wide capture gate (cugraphrt._memory.backing.capture_activity), without a GPU.

Captures are the readers, calls that invalidate every capture (cublasCreate) the writers:
a writer waits until no capture is underway and holds new captures back meanwhile.
"""

from __future__ import annotations

import threading
import time

import pytest

from cugraphrt import CaptureError
from cugraphrt._memory.backing import _CaptureActivity


def test_exclusive_waits_for_captures_and_holds_new_ones_back():
    gate = _CaptureActivity()
    events = []
    capturing = threading.Event()
    release = threading.Event()

    def capture():
        gate.enter()
        events.append("capture begins")
        capturing.set()
        release.wait(5)
        events.append("capture ends")
        gate.exit()

    def writer():
        capturing.wait(5)
        with gate.exclusive("test"):
            events.append("exclusive runs")
            time.sleep(0.05)
            events.append("exclusive ends")

    def late_capture():
        while not gate._exclusive_waiting and not gate._exclusive_running:
            time.sleep(0.001)
        gate.enter()
        events.append("late capture begins")
        gate.exit()

    threads = [threading.Thread(target=f) for f in (capture, writer, late_capture)]
    for t in threads:
        t.start()
    time.sleep(0.1)
    assert events == ["capture begins"]  # the writer waits, the late capture too
    release.set()
    for t in threads:
        t.join(5)
    assert events == ["capture begins", "capture ends", "exclusive runs", "exclusive ends",
                      "late capture begins"]
    assert gate.active == 0


def test_exclusive_refuses_a_thread_with_its_own_capture():
    gate = _CaptureActivity()
    gate.enter()
    try:
        with pytest.raises(CaptureError, match=r"would invalidate the capture underway in "
                                               r"this thread \(got 1 capture"):
            with gate.exclusive("creating a handle"):
                pass
    finally:
        gate.exit()
    with gate.exclusive("now allowed"):
        pass


def test_nested_capture_in_one_thread_never_waits_for_a_writer():
    gate = _CaptureActivity()
    gate.enter()
    gate._exclusive_waiting = 1  # a writer queued behind this thread's capture
    done = threading.Event()

    def second():
        gate.enter()  # same thread, second capture: must not deadlock
        done.set()

    second()
    assert done.is_set() and gate.active == 2 and gate.active_in_this_thread() == 2
    gate._exclusive_waiting = 0
    gate.exit()
    gate.exit()
    assert gate.active == 0 and gate.active_in_this_thread() == 0


def test_deferred_clean_up_runs_after_the_last_capture_of_any_thread():
    gate = _CaptureActivity()
    ran = []
    gate.enter()
    other = threading.Thread(target=gate.enter)
    other.start()
    other.join()
    gate.defer_or_run(lambda: ran.append(1))
    gate.exit()
    assert ran == [] and gate.active == 1
    finisher = threading.Thread(target=gate.exit)
    finisher.start()
    finisher.join()
    assert ran == [1] and gate.active == 0
    gate.defer_or_run(lambda: ran.append(2))  # nothing underway: runs at once
    assert ran == [1, 2]


def test_many_threads_of_captures_and_writers_keep_the_counts_right():
    gate = _CaptureActivity()
    overlap = []
    inside = [0]
    lock = threading.Lock()

    def captures():
        for _ in range(200):
            gate.enter()
            with lock:
                inside[0] += 1
            with lock:
                inside[0] -= 1
            gate.exit()

    def writers():
        for _ in range(50):
            with gate.exclusive("w"):
                with lock:
                    overlap.append(inside[0])

    threads = [threading.Thread(target=captures) for _ in range(6)]
    threads += [threading.Thread(target=writers) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert not any(t.is_alive() for t in threads), "deadlock"
    assert len(overlap) == 100 and set(overlap) == {0}, "a writer ran during a capture"
    assert gate.active == 0
