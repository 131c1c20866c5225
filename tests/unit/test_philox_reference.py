"""The NumPy Philox reference against the published known-answer vectors."""

from __future__ import annotations

import numpy as np
import pytest

from cugraphrt._libraries.philox import (
    KERNEL_NAMES,
    KERNEL_SOURCE,
    counters_for,
    philox4x32_10,
    reference_randint,
    reference_rows,
    reference_uniform,
    reference_words,
)

# Random123's known-answer tests for philox4x32, 10 rounds.
KAT = [
    ((0, 0, 0, 0), (0, 0), (0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8)),
    ((0xFFFFFFFF,) * 4, (0xFFFFFFFF, 0xFFFFFFFF),
     (0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD)),
    ((0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344), (0xA4093822, 0x299F31D0),
     (0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1)),
]


@pytest.mark.parametrize("counter,key,expected", KAT)
def test_known_answers(counter, key, expected):
    words = philox4x32_10(np.array([counter]), *key)[0]
    assert tuple(int(w) for w in words) == expected


def test_words_are_positioned_by_counter():
    seed = 0x1234_5678_9ABC_DEF0
    whole = reference_words(seed, 10, 6)
    np.testing.assert_array_equal(whole[2:], reference_words(seed, 12, 4))
    high = reference_words(seed, 2**32 + 5, 1)
    manual = philox4x32_10(np.array([[5, 1, 0, 0]]), seed & 0xFFFFFFFF, seed >> 32)
    np.testing.assert_array_equal(high, manual)


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
def test_uniform_range_and_dtype(dtype):
    u = reference_uniform(99, 0, 10_000, dtype)
    assert u.dtype == np.dtype(dtype) and u.shape == (10_000,)
    assert u.min() >= 0 and u.max() < 1
    assert abs(float(u.astype(np.float64).mean()) - 0.5) < 0.02


def test_randint_range():
    ints = reference_randint(5, 0, 5000, -3, 4)
    assert ints.min() == -3 and ints.max() == 3
    wide = reference_randint(5, 0, 100, 0, 2**40)
    assert wide.max() < 2**40 and wide.max() > 2**32


def test_counters_per_family():
    assert counters_for("u32", 9) == 3 and counters_for("u64", 9) == 5
    assert counters_for("u32", 9, wide=True) == 5


def test_kernel_source_defines_every_kernel():
    for name in KERNEL_NAMES:
        assert f'extern "C" __global__ void {name}(' in KERNEL_SOURCE


def test_row_reference_draws_each_row_from_its_own_seed_and_position():
    both = reference_rows([3, 4], [0, 7], 10)
    np.testing.assert_array_equal(both[0], reference_rows([3], [0], 10)[0])
    np.testing.assert_array_equal(both[1], reference_rows([4], [7], 10)[0])
    # Element i of a row is word i % 4 of counter position + i // 4.
    words = reference_words(4, 7, 3).reshape(-1)[:10]
    expected = ((words >> np.uint32(9)).astype(np.float32) + np.float32(0.5)) \
        * np.float32(2.0**-23)
    np.testing.assert_array_equal(both[1], expected)


def test_row_uniforms_never_reach_0_or_1_and_gumbel_noise_stays_finite():
    u = reference_rows([0, 1, 2], [0, 0, 0], 40_000)
    assert u.min() > 0 and u.max() < 1 and abs(float(u.mean()) - 0.5) < 0.01
    # The extreme words give the extreme values, still inside (0, 1).
    edge = (np.array([0, 0xFFFFFFFF], dtype=np.uint32) >> np.uint32(9)).astype(np.float32)
    edge = (edge + np.float32(0.5)) * np.float32(2.0**-23)
    assert 0 < edge[0] and edge[1] < 1
    g = reference_rows([5], [0], 40_000, "gumbel")
    assert np.isfinite(g).all() and abs(float(g.mean()) - 0.5772) < 0.03


def test_the_public_row_twin_checks_its_arguments():
    from cugraphrt import OptionsError
    from cugraphrt.random import row_draws

    np.testing.assert_array_equal(row_draws([3, 4], [0, 7], 10),
                                  reference_rows([3, 4], [0, 7], 10))
    for kwargs, field in [(dict(kind="normal"), "kind"), (dict(positions=[0]), "positions"),
                          (dict(positions=[0, -1]), "positions"), (dict(seeds=[3, -4]), "seed")]:
        args = dict(seeds=[3, 4], positions=[0, 7], n=10) | kwargs
        with pytest.raises(OptionsError) as info:
            row_draws(**args)
        assert info.value.field == field
