"""The generated-program machinery of tests/stress, proven without a GPU.

NumPy (and torch on the CPU) stand in for CuPy: the generator's shape rules agree with what
the arrays do, bucket programs never mix rows, printed programs replay, and the harness
catches a graph that does not replay and a reference that is wrong.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, Phase, given, settings

from tests.stress._generate import programs
from tests.stress._harness import FakeCapturer, check_program, compare, round_data, tolerance
from tests.stress._interpret import ArrayBackend, Machine, TorchBackend, apply
from tests.stress._programs import MODES, Invalid, Op, Program, step

FAST = settings(max_examples=60, deadline=None, database=None, derandomize=True,
                suppress_health_check=list(HealthCheck), phases=(Phase.generate, Phase.shrink))


def _backends():
    yield pytest.param(ArrayBackend, id="numpy")
    yield pytest.param("torch", id="torch-cpu")


def _backend(kind):
    if kind == "torch":
        pytest.importorskip("torch", reason="the torch backend needs torch")
        return TorchBackend("cpu")
    return kind()


@pytest.mark.parametrize("kind", list(_backends()))
@pytest.mark.parametrize("mode", MODES)
def test_every_register_has_the_shape_and_dtype_the_rules_infer(kind, mode):
    backend = _backend(kind)

    @FAST
    @given(programs(mode))
    def check(program):
        inputs = tuple(backend.from_host(a) for a in round_data(program, -1))
        values: list = []
        for op, meta in zip(program.ops, program.metas(), strict=True):
            value = apply(backend, op, [values[a] for a in op.args], program.dtype, inputs)
            values.append(value)
            if value is None:
                assert meta.kind == "-", op
                continue
            dtype = str(value.dtype).replace("torch.", "")
            assert tuple(value.shape) == meta.shape, (op, tuple(value.shape), meta)
            assert dtype == (program.dtype if meta.kind == "v" else "bool"), (op, dtype)

    check()


@pytest.mark.parametrize("kind", list(_backends()))
@pytest.mark.parametrize("mode", MODES)
def test_fake_replays_equal_eager_runs(kind, mode):
    backend = _backend(kind)

    @FAST
    @given(programs(mode))
    def check(program):
        check_program(program, backend, FakeCapturer())

    check()


@FAST
@given(programs("buckets"))
def test_bucket_programs_never_mix_rows(program):
    # What a bucket does: the call's rows, then pad rows of zeros up to the bucket.
    backend = ArrayBackend()
    rtol = tolerance(program)
    for r, n in enumerate(program.sizes):
        data = round_data(program, r)
        padded = [np.concatenate([a, np.zeros((program.inputs[i][0] - n, *a.shape[1:]),
                                              a.dtype)]) if program.batched[i] else a
                  for i, a in enumerate(data)]
        small = Machine(program, backend, data).run().outputs()
        large = Machine(program, backend, padded).run().outputs()
        for s, b in zip(small, large, strict=True):
            assert compare(np.asarray(s), np.asarray(b)[:n], rtol) is None, program


@FAST
@given(programs("shared_pool"))
def test_shared_pool_stages_each_hold_a_kernel(program):
    ranges = program.stage_ranges()
    assert 2 <= len(ranges) <= 3
    for start, stop in ranges:
        names = {op.name for op in program.ops[start:stop]}
        assert names - {"input", "slice", "transpose", "reshape", "broadcast", "expand_dims"}


@pytest.mark.parametrize("mode", MODES)
def test_a_printed_program_is_the_program(mode):
    @FAST
    @given(programs(mode))
    def check(program):
        assert eval(repr(program), {"Program": Program, "Op": Op}) == program

    check()


class StaleCapturer(FakeCapturer):
    """A broken runtime: captures, but replays redo nothing (outputs keep the first run's)."""

    def capture(self, block, pool):
        block()
        return lambda: None

    def graphed(self, fn, sample, program):
        first = tuple(np.array(v, copy=True) for v in fn(*sample))
        return lambda *args: first


class SkewedCapturer(FakeCapturer):
    """A broken runtime whose graphed calls return one element off by ``skew`` (relative)."""

    def __init__(self, skew: float) -> None:
        self.skew = skew

    def graphed(self, fn, sample, program):
        def call(*args):
            outputs = [np.array(v, copy=True) for v in fn(*args)]
            outputs[0].reshape(-1)[0] *= 1 + self.skew
            return outputs

        return call


def _program(mode: str, **extra) -> Program:
    # y = tanh(x @ w) + x[:, :1] * u, with u a uniform draw
    ops = (Op("input", (), (0,)), Op("input", (), (1,)), Op("matmul", (0, 1)),
           Op("tanh", (2,)), Op("slice", (0,), (((0, 8, 1), (0, 1, 1)),)),
           Op("uniform", (), ((8, 1), -1.0, 1.0)), Op("mul", (4, 5)), Op("add", (3, 6)))
    return Program("float32", mode, ((8, 16), (16, 4)), ops, (5, 7), 1234, **extra)


@pytest.mark.parametrize("mode", ["graph", "graphed", "shared_pool"])
def test_a_graph_that_does_not_replay_is_caught(mode):
    program = _program(mode, stages=(3,) if mode == "shared_pool" else ())
    check_program(program, ArrayBackend(), FakeCapturer())
    with pytest.raises(AssertionError, match="replays differ from eager runs") as caught:
        check_program(program, ArrayBackend(), StaleCapturer())
    assert "the draws of replay 1 repeat replay 0's" in str(caught.value)
    assert repr(program) in str(caught.value)  # printed, so it can be replayed


def test_an_output_off_by_more_than_the_tolerance_is_caught_and_one_within_it_is_not():
    program = _program("graphed")
    check_program(program, ArrayBackend(), SkewedCapturer(tolerance(program) / 8))
    with pytest.raises(AssertionError, match=r"1 of 8 elements differ"):
        check_program(program, ArrayBackend(), SkewedCapturer(1e-3))


def test_the_comparator_catches_a_wrong_reference():
    rng = np.random.default_rng(7)
    want = rng.uniform(-2, 2, (5, 7)).astype(np.float32)
    rtol = 64 * float(np.finfo(np.float32).eps) * 4
    assert compare(want.copy(), want, rtol) is None
    assert compare(want * (1 + rtol / 4), want, rtol) is None
    wrong = want.copy()
    wrong[3, 2] += 1e-3
    assert "first at (3, 2)" in compare(wrong, want, rtol)
    assert "expected float32[5, 7]" in compare(want.astype(np.float64), want, rtol)
    assert "expected float32[5, 7]" in compare(want[:, :6], want, rtol)
    ints = rng.integers(-9, 10, (4, 4)).astype(np.int32)
    assert compare(ints + (np.arange(16).reshape(4, 4) == 5), ints, rtol) is not None
    bools = ints > 0
    assert compare(~bools, bools, 0.0) is not None
    special = np.array([np.nan, np.inf, -np.inf, 1.0], np.float32)
    assert compare(special.copy(), special, rtol) is None
    assert compare(special[::-1].copy(), special, rtol) is not None


def test_the_rules_refuse_what_would_break_a_run():
    inputs = [((4, 3), True), ((3,), False), ((4, 3), False), ((2, 4), False),
              ((1, 4, 3), False)]
    program = Program("float32", "buckets", tuple(s for s, _ in inputs), (), (), 0,
                      batched=tuple(b for _, b in inputs))
    metas: list = []
    for op in [Op("input", (), (n,)) for n in range(5)] + [Op("abs", (0,)),
                                                            Op("reshape", (5,), ((-1, 3),))]:
        metas.append(step(program, metas, op))  # 5: abs(x), writable; 6: a reshape of it
    refused = {
        "a reduction over rows": Op("sum", (0,), (0, False)),
        "a reduction over everything": Op("sum", (0,), (None, True)),
        "rows leave dimension 0": Op("transpose", (0,), ((1, 0),)),
        "an unbatched operand spans rows": Op("add", (0, 2)),
        "a batched operand under a new leading dimension": Op("add", (0, 4)),
        "a matmul contracting rows": Op("matmul", (3, 0)),
        "a write into an input": Op("iadd", (0, 1)),
        "a source aliasing the target": Op("iadd", (5, 5)),
        "a write through a reshape (a view or a copy, by strides)": Op("iadd", (6, 1)),
        "a draw (a call and its bucket would draw differently)": Op("uniform", (), ((4,), 0, 1)),
    }
    for why, op in refused.items():
        with pytest.raises(Invalid):
            step(program, metas, op)
            pytest.fail(f"accepted {why}: {op}")
    assert step(program, metas, Op("iadd", (5, 1))).kind == "-"
    assert step(program, metas, Op("add", (0, 1))).batched
    assert step(program, metas, Op("sum", (0,), (1, True))).shape == (4, 1)
