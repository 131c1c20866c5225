"""The small pytree used for graphed callables' inputs and outputs."""

from __future__ import annotations

from collections import namedtuple

from hypothesis import given
from hypothesis import strategies as st

from cugraphrt._tree import flatten, leaves_of, unflatten

Pair = namedtuple("Pair", "a b")

values = st.recursive(
    st.integers() | st.text(max_size=3) | st.none(),
    lambda children: st.lists(children, max_size=3)
    | st.lists(children, max_size=3).map(tuple)
    | st.dictionaries(st.text(max_size=2), children, max_size=3),
    max_leaves=12,
)


@given(values)
def test_flatten_unflatten_roundtrip(value):
    leaves, spec, paths = flatten(value, "args")
    assert unflatten(spec, leaves) == value
    assert list(leaves_of(value)) == leaves
    assert len(paths) == len(leaves) == spec.num_leaves


def test_paths_name_each_leaf():
    _, _, paths = flatten(((1, {"w": 2, "b": [3, 4]}),), "args")
    assert paths == ["args[0][0]", "args[0][1]['w']", "args[0][1]['b'][0]",
                     "args[0][1]['b'][1]"]


def test_structure_equality_ignores_leaf_values():
    _, s1, _ = flatten((1, [2, 3], {"k": 4}))
    _, s2, _ = flatten(("a", ["b", "c"], {"k": None}))
    _, s3, _ = flatten((1, (2, 3), {"k": 4}))
    assert s1 == s2 and hash(s1) == hash(s2)
    assert s1 != s3
    assert s1.describe() == "(*, [*, *], {'k': *})"


def test_named_tuples_keep_their_type():
    leaves, spec, _ = flatten(Pair(1, (2, 3)))
    rebuilt = unflatten(spec, leaves)
    assert isinstance(rebuilt, Pair) and rebuilt == Pair(1, (2, 3))


def test_flat_tuple_detection():
    assert flatten((1, 2, 3))[1].is_flat_tuple
    assert not flatten((1, (2,)))[1].is_flat_tuple
    assert not flatten([1, 2])[1].is_flat_tuple
