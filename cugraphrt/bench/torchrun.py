"""Start torchrun under a deadline: a hung launch fails, with every rank's Python stacks.

A hang of a multi-GPU run has no output: every rank waits inside NCCL or a CUDA
synchronization and torchrun waits for them. So every launch of the bench and of the tests
goes through :func:`torchrun`:

* each rank runs under :mod:`cugraphrt.bench.rank_deadline` (faulthandler): at the deadline
  it writes the stacks of all its threads to a file of its own and exits, which makes
  torchrun stop the other ranks with SIGTERM, on which they write theirs;
* the parent waits the deadline plus a grace period, then, as a last resort, sends SIGTERM
  (stacks) and SIGKILL to every process of the launch (torchrun starts each rank in a
  session of its own, so they are found by their parent process ids);
* the result (:class:`Launch`) holds the exit status, the output and the stacks, and
  :meth:`Launch.report` formats them for a failure message.

Every launch environment turns NVLink multicast off (``NCCL_NVLS_ENABLE=0``,
``TORCH_SYMM_MEM_DISABLE_MULTICAST=1``, ``NVSHMEM_DISABLE_NVLS=1``) and blocking waits off.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

__all__ = ["MULTICAST_OFF", "GRACE_S", "Launch", "environment", "torchrun"]

#: NVLink multicast stays off on every machine these launches run on.
MULTICAST_OFF = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
                 "NVSHMEM_DISABLE_NVLS": "1"}
#: How long after the ranks' deadline the parent kills whatever is left.
GRACE_S = 45.0
_BLOCKING_WAIT = ("TORCH_NCCL_BLOCKING_WAIT", "NCCL_BLOCKING_WAIT")


@dataclass
class Launch:
    """What a torchrun launch left: status, output, and each rank's stacks if it hung."""

    command: list[str]
    returncode: int | None
    stdout: str
    stderr: str
    seconds: float
    timed_out: bool = False
    stacks: dict[str, str] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        """Whether every rank exited with status 0 before the deadline."""
        return self.returncode == 0 and not self.timed_out

    def hung(self) -> bool:
        """Whether some rank reached its deadline (or the parent had to kill the launch)."""
        return self.timed_out or any("Timeout (" in text for text in self.stacks.values())

    def report(self, limit: int = 6000) -> str:
        """The failure as text: how it ended, the output's tails, every rank's stacks."""
        how = (f"killed by the launcher after {self.seconds:.0f} s" if self.timed_out
               else f"exit status {self.returncode} after {self.seconds:.0f} s")
        parts = [f"{' '.join(self.command)}: {how}"
                 + (" (a rank reached its deadline: stacks below)" if self.hung() else ""),
                 f"--- stdout (tail) ---\n{self.stdout[-limit:]}",
                 f"--- stderr (tail) ---\n{self.stderr[-limit:]}"]
        for name, text in sorted(self.stacks.items()):
            parts.append(f"--- {name}: Python stacks ---\n{text[-limit:]}")
        return "\n".join(parts)


def environment(base: Mapping[str, str] | None = None, paths: Iterable[str] = ()
                ) -> dict[str, str]:
    """The environment of a launch: ``base`` (os.environ) with multicast and blocking waits
    off and ``paths`` first on ``PYTHONPATH``."""
    env = dict(os.environ if base is None else base)
    for name in _BLOCKING_WAIT:
        env.pop(name, None)  # a blocking wait cannot be captured (docs/distributed.md)
    env.update(MULTICAST_OFF)
    env["PYTHONUNBUFFERED"] = "1"
    entries = [str(p) for p in paths] + [env.get("PYTHONPATH", "")]
    env["PYTHONPATH"] = os.pathsep.join(p for p in entries if p)
    return env


def torchrun(target: str, args: Sequence[str] = (), *, nproc: int, deadline_s: float,
             module: bool = False, env: Mapping[str, str] | None = None,
             cwd: str | None = None) -> Launch:
    """Run ``target`` (a script, or a module with ``module=True``) on ``nproc`` ranks.

    Parameters
    ----------
    deadline_s : float
        Each rank dumps its stacks and exits at this age; the parent kills the rest
        :data:`GRACE_S` seconds later.
    env : mapping, optional
        The launch's environment (:func:`environment` by default; the deadline variables
        are added, and multicast stays off whatever it says).
    """
    stacks_dir = tempfile.mkdtemp(prefix="cugraphrt-stacks-")
    launch_env = dict(environment() if env is None else env)
    launch_env.update(MULTICAST_OFF)
    launch_env["CUGRAPHRT_RANK_DEADLINE"] = str(deadline_s)
    launch_env["CUGRAPHRT_STACKS_DIR"] = stacks_dir
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone",
               f"--nproc-per-node={nproc}", "-m", "cugraphrt.bench.rank_deadline",
               *(["-m"] if module else []), target, *args]
    start = time.monotonic()
    proc = subprocess.Popen(command, cwd=cwd, env=launch_env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    timed_out = False
    try:
        out, err = proc.communicate(timeout=deadline_s + GRACE_S)
    except subprocess.TimeoutExpired:
        timed_out = True
        _kill_tree(proc.pid)
        out, err = proc.communicate()
    seconds = time.monotonic() - start
    try:
        stacks = _read_stacks(stacks_dir)
    finally:
        shutil.rmtree(stacks_dir, ignore_errors=True)
    return Launch(command, proc.returncode, out, err, seconds, timed_out, stacks)


def _read_stacks(folder: str) -> dict[str, str]:
    """Each rank's file, where it wrote more than its header line (it dumped stacks)."""
    found = {}
    for name in sorted(os.listdir(folder)):
        with open(os.path.join(folder, name), errors="replace") as handle:
            text = handle.read()
        if text.count("\n") > 1:
            found[name.removesuffix(".txt")] = text
    return found


def _children() -> dict[int, list[int]]:
    tree: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as handle:
                stat = handle.read()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        tree.setdefault(ppid, []).append(int(entry))
    return tree


def _kill_tree(root: int) -> None:
    """SIGTERM (the ranks dump their stacks), then SIGKILL, to ``root`` and its descendants."""
    tree = _children() if os.path.isdir("/proc") else {}
    pids, todo = [], [root]
    while todo:
        pid = todo.pop()
        pids.append(pid)
        todo.extend(tree.get(pid, []))
    for sig, pause in ((signal.SIGTERM, 5.0), (signal.SIGKILL, 0.0)):
        for pid in reversed(pids):  # the ranks first: torchrun must not restart anything
            try:
                os.kill(pid, sig)
            except (ProcessLookupError, PermissionError):
                pass
        time.sleep(pause)
    try:
        os.killpg(root, signal.SIGKILL)  # torchrun's own session (start_new_session above)
    except (ProcessLookupError, PermissionError):
        pass
