"""Systems in processes of their own, timed interleaved: A, B, C, A, B, C, ...

Some systems must run in a process each (a compiler fault or a segmentation fault then costs
one cell, not the run; each process's memory is its system's alone). They are still timed
round by round like the rest of the bench: every child sets up in turn (one at a time, so
that set-up times and memory deltas are its own), says ``READY`` and waits; then each round
asks every live child for one sample in turn.

The protocol, one line each way (the child's other output is ignored)::

    child:  READY {json}       after its set-up: what it wants reported (tokens, memory...)
    parent: run                 time one repeat
    child:  SAMPLE <seconds>
    parent: end                 exit

:func:`serve` is the child's side, :func:`run_interleaved` the parent's.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from .timing import round_order, rounds

__all__ = ["ChildResult", "run_interleaved", "serve", "ChildFailed"]

#: Seconds a child may take to set up (a torch.compile of a real model) or for one sample.
SETUP_TIMEOUT_S = 900.0
SAMPLE_TIMEOUT_S = 300.0


class ChildFailed(RuntimeError):
    """A child exited, timed out or broke the protocol; the message ends with its stderr."""


@dataclass
class ChildResult:
    """What one child reported: its ``READY`` payload and its samples, round by round."""

    info: dict
    samples: list[float] = field(default_factory=list)


class _Child:
    def __init__(self, argv: Sequence[str]) -> None:
        self.argv = " ".join(argv)
        self.stderr = tempfile.TemporaryFile()
        self.proc = subprocess.Popen(list(argv), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=self.stderr)
        self.buffer = b""

    def send(self, command: str) -> None:
        try:
            assert self.proc.stdin is not None  # an invariant of Popen(stdin=PIPE)
            self.proc.stdin.write(command.encode() + b"\n")
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError):
            raise self.failure("exited") from None

    def expect(self, tag: str, timeout_s: float) -> str:
        """The payload of the next line that starts with ``tag``."""
        deadline = time.monotonic() + timeout_s
        while True:
            line = self._line(deadline)
            if line.startswith(tag + " "):
                return line[len(tag) + 1:]

    def _line(self, deadline: float) -> str:
        assert self.proc.stdout is not None  # an invariant of Popen(stdout=PIPE)
        fd = self.proc.stdout.fileno()
        while b"\n" not in self.buffer:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                raise self.failure("timed out")
            chunk = os.read(fd, 65536)
            if not chunk:
                self.proc.wait()
                raise self.failure(f"exited with status {self.proc.returncode}")
            self.buffer += chunk
        line, _, self.buffer = self.buffer.partition(b"\n")
        return line.decode(errors="replace").strip()

    def failure(self, what: str) -> ChildFailed:
        self.stderr.seek(0)
        tail = self.stderr.read()[-3000:].decode(errors="replace").strip()
        last = tail.splitlines()[-1] if tail else "no output on stderr"
        print(f"cugraphrt bench: child `{self.argv}` {what}:\n{tail}", file=sys.stderr)
        return ChildFailed(f"the system's process {what}: {last}")

    def close(self, failed: bool = False) -> None:
        """Ask the child to exit (kill it at once if it failed, or after a minute)."""
        if not failed:
            with contextlib.suppress(Exception):
                self.send("end")
        try:
            self.proc.wait(timeout=0 if failed else 60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.stderr.close()


def run_interleaved(commands: Mapping[str, Sequence[str]], repeats: int, *, warmup: int = 1,
                    on_error: Callable[[str, BaseException], None],
                    step: Callable[[str], None] = lambda detail: None,
                    setup_timeout_s: float = SETUP_TIMEOUT_S,
                    sample_timeout_s: float = SAMPLE_TIMEOUT_S) -> dict[str, ChildResult]:
    """Start each system's child in turn, then time them round by round.

    Parameters
    ----------
    commands : mapping of str to argv
        Per system, the command of its child (which calls :func:`serve`).
    repeats, warmup : int
        Timed rounds, and untimed rounds before them (at least ``timing.MIN_ROUNDS`` and
        ``timing.MIN_WARMUP``); the systems run in ``timing.round_order`` each round.
    on_error : callable
        Called with the system and a :class:`ChildFailed` when its child fails; the system
        then gets no result.
    step : callable
        Progress: called with ``"<system>: set-up"`` and ``"round i/n"``.

    Returns
    -------
    dict of str to ChildResult
        The systems whose child never failed.
    """
    live: dict[str, _Child] = {}
    results: dict[str, ChildResult] = {}
    try:
        for system, argv in commands.items():
            step(f"{system}: set-up")
            child = _Child(argv)
            try:
                results[system] = ChildResult(json.loads(child.expect("READY",
                                                                      setup_timeout_s)))
            except (ChildFailed, ValueError) as exc:
                child.close(failed=True)
                on_error(system, exc)
                continue
            live[system] = child
        repeats, warmup = rounds(repeats, warmup)
        for round_index in range(warmup + repeats):
            step(f"round {round_index + 1}/{warmup + repeats}")
            for system in round_order(list(live), round_index):
                child = live[system]
                try:
                    child.send("run")
                    value = float(child.expect("SAMPLE", sample_timeout_s))
                except (ChildFailed, ValueError) as exc:
                    child.close(failed=True)
                    del live[system], results[system]
                    on_error(system, exc)
                    continue
                if round_index >= warmup:
                    results[system].samples.append(value)
    finally:
        for child in live.values():
            child.close()
    return results


def serve(info: dict, sample: Callable[[], float]) -> None:
    """The child's side: report ``info``, then answer ``run`` with ``sample()`` until ``end``
    (or the parent goes away)."""
    print("READY " + json.dumps(info), flush=True)
    for line in sys.stdin:
        command = line.strip()
        if command == "run":
            print(f"SAMPLE {sample()!r}", flush=True)
        elif command == "end":
            return
