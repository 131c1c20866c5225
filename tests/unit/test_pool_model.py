"""The pool's bookkeeping against a model, step by step (hypothesis state machine, no GPU).

Extends test_pool.py's whole-capture sequences: here allocations, frees inside a capture,
failed and successful ends, graph resets, empty_cache and arrays dropped from other threads
(also while the pool's lock is held) interleave freely, and the accounts are compared with a
model after every step.
"""

from __future__ import annotations

import threading

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from cugraphrt import MemPool, PoolOutOfMemoryError

from .fakes import FakeBackingAllocator, assert_out_of_memory_was_due

STREAM = 0x1234
SIZES = st.one_of(st.integers(1, 1 << 20), st.integers((1 << 20) + 1, 6 << 20))


def drop_in_other_thread(box: list) -> None:
    """Let the last reference in ``box`` die in another thread."""
    def worker():
        item = box.pop()
        del item

    thread = threading.Thread(target=worker)
    thread.start()
    thread.join()


class PoolModel(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.backing = FakeBackingAllocator(capacity=64 << 20)
        self.private = False
        self.pool = MemPool(backing=self.backing, _private=False)
        self.arrays: dict[int, object] = {}  # model: the live arrays
        self.graphs: list[int] = []  # model: the live graphs' places in capture order
        self.token = None
        self.made_in_capture: set[int] = set()
        self.reserved_before = 0
        self.next_id = 0
        # A free that met the held lock waits in the pool's pending list; the pool drains it
        # at its next operation, but gives an emptied segment of an idle private pool back
        # only at the next operation that releases (a drop, an end, a reset, empty_cache).
        self.release_lags = False

    @rule(private=st.booleans())
    @precondition(lambda self: self.token is None and not self.arrays and not self.graphs)
    def new_pool(self, private):
        self.private = private
        self.pool = MemPool(backing=self.backing, _private=private)

    @rule()
    @precondition(lambda self: self.token is None)
    def begin(self):
        self.token = object()
        self.made_in_capture = set()
        self.reserved_before = self.pool.stats().reserved_bytes
        self.pool._begin_capture(self.token)

    @rule(nbytes=SIZES)
    @precondition(lambda self: self.token is not None)
    def allocate(self, nbytes):
        try:
            pointer = self.pool._allocate(nbytes, STREAM, self.token)
        except PoolOutOfMemoryError as error:
            assert error.requested_bytes == nbytes
            assert_out_of_memory_was_due(error, self.pool, self.backing, STREAM)
            return
        assert pointer.mem.size >= nbytes and pointer.ptr % 512 == 0
        self.next_id += 1
        self.arrays[self.next_id] = pointer
        self.made_in_capture.add(self.next_id)

    @rule(data=st.data(), where=st.sampled_from(["here", "thread", "thread_while_locked"]))
    @precondition(lambda self: self.arrays)
    def drop(self, data, where):
        key = data.draw(st.sampled_from(sorted(self.arrays)))
        box = [self.arrays.pop(key)]
        if where == "here":
            box.clear()
        elif where == "thread":
            drop_in_other_thread(box)
        else:  # the worker finds the lock taken: the free waits in the pending list
            with self.pool._lock:
                drop_in_other_thread(box)
                assert self.pool._pending_frees, "a free met a held lock and was lost"
            self.release_lags = True
            return
        self.release_lags = False

    @rule(succeed=st.booleans())
    @precondition(lambda self: self.token is not None)
    def end(self, succeed):
        self.release_lags = False
        if succeed:
            self.graphs.append(self.pool._add_graph())
        self.pool._end_capture(self.token, succeed)
        self.token = None
        if not succeed and not (self.made_in_capture & self.arrays.keys()):
            # Rolled back: a failed capture whose arrays all died leaves no new segment.
            assert self.pool.stats().reserved_bytes <= self.reserved_before

    @rule(data=st.data())
    @precondition(lambda self: self.graphs)
    def reset_graph(self, data):
        self.release_lags = False
        seq = data.draw(st.sampled_from(self.graphs))
        self.graphs.remove(seq)
        self.pool._remove_graph(seq)

    @rule()
    def empty_cache(self):
        self.release_lags = False
        released = self.pool.empty_cache()
        if self.token is not None:
            assert released == 0  # never while a capture into the pool is underway
        # With graphs alive, only segments none of them used may go back (docs/memory.md);
        # segments_are_all_accounted_for and the arena's invariants check what stays.

    @invariant()
    def accounts_match_the_model(self):
        stats = self.pool.stats()
        self.pool._arena.check_invariants()
        assert stats.live_arrays == len(self.arrays)
        assert stats.live_graphs == len(self.graphs)
        assert stats.active_bytes == sum(p.mem.size for p in self.arrays.values())
        assert stats.peak_active_bytes >= stats.active_bytes
        spans = sorted((p.ptr, p.ptr + p.mem.size) for p in self.arrays.values())
        assert all(e <= s for (_, e), (s, _) in zip(spans, spans[1:], strict=False))

    @invariant()
    def segments_are_all_accounted_for(self):
        # Segments of earlier pools went back when those pools died; only this pool's remain.
        assert self.pool.stats().reserved_bytes == self.backing.used

    @invariant()
    def an_idle_private_pool_keeps_only_what_arrays_need(self):
        if self.private and not self.graphs and self.token is None and not self.release_lags:
            needed = {p.mem.segment.ptr for p in self.arrays.values()}
            assert self.pool.stats().segments == len(needed)

    def teardown(self):
        if self.token is not None:
            self.pool._end_capture(self.token, False)
        self.arrays.clear()
        for seq in self.graphs:
            self.pool._remove_graph(seq)
        self.pool.empty_cache()
        # No gc.collect(): reference counting alone must give every segment back (a cycle
        # would hold one until a collection, and a collection per example costs about 0.6 s
        # in a GPU suite's process, full of torch's objects).
        assert self.backing.live == {}, "segments leaked"


TestPoolModel = PoolModel.TestCase
TestPoolModel.settings = settings(max_examples=60, stateful_step_count=40, deadline=None)
