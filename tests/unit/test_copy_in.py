"""CopyIn, the usual load step, and the leaf splitter it shares with RebindIn (GPU-free: a
numpy framework whose "device addresses" are numpy's data pointers)."""

from __future__ import annotations

import numpy as np
import pytest

from cugraphrt._callables.call_path import CopyIn, Mismatch, check_constants, split_leaves


class NumpyFramework:
    array_type = np.ndarray

    @staticmethod
    def signature(array):
        return (array.shape, array.dtype)

    @staticmethod
    def address(array):
        return array.__array_interface__["data"][0]

    @staticmethod
    def same_layout(a, b):
        return a.strides == b.strides

    @staticmethod
    def copy(dst, src):
        np.copyto(dst, src)

    @staticmethod
    def clone(array):
        return np.ascontiguousarray(array).copy()


def test_split_leaves_keeps_order_and_places():
    x, y = np.zeros(3), np.ones((2, 2))
    arrays, constants = split_leaves(NumpyFramework, [x, 7, y, "mode"],
                                     ["args[0]", "args[1]", "args[2]", "args[3]"])
    assert [(i, path) for i, _, path in arrays] == [(0, "args[0]"), (2, "args[2]")]
    assert arrays[0][1] is x and arrays[1][1] is y
    assert constants == ((1, 7, "args[1]"), (3, "mode", "args[3]"))
    with pytest.raises(ValueError):  # one path per leaf
        split_leaves(NumpyFramework, [x, y], ["args[0]"])


def test_copy_in_copies_new_arrays_and_checks_everything_else():
    static = np.zeros(4)
    load = CopyIn(NumpyFramework, [static, 2.0], ["args[0]", "args[1]"])
    fresh = np.arange(4.0)
    load([fresh, 2.0])
    np.testing.assert_array_equal(static, fresh)  # copied into the captured buffer
    load([static, 2.0])  # the static input itself: nothing to copy
    with pytest.raises(Mismatch) as info:
        load([np.arange(5.0), 2.0])  # another shape
    assert info.value.index == 0
    with pytest.raises(Mismatch) as info:
        load([fresh, 3.0])  # a constant the graph was captured with, changed
    assert info.value.index == 1 and info.value.static == 2.0 and info.value.value == 3.0


def test_the_static_buffer_laid_out_anew_is_copied_through_a_clone():
    static = np.zeros((3, 3))
    load = CopyIn(NumpyFramework, [static], ["args[0]"])
    transposed = static.T  # same address and shape, other strides
    static[:] = np.arange(9.0).reshape(3, 3)
    load([transposed])
    np.testing.assert_array_equal(static, np.arange(9.0).reshape(3, 3).T)


def test_check_constants_names_the_first_unequal_one():
    check_constants([(1, 4, "args[1]"), (2, "a", "args[2]")], [None, 4, "a"])
    with pytest.raises(Mismatch) as info:
        check_constants([(1, 4, "args[1]"), (2, "a", "args[2]")], [None, 5, "b"])
    assert info.value.index == 1
