"""The generate workload's pieces without a GPU: the hand loop's steps and the round's clock."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from cugraphrt.bench import workloads_generate
from cugraphrt.bench.generate_loop import TorchLoop
from cugraphrt.bench.spec import Failed, RowBuilder
from cugraphrt.bench.timing import Summary


class _State:
    """The generator's state as the hand loop sees it: the sequence length and the flag."""

    def __init__(self) -> None:
        self.cur = self.max_len = 0
        self.ids = _Ids()
        self.reads = 0

    def stage(self, ids, mask, rows, new, pad, eos) -> None:
        self.cur, self.max_len = ids.shape[1], ids.shape[1] + new

    def read(self) -> tuple[int, bool]:
        self.reads += 1
        return self.cur, self.cur < self.max_len


class _Prompt:
    shape = (2, 5)

    def new_ones(self, shape):
        return self


def _loop(chunk: int, buckets: tuple[int, ...]):
    state = _State()
    steps: list[tuple[int, int]] = []

    def step(bucket: int):
        def replay() -> None:
            # A step feeds the token at position cur - 1: it must fit the bucket.
            assert state.cur <= bucket, f"a step past bucket {bucket} at {state.cur}"
            assert state.cur < state.max_len, "a step past the requested tokens"
            steps.append((bucket, state.cur))
            state.cur += 1
        return SimpleNamespace(replay=replay)

    def prefill() -> None:
        state.cur += 1  # the first token

    generator = SimpleNamespace(
        state=state, chunk=chunk,
        _cache_bucket=lambda length: next(b for b in buckets if b >= length))
    loop = TorchLoop.__new__(TorchLoop)
    loop.generator, loop.rows = generator, 2
    loop.prefill = SimpleNamespace(replay=prefill)
    loop.steps = {b: step(b) for b in buckets}
    return loop, state, steps


class _Ids:
    def __getitem__(self, key):
        return SimpleNamespace(clone=lambda: key)


@pytest.mark.parametrize("chunk, buckets, new", [(4, (8, 16, 24), 16), (32, (64, 128), 100),
                                                 (3, (6,), 1), (5, (64,), 60)])
def test_the_hand_loop_runs_every_step_and_reads_once_a_chunk(chunk, buckets, new):
    loop, state, steps = _loop(chunk, buckets)
    loop.generate(_Prompt(), new)
    assert len(steps) == new - 1  # the prefill chose the first token
    assert [cur for _, cur in steps] == list(range(6, 5 + new))
    # One read after the prefill, then one per chunk: a chunk ends at `chunk` steps or where
    # the sequence outgrows its cache bucket, as the generator's device loop does.
    chunks, run, last = 0, 0, None
    for bucket, _ in steps:
        if run == chunk or bucket != last:
            chunks, run = chunks + 1, 0
        run, last = run + 1, bucket
    assert state.reads == 1 + chunks


def test_a_round_times_the_first_token_apart(monkeypatch):
    clock = iter([0.0, 0.002, 10.0, 10.257])  # one token: 2 ms; all 256: 257 ms
    monkeypatch.setattr(workloads_generate.time, "perf_counter", lambda: next(clock))
    torch = SimpleNamespace(cuda=SimpleNamespace(synchronize=lambda: None))
    timed = workloads_generate.Timed(torch, lambda: "tokens", lambda: "one")
    assert timed() == pytest.approx(0.255 / 255)
    assert timed.firsts == [pytest.approx(0.002)] and timed.tokens == "tokens"


class _Tokens:
    def __init__(self, same: bool) -> None:
        self.same = same

    def __eq__(self, other):
        return SimpleNamespace(all=lambda: self.same)


def test_a_hand_loop_with_other_tokens_is_an_error_cell(capsys):
    row = RowBuilder("per token, batch 1", "us", workloads_generate.SYSTEMS, "hf_static",
                     "cugraphrt_compiled")
    for name in ("torch_loop", "cugraphrt_compiled", "torch_loop_eager", "cugraphrt"):
        row.set(name, Summary(1.0, 1.0, 1.0, 9))
    timed = {name: SimpleNamespace(tokens=_Tokens(name != "torch_loop"))
             for name in ("torch_loop", "cugraphrt_compiled", "torch_loop_eager", "cugraphrt")}
    workloads_generate._check_loops(row, timed, dict.fromkeys(timed, [1.0]))
    assert isinstance(row.row.cells["torch_loop"], Failed)
    assert isinstance(row.row.cells["torch_loop_eager"], Summary)
    assert "did not replay the same program" in capsys.readouterr().err


def test_hf_static_must_have_compiled():
    with pytest.raises(RuntimeError, match="did not compile"):
        workloads_generate.hf_static_compiled(SimpleNamespace())
    assert workloads_generate.hf_static_compiled(SimpleNamespace(_compiled_call=print)) is print
    # As _batch uses it: a set-up that passes must not read as a failed one (a None return
    # did, and left hf_static unmeasured on an H200: both 0.50x targets read N/A).
    row = RowBuilder("per token, batch 1", "us", workloads_generate.SYSTEMS, "hf_static",
                     "cugraphrt_compiled")
    assert row.setup("hf_static", lambda: workloads_generate.hf_static_compiled(
        SimpleNamespace(_compiled_call=print))) is not None
    assert "hf_static" not in row.row.cells
