"""cugraphrt's cuBLAS capture handles outlive their threads and serve the next ones."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import threading

from cugraphrt._libraries import cublas as _cublas


def in_thread(fn):
    """``fn()`` in a new thread, after which that thread has ended.

    No gc.collect(): a thread's handles go back when CPython clears its thread-local storage,
    before ``join()`` returns, by reference counting alone. (A collection per thread cost
    about 0.5 s in a GPU suite's process, 26 s for the test of 50 threads.)
    """
    result = []
    thread = threading.Thread(target=lambda: result.append(fn()))
    thread.start()
    thread.join()
    return result[0]


def test_a_dead_threads_handle_serves_the_next_thread(monkeypatch):
    monkeypatch.setattr(_cublas, "_idle", {})
    created_before = _cublas.created_handles

    def take_fake_handle():
        _cublas._thread_handles()[7] = 0xABC  # as if created for device 7
        return 0xABC

    in_thread(take_fake_handle)
    assert _cublas._idle == {7: [0xABC]}, "the ended thread's handle was not given back"
    assert in_thread(lambda: _cublas.ensure_capture_handle(7)) == 0xABC
    assert _cublas.created_handles == created_before  # reused, not created
    assert _cublas._idle == {7: [0xABC]}  # and given back again by that thread


def test_many_short_threads_share_one_handle(monkeypatch):
    monkeypatch.setattr(_cublas, "_idle", {5: [0x1]})
    seen = {in_thread(lambda: _cublas.ensure_capture_handle(5)) for _ in range(50)}
    assert seen == {0x1}


def _fake_cublas(destroyed: list):
    import types

    module = types.SimpleNamespace(create=lambda: 0x1, destroy=destroyed.append)
    _cublas.install(module, already_loaded=False)
    return module


def test_a_handle_destroyed_in_another_thread_waits_for_the_captures_underway():
    # cublasDestroy synchronizes the device: CuPy calls it when a thread ends, and it must
    # not land in another thread's capture.
    from cugraphrt._memory.backing import capture_activity

    destroyed: list = []
    module = _fake_cublas(destroyed)
    capture_activity.enter()  # a capture underway in this thread
    try:
        worker = threading.Thread(target=module.destroy, args=(0xD1,))
        worker.start()
        worker.join(0.3)
        assert worker.is_alive() and destroyed == [], "destroyed during a capture"
    finally:
        capture_activity.exit()
    worker.join(5)
    assert not worker.is_alive() and destroyed == [0xD1]


def test_a_handle_destroyed_inside_a_capture_is_destroyed_after_it():
    from cugraphrt._memory.backing import capture_activity

    destroyed: list = []
    module = _fake_cublas(destroyed)
    capture_activity.enter()
    try:
        module.destroy(0xD2)  # a garbage collection inside this thread's capture
        assert destroyed == []
    finally:
        capture_activity.exit()
    assert destroyed == [0xD2]
    module.destroy(0xD3)  # no capture underway: at once
    assert destroyed == [0xD2, 0xD3]
    _cublas.install(module, already_loaded=False)  # idempotent: wrapped once
    assert module.destroy.__cugraphrt_original__ == destroyed.append


# A handle that dies in the interpreter's teardown, as CuPy's thread-local cuBLAS handles
# do: sys's dict is cleared after every module's globals were set to None, and cugraphrt's
# module outlives the collection before that, as the CuPy modules that hold its wrappers do.
_TEARDOWN = textwrap.dedent("""
    import os, sys
    from cugraphrt._libraries import cublas as _cublas

    class Handle:
        def __init__(self, number, destroy):
            self.number, self.destroy = number, destroy

        def __del__(self, _write=os.write, _repr=repr):
            try:
                self.destroy(self.number)
            except BaseException as exc:
                _write(1, b"failed: " + _repr(exc).encode() + b"\\n")

    destroy = _cublas._guarded_destroy(lambda n, _write=os.write: _write(1, b"destroyed %d\\n" % n))
    sys._late_handle = Handle(7, destroy)
    sys._late_module = _cublas
""")


def test_a_handle_destroyed_in_the_interpreters_teardown_is_destroyed():
    """The wrapped destroy needs none of its module's globals once the interpreter finalizes
    (before: "'NoneType' object has no attribute 'active_in_this_thread'", printed as an
    empty "Error in sys.excepthook" at the end of every multi-threaded GPU run)."""
    done = subprocess.run([sys.executable, "-c", _TEARDOWN], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout == "destroyed 7\n", done.stdout + done.stderr
