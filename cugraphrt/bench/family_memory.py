"""Device memory a bucket family takes, as a server sees it: each build in a process of its own.

A server captures its graphs, then sizes its KV cache from what ``cudaMemGetInfo`` says is
free. So the memory rows of ``many_shapes`` and ``serving`` build each family in a fresh
process (``python -m cugraphrt.bench.family_child WORKLOAD SYSTEM``), after the model is
set up and every cache emptied, and read the device's free memory before the build, right
after it with nothing emptied (``build``: what the server sees) and after torch's and
cugraphrt's caches are emptied (``emptied``: what it would see if it asked for the cached
memory back). One process per reading, so that nothing one build cached or released is
billed to the other.

The child (:mod:`cugraphrt.bench.family_child`) prints one line ``MEMORY {"build": bytes,
"emptied": bytes}``; :func:`measure` is the parent's side.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from typing import Any

__all__ = ["measure", "device_rows", "readings", "PREFIX"]

#: Seconds a build may take (a 35-size Llama family with its model set-up: about 10 s).
TIMEOUT_S = 600.0
PREFIX = "MEMORY "
_MIB = float(1 << 20)


def readings(build: Callable[[], Any], empty: Callable[[], None],
             free: Callable[[], int]) -> dict[str, int]:
    """The two readings of one build: ``empty()`` empties every cache, ``free()`` reads the
    device's free bytes. ``build()``'s result lives until both are read."""
    empty()
    before = free()
    built = build()
    after_build = free()
    empty()
    after_empty = free()
    del built
    return {"build": before - after_build, "emptied": before - after_empty}


def measure(workload: str, system: str) -> tuple[int, int]:
    """``(build, emptied)``: the device bytes ``system``'s family of ``workload`` takes, read
    in a fresh process (module docstring).

    Raises
    ------
    RuntimeError
        When the child fails, times out or prints no reading; the message ends with its
        stderr.
    """
    env = dict(os.environ)
    try:
        done = subprocess.run([sys.executable, "-m", "cugraphrt.bench.family_child", workload,
                               system], capture_output=True, text=True, timeout=TIMEOUT_S,
                              env=env, check=False)
    except subprocess.TimeoutExpired:
        raise RuntimeError(f"the {system} build of {workload} took more than {TIMEOUT_S:.0f} "
                           f"s in its process") from None
    lines = [line for line in done.stdout.splitlines() if line.startswith(PREFIX)]
    if done.returncode != 0 or not lines:
        tail = "\n".join(done.stderr.strip().splitlines()[-20:])
        raise RuntimeError(f"the {system} build of {workload} failed in its process (exit "
                           f"status {done.returncode}):\n{tail}")
    reading = json.loads(lines[-1][len(PREFIX):])
    return int(reading["build"]), int(reading["emptied"])


def device_rows(build, emptied, workload: str) -> None:
    """Fill the two device-memory rows of ``workload`` (``RowBuilder`` s, in MiB): each of
    the rows' systems built in a process of its own (:func:`measure`)."""
    from .timing import single

    for system in build.row.systems:
        reading = build.setup(system, lambda s=system: measure(workload, s))
        if reading is None:
            emptied.row.cells[system] = build.row.cells[system]
            continue
        build.set(system, single(reading[0] / _MIB))
        emptied.set(system, single(reading[1] / _MIB))
