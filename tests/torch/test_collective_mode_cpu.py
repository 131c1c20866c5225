"""The torch side of collectives in graphs, on CPU with gloo: what the dispatch mode records
(user collectives, functional ones, DDP's reducer), the exchange over torch's own store
between two real processes, and the release of graphs when a process group shuts down."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import textwrap
import types
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
dist = torch.distributed
if not dist.is_available():
    pytest.skip("torch without torch.distributed", allow_module_level=True)

from cugraphrt_torch.capture import _collective_mode, _lifecycle  # noqa: E402

from cugraphrt.distributed import log as collective_log  # noqa: E402
from cugraphrt.distributed.log import Collective  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def world_of_one(tmp_path):
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0,
                            world_size=1)
    yield
    if dist.is_initialized():
        dist.destroy_process_group()


def _record(fn):
    capture = types.SimpleNamespace(collectives=None)
    assert _collective_mode.enabled()
    with _collective_mode.recording(capture):
        fn()
    return capture.collectives.entries if capture.collectives else []


def test_user_collectives_are_recorded_in_order(world_of_one):
    x = torch.randn(16)

    def work():
        dist.all_reduce(x, op=dist.ReduceOp.MAX)
        dist.broadcast(x, src=0)
        out = [torch.empty(16)]
        dist.all_gather(out, x)
        dist.all_reduce(torch.randn(3, 5, dtype=torch.float64))

    assert _record(work) == [
        Collective("all_reduce", "float32", 16, "0", "max"),
        Collective("broadcast", "float32", 16, "0", "root 0"),
        Collective("all_gather", "float32", 16, "0"),
        Collective("all_reduce", "float64", 15, "0", "sum")]


def test_functional_collectives_and_ddp_backward_are_recorded(world_of_one):
    import torch.distributed._functional_collectives as fc

    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(8, 4))
    x = torch.randn(2, 8)
    got = _record(lambda: (fc.all_reduce(torch.randn(6), "sum", dist.group.WORLD).wait(),
                           model(x).sum().backward()))
    assert got[0] == Collective("all_reduce", "float32", 6, "0", "sum")
    # DDP's reducer all-reduces its one bucket (weight and bias: 36 values) from C++.
    assert Collective("all_reduce", "float32", 36, "0", "sum") in got[1:]


def test_nothing_is_recorded_without_a_process_group():
    assert not dist.is_initialized()
    assert not _collective_mode.enabled()
    capture = types.SimpleNamespace(collectives=None)
    with _collective_mode.recording(capture):
        torch.randn(4).sum()
    assert capture.collectives is None


def test_the_exchanger_of_a_world_of_one(world_of_one):
    exchanger = _collective_mode.TorchExchanger()
    exchanger.bind(frozenset({"0"}))
    assert exchanger.ranks == (0,) and exchanger.rank == 0
    assert exchanger.exchange("graph0", b"abc", 1.0) == {0: b"abc"}
    assert exchanger.describe() == "rank 0 of ranks [0] (group '0')"
    assert exchanger.default_timeout_s() > 0
    first = exchanger.next_index()
    assert exchanger.next_index() == first + 1


class FakeGraph:
    is_captured = True
    resets = 0

    def reset(self):
        self.resets += 1
        self.is_captured = False


def test_shutting_a_group_down_releases_its_graphs_first(world_of_one):
    _lifecycle.install()
    exchanger = _collective_mode.TorchExchanger()
    mine, other = FakeGraph(), FakeGraph()
    for graph, group in ((mine, "0"), (other, "elsewhere")):
        log = collective_log.CollectiveLog(exchanger)
        log.add(Collective("all_reduce", "float32", 4, group, "sum"))
        collective_log.track(graph, log)
    dist.destroy_process_group()  # shuts the default group ('0') down
    assert mine.resets == 1 and other.resets == 0
    collective_log.release_graphs()


_TWO_RANKS = """
import os, sys
import torch.distributed as dist
from cugraphrt_torch.capture._collective_mode import TorchExchanger
from cugraphrt.distributed.log import Collective, CollectiveLog
from cugraphrt import CaptureError
from cugraphrt.distributed import crossrank
dist.init_process_group("gloo")
rank = dist.get_rank()
ar = Collective("all_reduce", "float32", 4096, "0", "sum")
ex = TorchExchanger()
log = CollectiveLog(ex)
for _ in range(2 if rank == 0 else 1):   # rank 1 captured one all-reduce fewer
    log.add(ar)
ex.bind(log.groups)
log.seal()
try:
    crossrank.verify(log, 20.0)
    print(f"rank {rank}: PASSED")
except CaptureError as exc:
    print(f"rank {rank}: {exc}")
dist.destroy_process_group()
"""


def test_two_processes_compare_over_torchs_store_and_both_raise():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    procs = []
    for rank in (0, 1):
        env = {"RANK": str(rank), "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1",
               "MASTER_PORT": str(port), "PYTHONPATH": os.pathsep.join(
                   [str(ROOT), str(ROOT / "adapters"), os.environ.get("PYTHONPATH", "")]),
               "PATH": "/usr/bin:/bin"}
        procs.append(subprocess.Popen([sys.executable, "-c", textwrap.dedent(_TWO_RANKS)],
                                      env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                      text=True))
    outs = [p.communicate(timeout=120) for p in procs]
    for rank, (out, err) in enumerate(outs):
        assert f"rank {rank}: the ranks captured different collectives into graph #0" in out, \
            out + err
        assert ("got at collective #1: rank 0: all_reduce float32[4096] sum on group '0'; "
                "rank 1: nothing (it captured 1 collective)") in out
