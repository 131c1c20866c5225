"""The deadline of every torchrun launch (tests and bench), on CPU: a hung launch fails with
each rank's Python stacks, a healthy one passes, and the last-resort kill reaches processes
that left the launcher's session."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

pytest.importorskip("torch.distributed.run")

from cugraphrt.bench import torchrun as launcher

ROOT = Path(__file__).resolve().parents[2]

SCRIPT = """
import os, sys, time
rank = int(os.environ["RANK"])
print(f"rank {rank} up, multicast {os.environ['NCCL_NVLS_ENABLE']}", flush=True)

def waits_for_a_peer_that_never_comes():
    time.sleep(600)

if sys.argv[1] == "hang" and rank == 0:
    waits_for_a_peer_that_never_comes()
elif sys.argv[1] == "hang":
    time.sleep(600)
print(f"OK rank={rank}", flush=True)
"""


@pytest.fixture
def script(tmp_path):
    path = tmp_path / "ranks.py"
    path.write_text(textwrap.dedent(SCRIPT))
    return str(path)


def test_a_hung_launch_fails_with_every_ranks_stacks(script):
    env = launcher.environment(paths=[str(ROOT)])
    launch = launcher.torchrun(script, ["hang"], nproc=2, deadline_s=6, env=env)
    assert not launch.ok and launch.hung() and launch.seconds < 6 + launcher.GRACE_S
    assert sorted(launch.stacks) == ["rank0", "rank1"]
    assert "in waits_for_a_peer_that_never_comes" in launch.stacks["rank0"]
    report = launch.report()
    assert "a rank reached its deadline" in report and "--- rank1: Python stacks ---" in report
    assert "rank 0 up, multicast 0" in launch.stdout


def test_a_healthy_launch_passes_without_stacks(script):
    # PYTHONPATH kept: where the project's dependencies come from it (the GPU kit's wheels).
    env = launcher.environment({"PATH": os.environ["PATH"], "NCCL_BLOCKING_WAIT": "1",
                                "PYTHONPATH": os.environ.get("PYTHONPATH", "")},
                               paths=[str(ROOT)])
    assert "NCCL_BLOCKING_WAIT" not in env and env["TORCH_SYMM_MEM_DISABLE_MULTICAST"] == "1"
    launch = launcher.torchrun(script, ["pass"], nproc=2, deadline_s=120, env=env)
    assert launch.ok, launch.report()
    assert launch.stacks == {} and "OK rank=1" in launch.stdout


def test_the_last_resort_kills_the_whole_tree():
    # A parent whose child runs in a session of its own, as torchrun starts its ranks.
    code = ("import subprocess, sys, time; "
            "p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)'], "
            "start_new_session=True); print(p.pid, flush=True); time.sleep(600)")
    parent = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True,
                              start_new_session=True)
    child = int(parent.stdout.readline())
    launcher._kill_tree(parent.pid)
    parent.wait(30)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            os.kill(child, 0)
        except ProcessLookupError:
            break
        try:  # reaped by init eventually; a zombie counts as gone
            with open(f"/proc/{child}/stat") as handle:
                if handle.read().rsplit(")", 1)[1].split()[0] == "Z":
                    break
        except OSError:
            break
        time.sleep(0.1)
    else:
        raise AssertionError("the rank-like child survived the last-resort kill")
