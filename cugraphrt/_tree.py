"""Flattening nested tuples, lists and dicts into leaves and back (a small pytree).

Shared by :func:`cugraphrt.make_graphed` and the torch adapter. Leaves are everything that
is not a tuple, list or dict (named tuples count as tuples and keep their type). Each leaf
gets a path such as ``args[1]['w']`` for error messages.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

__all__ = ["TreeSpec", "flatten", "unflatten", "LEAF"]


class TreeSpec:
    """The structure of a nested value, without its leaves. Equal structures compare equal."""

    __slots__ = ("kind", "type", "keys", "children", "num_leaves", "_key")

    def __init__(self, kind: str, typ: type | None, keys: tuple, children: tuple) -> None:
        self.kind = kind
        self.type = typ
        self.keys = keys
        self.children = children
        self.num_leaves = 1 if kind == "leaf" else sum(c.num_leaves for c in children)
        self._key = (kind, typ, keys, tuple(c._key for c in children))

    def __eq__(self, other: object) -> bool:
        return isinstance(other, TreeSpec) and self._key == other._key

    def __hash__(self) -> int:
        return hash(self._key)

    @property
    def is_flat_tuple(self) -> bool:
        """A plain tuple whose every child is a leaf (the common ``*args`` case)."""
        return self.kind == "tuple" and self.type is tuple and all(
            c.kind == "leaf" for c in self.children)

    def describe(self) -> str:
        """A short rendering of the structure, leaves shown as ``*``."""
        if self.kind == "leaf":
            return "*"
        inner = [c.describe() for c in self.children]
        if self.kind == "dict":
            pairs = zip(self.keys, inner, strict=False)
            return "{" + ", ".join(f"{k!r}: {v}" for k, v in pairs) + "}"
        if self.kind == "list":
            return "[" + ", ".join(inner) + "]"
        return "(" + ", ".join(inner) + ("," if len(inner) == 1 else "") + ")"

    def __repr__(self) -> str:
        return f"TreeSpec({self.describe()})"


LEAF = TreeSpec("leaf", None, (), ())


def flatten(value: Any, prefix: str = "") -> tuple[list, TreeSpec, list[str]]:
    """Split ``value`` into its leaves, its structure and each leaf's path.

    Parameters
    ----------
    value : Any
        Nested tuples, lists and dicts (dict keys in insertion order).
    prefix : str
        Path prefix, e.g. ``"args"``.

    Returns
    -------
    leaves : list
    spec : TreeSpec
    paths : list of str
    """
    leaves: list = []
    paths: list[str] = []
    spec = _flatten(value, prefix, leaves, paths)
    return leaves, spec, paths


def _flatten(value: Any, path: str, leaves: list, paths: list[str]) -> TreeSpec:
    if isinstance(value, dict):
        keys = tuple(value.keys())
        children = tuple(_flatten(value[k], f"{path}[{k!r}]", leaves, paths) for k in keys)
        return TreeSpec("dict", type(value), keys, children)
    if isinstance(value, (tuple, list)):
        kind = "list" if isinstance(value, list) else "tuple"
        children = tuple(
            _flatten(v, f"{path}[{i}]", leaves, paths) for i, v in enumerate(value))
        return TreeSpec(kind, type(value), (), children)
    leaves.append(value)
    paths.append(path or "value")
    return LEAF


def leaves_of(value: Any) -> Iterator[Any]:
    """The leaves of ``value`` in flatten order, without building a spec."""
    if isinstance(value, dict):
        for v in value.values():
            yield from leaves_of(v)
    elif isinstance(value, (tuple, list)):
        for v in value:
            yield from leaves_of(v)
    else:
        yield value


def unflatten(spec: TreeSpec, leaves: list | tuple) -> Any:
    """Rebuild a value of structure ``spec`` from ``leaves`` (the inverse of flatten)."""
    iterator = iter(leaves)
    return _build(spec, iterator.__next__)


def _build(spec: TreeSpec, take: Callable[[], Any]) -> Any:
    if spec.kind == "leaf":
        return take()
    children = [_build(c, take) for c in spec.children]
    typ = spec.type
    assert typ is not None  # only a leaf has no type
    if spec.kind == "dict":
        return typ(zip(spec.keys, children, strict=False))
    if spec.kind == "list":
        return typ(children) if typ is not list else children
    if typ is tuple:
        return tuple(children)
    if hasattr(typ, "_fields"):  # named tuple
        return typ(*children)
    return typ(children)
