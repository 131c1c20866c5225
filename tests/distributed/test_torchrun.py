"""Collectives and data-parallel training in captured graphs, under torchrun.

Each script of this folder runs with ``python -m torch.distributed.run --nproc-per-node N``
under a deadline (see ``_launch``: a hang fails the test with every rank's Python stacks).
With N = 2 they are the multi-GPU tests (skipped with fewer than 2 GPUs). With N = 1 (a
world of one rank, where an all-reduce is a copy) they prove the capture plumbing end to
end on one GPU, not the communication. The parts of a script share one launch.
Run: ``python -m pytest -q -p no:cacheprovider tests/distributed --long``.
"""

from __future__ import annotations

import pytest

from ._launch import ROOT, WORLD, passed, run_parts, skip_unless_gpus, torchrun

pytestmark = pytest.mark.gpu

COLLECTIVES = ("graph", "callables", "cupy")
LOOPS = ("torch", "cupy", "cg", "mismatch")
TRAINING = ("step", "callables", "ddp_step", "static_graph")


def _ranks(*, two_only: bool = False, one_by_default: bool = False):
    """1 and WORLD ranks. The one-rank runs prove only the plumbing (about 90 s together) and
    are marked long, to hold the default single-GPU run near four minutes, except the
    collectives one (``one_by_default``): torch and CuPy collectives captured in graphs and
    replayed under torchrun, about 15 s, run by default on any GPU."""
    one_marks = [skip_unless_gpus(1)] + ([] if one_by_default else [pytest.mark.long])
    cases = [] if two_only else [pytest.param(1, marks=one_marks, id="1rank")]
    return [*cases, pytest.param(WORLD, marks=skip_unless_gpus(WORLD), id=f"{WORLD}ranks")]


def _has_cupy_nccl() -> bool:
    try:
        from cupy.cuda import nccl
    except Exception:  # noqa: BLE001
        return False
    return bool(nccl.available)


@pytest.mark.parametrize("nproc", _ranks(one_by_default=True))
@pytest.mark.parametrize("part", COLLECTIVES)
def test_collectives_in_graphs_match_eager_over_100_replays(part, nproc):
    parts = COLLECTIVES if _has_cupy_nccl() else COLLECTIVES[:2]
    if part not in parts:
        pytest.skip("CuPy cannot load NCCL (pip install nvidia-nccl-cu13)")
    out = run_parts("collectives.py", parts, nproc)
    assert passed(out, part, nproc) and passed(out, "teardown", nproc)


@pytest.mark.parametrize("nproc", _ranks())
@pytest.mark.parametrize("part", TRAINING)
def test_graphed_data_parallel_training_equals_eager(part, nproc):
    out = run_parts("ddp_training.py", TRAINING, nproc)
    assert passed(out, part, nproc) and passed(out, "teardown", nproc)


@pytest.mark.parametrize("nproc", _ranks())
def test_tensor_parallel_decoder_step_equals_eager(nproc):
    out = run_parts("tensor_parallel.py", ("decode",), nproc)
    assert passed(out, "decode", nproc) and passed(out, "teardown", nproc)


@pytest.mark.parametrize("nproc", _ranks())
def test_the_ddp_example_runs(nproc):
    out = torchrun(str(ROOT / "examples" / "distributed_ddp_step.py"), nproc=nproc)
    assert "losses equal to eager DDP's" in out


@pytest.mark.parametrize("nproc", _ranks(two_only=True))
def test_a_mismatched_capture_fails_on_every_rank_naming_the_collective(nproc):
    out = torchrun("checks.py", "mismatch", nproc=nproc, deadline_s=120)
    assert passed(out, "mismatch", nproc) and passed(out, "mismatch-then-eager", nproc)


@pytest.mark.parametrize("nproc", _ranks())
def test_the_watchdog_turns_a_stuck_replay_into_an_error(nproc):
    out = torchrun("checks.py", "watchdog", nproc=nproc, deadline_s=120)
    assert passed(out, "watchdog", nproc)


@pytest.mark.parametrize("nproc", _ranks())
@pytest.mark.parametrize("mode", ["keep", "exit"])
def test_process_groups_go_and_processes_exit_with_graphs_alive(mode, nproc):
    out = torchrun("lifecycle.py", mode, nproc=nproc, deadline_s=120)
    checks = ("destroyed", "released", "freed") if mode == "keep" else ("exiting",)
    assert all(passed(out, check, nproc) for check in ("built", *checks)), out


@pytest.mark.parametrize("nproc", _ranks())
def test_the_tensor_parallel_example_runs(nproc):
    out = torchrun(str(ROOT / "examples" / "distributed_tp_decode.py"), nproc=nproc)
    assert "equal to eager tensor parallelism; position 24" in out


@pytest.mark.parametrize("nproc", _ranks())
def test_the_distributed_bench_child_replays_kept_handles_like_eager(nproc):
    """The code of ``cugraphrt bench --distributed`` in one short round: each system's graph
    is kept only by its replay handle while ``g`` is rebound (it failed so once), and the
    replays must equal eager DDP and the eager TP decoder."""
    out = torchrun("cugraphrt.bench.distributed_child", "--check", nproc=nproc, module=True)
    assert passed(out, "bench-child", nproc)


def _loop_parts(nproc: int) -> tuple[str, ...]:
    """The parts of loops.py for one launch: CuPy's only where CuPy loads NCCL, the
    mismatch only where there is a peer to differ from."""
    return tuple(p for p in LOOPS if (_has_cupy_nccl() or p not in ("cupy", "cg"))
                 and (nproc > 1 or p != "mismatch"))


@pytest.mark.parametrize("nproc", _ranks(one_by_default=True))
@pytest.mark.parametrize("part", LOOPS[:3])
def test_collectives_inside_device_side_loops_and_branches_match_eager(part, nproc):
    """torch.distributed and CuPy NCCL collectives inside while_loop and cond bodies (NCCL's
    event nodes taken out of the bodies), and the distributed CG solved in one launch."""
    if part != "torch" and not _has_cupy_nccl():
        pytest.skip("CuPy cannot load NCCL (pip install nvidia-nccl-cu13)")
    parts = _loop_parts(nproc)
    out = run_parts("loops.py", parts, nproc)
    assert passed(out, part, nproc) and passed(out, "teardown", nproc)


@pytest.mark.parametrize("nproc", _ranks(two_only=True))
def test_collectives_differing_inside_a_loop_body_fail_on_every_rank(nproc):
    out = run_parts("loops.py", _loop_parts(nproc), nproc)
    assert passed(out, "mismatch", nproc)


@pytest.mark.parametrize("nproc", _ranks(two_only=True))
def test_the_watchdog_catches_a_loop_that_never_ends_on_one_rank(nproc):
    out = torchrun("checks.py", "loop_watchdog", nproc=nproc, deadline_s=120)
    assert passed(out, "loop_watchdog", nproc)


@pytest.mark.parametrize("nproc", _ranks())
def test_the_distributed_cg_example_runs(nproc):
    if not _has_cupy_nccl():
        pytest.skip("CuPy cannot load NCCL (pip install nvidia-nccl-cu13)")
    out = torchrun(str(ROOT / "examples" / "distributed_cg.py"), nproc=nproc)
    assert f"{nproc} ranks: " in out and "equal to the per-iteration replays" in out


@pytest.mark.parametrize("nproc", _ranks())
def test_a_tensor_parallel_model_generates_its_eager_tokens(nproc):
    """Issue 56: a transformers Llama split over the ranks, generating with the Generator
    (prefill graphs, decode chunks with the all-reduces inside the device loop): the tokens
    of the same TP model's eager generate, the same on every rank, EOS mid-batch; sampled,
    the same tokens on every rank, the eagerly run program's for the same seeds."""
    out = torchrun("generation.py", "greedy", nproc=nproc)
    assert passed(out, "greedy-tokens", nproc) and passed(out, "sampled", nproc)
    assert passed(out, "greedy", nproc) and passed(out, "teardown", nproc)


@pytest.mark.parametrize("nproc", _ranks())
def test_the_tensor_parallel_generation_example_runs(nproc):
    out = torchrun(str(ROOT / "examples" / "generate_tp.py"), nproc=nproc)
    assert "64 tokens for 2 prompts equal to eager tensor parallelism" in out
