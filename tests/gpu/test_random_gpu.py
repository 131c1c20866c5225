"""Graph-safe random numbers: fresh on every replay, bitwise equal to eager sequences."""

from __future__ import annotations

import cupy
import numpy as np
import pytest

import cugraphrt
import cugraphrt.random as crandom
from cugraphrt import CaptureError, Graph, OptionsError, graph
from cugraphrt._libraries.philox import reference_randint, reference_rows, reference_uniform

pytestmark = pytest.mark.gpu

DRAWS = {
    "rand": lambda g, dt: g.rand(1001, dtype=dt),
    "randn": lambda g, dt: g.randn(999, dtype=dt),
    "normal": lambda g, dt: g.normal(2.0, 3.0, size=(33, 7), dtype=dt),
    "uniform": lambda g, dt: g.uniform(-1.0, 5.0, size=513, dtype=dt),
}
FLOATS = [np.float16, np.float32, np.float64]


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("name", list(DRAWS))
def test_replays_equal_eager_sequence_bitwise(name, dtype, rng):
    seed = int(rng.integers(0, 2**63))
    draw = DRAWS[name]
    gen = crandom.Generator(seed)
    g = Graph()
    with graph(g):
        out = draw(gen, dtype)
    assert gen.get_state().offset == 0  # capture records, it does not draw
    replayed = []
    for _ in range(4):
        g.replay()
        replayed.append(cupy.asnumpy(out))
    gen.manual_seed(seed)
    eager = [cupy.asnumpy(draw(gen, dtype)) for _ in range(4)]
    for r, e in zip(replayed, eager, strict=True):
        assert r.dtype == np.dtype(dtype)
        np.testing.assert_array_equal(r.view(np.uint8), e.view(np.uint8))
    assert len({r.tobytes() for r in replayed}) == 4, "replays repeated their numbers"


@pytest.mark.parametrize("dtype", FLOATS)
def test_uniform_matches_the_numpy_reference_bitwise(dtype, rng):
    seed = int(rng.integers(0, 2**64, dtype=np.uint64))
    gen = crandom.Generator(seed)
    first = cupy.asnumpy(gen.rand(1003, dtype=dtype))
    second = cupy.asnumpy(gen.rand(10, dtype=dtype))
    per = 2 if np.dtype(dtype) == np.float64 else 4
    np.testing.assert_array_equal(first, reference_uniform(seed, 0, 1003, dtype))
    position = -(-1003 // per)
    np.testing.assert_array_equal(second, reference_uniform(seed, position, 10, dtype))
    assert gen.get_state().offset == position + -(-10 // per)


@pytest.mark.parametrize("low,high", [(-5, 7), (0, 2**31 - 1), (-(2**40), 2**41)])
@pytest.mark.parametrize("dtype", [np.int64, np.int32])
def test_randint_matches_reference(low, high, dtype, rng):
    if np.dtype(dtype) == np.int32 and high > 2**31:
        pytest.skip("range does not fit int32")
    seed = int(rng.integers(0, 2**63))
    gen = crandom.Generator(seed)
    got = cupy.asnumpy(gen.randint(low, high, size=777, dtype=dtype))
    assert got.dtype == np.dtype(dtype)
    np.testing.assert_array_equal(got.astype(np.int64), reference_randint(seed, 0, 777, low, high))
    assert got.min() >= low and got.max() < high


def test_normal_statistics_and_bernoulli_rate(rng):
    gen = crandom.Generator(int(rng.integers(0, 2**63)))
    z = cupy.asnumpy(gen.randn(1 << 20, dtype=np.float64))
    assert abs(z.mean()) < 5e-3 and abs(z.std() - 1) < 5e-3
    b = cupy.asnumpy(gen.bernoulli(0.3, size=1 << 20))
    assert set(np.unique(b)) <= {0.0, 1.0} and abs(b.mean() - 0.3) < 3e-3
    reference = np.asarray(reference_uniform(gen.initial_seed(), 0, 16, np.float32))
    assert reference.min() >= 0 and reference.max() < 1


def test_different_seeds_differ():
    a = cupy.asnumpy(crandom.Generator(1).rand(100))
    b = cupy.asnumpy(crandom.Generator(2).rand(100))
    assert not np.array_equal(a, b)


def test_two_graphs_sharing_a_generator_advance_in_replay_order(rng):
    seed = int(rng.integers(0, 2**63))
    gen = crandom.Generator(seed)
    g1, g2 = Graph(), Graph()
    with graph(g1):
        a = gen.rand(100, dtype=np.float32)
    with graph(g2):
        b = gen.randn(60, dtype=np.float32)
    got = []
    for g, out in ((g1, a), (g2, b), (g2, b), (g1, a)):
        g.replay()
        got.append(cupy.asnumpy(out))
    gen.manual_seed(seed)
    expected = [gen.rand(100, dtype=np.float32), gen.randn(60, dtype=np.float32),
                gen.randn(60, dtype=np.float32), gen.rand(100, dtype=np.float32)]
    for x, y in zip(got, expected, strict=True):
        np.testing.assert_array_equal(x, cupy.asnumpy(y))


def test_hundred_replays_draw_hundred_distinct_samples():
    crandom.manual_seed(123)
    g = Graph()
    with graph(g):
        x = crandom.rand(64, dtype=np.float32)
    samples = set()
    for _ in range(100):
        g.replay()
        samples.add(cupy.asnumpy(x).tobytes())
    assert len(samples) == 100


def test_module_functions_use_the_default_generator(rng):
    seed = int(rng.integers(0, 2**63))
    crandom.manual_seed(seed)
    first = cupy.asnumpy(crandom.uniform(0, 1, size=10))
    state = crandom.get_state()
    second = cupy.asnumpy(crandom.normal(size=10))
    crandom.set_state(state)
    np.testing.assert_array_equal(cupy.asnumpy(crandom.normal(size=10)), second)
    crandom.manual_seed(seed)
    np.testing.assert_array_equal(cupy.asnumpy(crandom.uniform(0, 1, size=10)), first)
    assert 0 <= crandom.seed() < 2**64
    ints = cupy.asnumpy(crandom.randint(3, size=1000))
    assert set(np.unique(ints)) == {0, 1, 2}


def test_state_changes_are_refused_during_capture():
    gen = crandom.Generator(7)
    for action in (lambda: gen.manual_seed(1), gen.get_state, lambda: crandom.Generator(3)):
        with pytest.raises(CaptureError, match="during capture"):
            with graph(Graph()):
                action()


def test_bad_arguments_name_the_option():
    gen = crandom.Generator(7)
    with pytest.raises(OptionsError, match="dtype"):
        gen.rand(3, dtype=np.int32)
    with pytest.raises(OptionsError, match="seed"):
        gen.manual_seed(-1)
    with pytest.raises(OptionsError, match="high"):
        gen.randint(5, 5)
    with pytest.raises(OptionsError, match="p"):
        gen.bernoulli(1.5, size=3)


def test_dropout_mask_in_a_captured_mlp_changes_every_replay(randn):
    w = randn((64, 64))
    x = randn((32, 64))
    x @ w
    gen = crandom.Generator(11)
    g = Graph()
    with graph(g):
        h = cupy.maximum(x @ w, 0)
        y = h * gen.bernoulli(0.5, size=h.shape) * 2.0
    masks = set()
    for _ in range(5):
        g.replay()
        masks.add(cupy.asnumpy(y != 0).tobytes())
    assert len(masks) == 5


@pytest.mark.parametrize("mode", ["global", "thread_local"])
def test_default_generator_first_used_inside_a_capture(mode):
    crandom._defaults.clear()  # as in a fresh process: the first draw of the program
    g = Graph()
    with graph(g, capture_error_mode=mode):
        crandom._defaults.clear()  # (prepare_capture may have created it already)
        draws = crandom.rand(1 << 12, dtype=np.float32)
    seen = []
    for _ in range(3):
        g.replay()
        seen.append(cupy.asnumpy(draws))
    assert all(0.0 <= s.min() and s.max() < 1.0 for s in seen)
    assert not np.array_equal(seen[0], seen[1]), "replays repeated their numbers"
    assert abs(float(np.mean(seen[2])) - 0.5) < 0.05
    # The state was written eagerly: the same calls made eagerly from the same seed agree.
    seed = crandom.default_generator().initial_seed()
    eager = crandom.Generator(seed)
    expected = [cupy.asnumpy(eager.rand(1 << 12, dtype=np.float32)) for _ in range(3)]
    for got, want in zip(seen, expected, strict=True):
        np.testing.assert_array_equal(got, want)


# -- RowGenerator: one stream per row ---------------------------------------------------------

def test_row_draws_match_the_numpy_reference(rng):
    seeds = [int(s) for s in rng.integers(0, 2**64, size=5, dtype=np.uint64)]
    rows = crandom.RowGenerator(5, seeds)
    n = 1001  # not a multiple of 4: the last counter's words are partly unused
    first = cupy.asnumpy(rows.uniform(n))
    np.testing.assert_array_equal(first, reference_rows(seeds, [0] * 5, n))
    step = (n + 3) // 4
    assert [s.offset for s in rows.get_state()] == [step] * 5
    noise = cupy.asnumpy(rows.gumbel(n))
    np.testing.assert_allclose(noise, reference_rows(seeds, [step] * 5, n, "gumbel"),
                               rtol=2e-6, atol=2e-6)
    assert first.min() > 0 and first.max() < 1 and np.isfinite(noise).all()
    # Gumbel noise has mean 0.5772 (the Euler-Mascheroni constant) and standard deviation
    # 1.28: over 5,005 draws the mean is within 0.07 of it (3.9 standard errors).
    assert abs(float(noise.mean()) - 0.5772) < 0.07


def test_a_rows_stream_ignores_the_other_rows():
    alone = crandom.RowGenerator(1, [42])
    batched = crandom.RowGenerator(8, [7, 42, 9, 42, 1, 2, 3, 4])
    a = [cupy.asnumpy(alone.gumbel(300)) for _ in range(3)]
    b = [cupy.asnumpy(batched.gumbel(300)) for _ in range(3)]
    for x, y in zip(a, b, strict=True):
        np.testing.assert_array_equal(x[0], y[1])
        np.testing.assert_array_equal(y[1], y[3])  # same seed, same stream
        assert not np.array_equal(y[0], y[1])
    batched.manual_seed([42], rows=[0])  # reseed one row: position 0, the others go on
    np.testing.assert_array_equal(cupy.asnumpy(batched.gumbel(300))[0], a[0][0])


def test_row_draws_in_a_device_loop_are_fresh_every_iteration_and_every_replay():
    rows = crandom.RowGenerator(3, [1, 2, 3])
    out = cupy.zeros((3, 16), dtype=np.float32)
    history = cupy.zeros((6, 3, 16), dtype=np.float32)
    i = cupy.zeros((), dtype=np.int64)

    def body():
        rows.gumbel(16, out=out)
        history[i] = out
        i[...] = i + 1

    g = Graph()
    with graph(g):
        cugraphrt.while_loop(lambda: i < 3, body)
    drawn = []
    for _ in range(2):
        i.fill(0)
        history.fill(0)
        g.replay()
        drawn.append(cupy.asnumpy(history[:3]))
    eager = crandom.RowGenerator(3, [1, 2, 3])
    expected = [cupy.asnumpy(eager.gumbel(16)) for _ in range(6)]
    np.testing.assert_array_equal(np.concatenate(drawn), np.stack(expected))
    assert len({d.tobytes() for d in np.concatenate(drawn)}) == 6  # no draw repeated


def test_row_generator_arguments_are_checked():
    with pytest.raises(OptionsError, match="rows"):
        crandom.RowGenerator(0)
    rows = crandom.RowGenerator(2)
    with pytest.raises(OptionsError, match="seeds"):
        rows.manual_seed([1, 2, 3])
    with pytest.raises(OptionsError, match="seed"):
        rows.manual_seed([1, -2])
    with pytest.raises(OptionsError, match="out"):
        rows.gumbel(8, out=cupy.zeros((2, 9), dtype=np.float32))
    g = Graph()
    with pytest.raises(CaptureError), graph(g):
        rows.manual_seed([1, 2])
