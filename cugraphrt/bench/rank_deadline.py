"""Run one torchrun rank under a deadline, with its Python stacks dumped before it dies.

``python -m cugraphrt.bench.rank_deadline [-m] TARGET [ARGS...]`` runs the script (or, with
``-m``, the module) TARGET as ``__main__`` after installing :mod:`faulthandler` so that

* at ``CUGRAPHRT_RANK_DEADLINE`` seconds the stacks of every thread are written and the
  rank exits (status 1): torchrun then stops the other ranks;
* a SIGTERM (torchrun stopping this rank because another one failed, or the launcher's last
  resort) writes them too before the rank dies;
* a crash (SIGSEGV, SIGABRT, ...) writes them as well.

They go to ``$CUGRAPHRT_STACKS_DIR/rank<RANK>.txt`` (stderr without the variable), where
:func:`cugraphrt.bench.torchrun.torchrun` collects them. Used by the bench and the tests; a
hang in C code (NCCL, a CUDA synchronization) is covered, since faulthandler writes from its
own thread and signal handlers, without the GIL.
"""

from __future__ import annotations

import faulthandler
import os
import runpy
import signal
import sys
from typing import IO

__all__ = ["install", "main"]

_file: IO[str] | None = None  # open for the life of the process: faulthandler writes to it


def install(deadline_s: float, stacks_dir: str | None, rank: str) -> None:
    """Install the dumps (see the module docstring) for this process."""
    global _file
    if stacks_dir:
        _file = open(os.path.join(stacks_dir, f"rank{rank}.txt"), "w")
    out = _file if _file is not None else sys.stderr
    out.write(f"rank {rank} (pid {os.getpid()}), deadline {deadline_s:g} s\n")
    out.flush()
    faulthandler.enable(file=out, all_threads=True)
    faulthandler.register(signal.SIGTERM, file=out, all_threads=True, chain=True)
    faulthandler.dump_traceback_later(deadline_s, exit=True, file=out)


def main(argv: list[str] | None = None) -> None:
    """Install the deadline, then run the target as ``__main__``."""
    argv = list(sys.argv[1:] if argv is None else argv)
    module = bool(argv) and argv[0] == "-m"
    if module:
        argv = argv[1:]
    if not argv:
        raise SystemExit("usage: python -m cugraphrt.bench.rank_deadline [-m] TARGET [ARGS...]")
    target, args = argv[0], argv[1:]
    install(float(os.environ.get("CUGRAPHRT_RANK_DEADLINE", "600")),
            os.environ.get("CUGRAPHRT_STACKS_DIR"), os.environ.get("RANK", "0"))
    sys.argv = [target, *args]
    if module:
        runpy.run_module(target, run_name="__main__", alter_sys=True)
    else:
        # As `python script.py` would: the script's folder first on the path.
        sys.path.insert(0, os.path.dirname(os.path.abspath(target)))
        runpy.run_path(target, run_name="__main__")


if __name__ == "__main__":
    main()
