"""Generated programs: a small op-list language, its shape rules, and a hypothesis strategy.

A :class:`Program` is a list of :class:`Op` whose results are numbered registers (op ``i``
writes register ``i``; an in-place op writes into an earlier register and leaves its own
empty). The same program runs eagerly and under capture on any backend of ``_interpret``
(NumPy, CuPy, torch), so a graph's replays can be compared with eager runs of the very same
ops. Its ``repr`` is valid Python: a failing program printed by a test can be pasted back.

Shapes, kinds and aliasing are checked by :func:`step`, the single source of truth for what
is valid; the generator (:func:`programs`) proposes ops and keeps those ``step`` accepts.
In bucket mode a register may be *batched* (its dimension 0 is the bucket dimension); the
rules then forbid every op that mixes rows, so padding a call to its bucket is exact.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

MODES = ("graph", "graphed", "buckets", "shared_pool")
UNARY = ("neg", "abs", "square", "sin", "cos", "tanh", "sqrt1", "log1p", "expneg")
INT_UNARY = ("neg", "abs", "square")
BINARY = ("add", "sub", "mul", "maximum", "minimum", "div")
SCALAR = ("add", "sub", "mul")
COMPARE = ("greater", "less", "equal")
LOGICAL = ("logical_and", "logical_or", "logical_xor", "logical_not")
REDUCE = ("sum", "mean", "max", "min")
VIEWS = ("slice", "transpose", "reshape", "broadcast", "expand_dims")
INPLACE = ("setitem", "iadd", "add_out")
RANDOM = ("uniform", "normal", "bernoulli", "dropout")
FAMILIES = {
    **{n: "elementwise" for n in UNARY + BINARY + COMPARE + LOGICAL + ("where", "clip", "cast")},
    **{n: "reduction" for n in REDUCE}, "matmul": "matmul", **{n: "view" for n in VIEWS},
    **{n: "in-place" for n in INPLACE}, **{n: "random" for n in RANDOM}, "input": "input",
}
#: Sizes the generator draws dimensions from (hypothesis shrinks towards the first).
DIMS = (1, 2, 3, 4, 5, 7, 8, 16, 31, 64)
MAX_ELEMENTS = 4096


@dataclass(frozen=True)
class Op:
    """One instruction: ``name`` applied to registers ``args`` with static ``params``."""

    name: str
    args: tuple = ()
    params: tuple = ()

    def __repr__(self) -> str:
        return f"Op({self.name!r}, {self.args!r}, {self.params!r})"


@dataclass(frozen=True)
class Program:
    """A generated program and how a test runs it (see the module docstring).

    ``inputs`` are the shapes of the input arrays (op ``input`` reads one), ``batched`` says
    which have the bucket dimension (bucket mode), ``stages`` are the op indices where a new
    graph of the shared pool begins, ``sizes`` the batch size of each call in bucket mode,
    ``seed`` seeds the input data and the random draws.
    """

    dtype: str
    mode: str
    inputs: tuple
    ops: tuple
    outputs: tuple
    seed: int
    batched: tuple = ()
    stages: tuple = ()
    buckets: object = None
    sizes: tuple = ()
    rounds: int = 3

    @property
    def is_float(self) -> bool:
        return self.dtype.startswith("float")

    def metas(self) -> list[Meta]:
        """Every register's meta, as :func:`step` infers it."""
        metas: list[Meta] = []
        for op in self.ops:
            metas.append(step(self, metas, op))
        return metas

    def stage_ranges(self) -> list[tuple[int, int]]:
        bounds = (0, *self.stages, len(self.ops))
        return list(zip(bounds[:-1], bounds[1:], strict=True))

    def kernel_ops(self) -> int:
        return sum(1 for op in self.ops if op.name != "input" and op.name not in VIEWS)

    def families(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for op in self.ops:
            if op.name != "input":
                counts[FAMILIES[op.name]] = counts.get(FAMILIES[op.name], 0) + 1
        return counts

    def last_uses(self) -> dict[int, int]:
        """Register -> the last op reading it, for registers that are not outputs."""
        last: dict[int, int] = {}
        for index, op in enumerate(self.ops):
            for arg in op.args:
                last[arg] = index
        return {r: i for r, i in last.items() if r not in self.outputs}

    def fresh_draws(self) -> list[int]:
        """Outputs that hold a uniform or normal draw nothing writes to afterwards."""
        metas = self.metas()
        written = {metas[op.args[0 if op.name != "add_out" else 2]].base
                   for op in self.ops if op.name in INPLACE}
        return [o for o in self.outputs
                if self.ops[o].name in ("uniform", "normal") and o not in written]


@dataclass(frozen=True)
class Meta:
    """What the generator knows of a register: shape, kind ('v' the program's dtype, 'b' bool,
    '-' empty), the register whose memory it aliases, and whether it may be written."""

    shape: tuple
    kind: str
    base: int
    writable: bool = False
    batched: bool = False


class Invalid(ValueError):
    """An op that the shape, kind or aliasing rules refuse."""


def _check(condition: bool, why: str) -> None:
    if not condition:
        raise Invalid(why)


def broadcast(metas: list[Meta]) -> tuple[tuple, bool]:
    """The broadcast shape of ``metas`` and whether it is batched (rows never mix)."""
    ndim = max(len(m.shape) for m in metas)
    shape = []
    for axis in range(ndim):
        sizes = {m.shape[axis - ndim + len(m.shape)] for m in metas
                 if axis - ndim + len(m.shape) >= 0} - {1}
        _check(len(sizes) <= 1, "shapes do not broadcast")
        shape.append(sizes.pop() if sizes else 1)
    batched = any(m.batched for m in metas)
    for m in metas if batched else ():
        if m.batched:
            _check(len(m.shape) == ndim, "a batched operand would not keep its rows first")
        else:
            _check(len(m.shape) < ndim or m.shape[0] == 1, "an unbatched operand spans rows")
    return tuple(shape), batched


def sliced(shape: tuple, index) -> tuple:
    if index is None:
        return shape
    _check(len(index) == len(shape), "one slice per dimension")
    out = []
    for size, part in zip(shape, index, strict=True):
        _check(part is None or (0 <= part[0] < part[1] <= size and part[2] >= 1), "bad slice")
        out.append(size if part is None else len(range(*part)))
    return tuple(out)


def _value(m: Meta) -> None:
    _check(m.kind == "v", "needs a value register")


def step(program: Program, metas: list[Meta], op: Op) -> Meta:
    """The meta of ``op``'s result, or :class:`Invalid`."""
    index = len(metas)
    args = [metas[a] for a in op.args]
    _check(all(0 <= a < index for a in op.args), "arguments must be earlier registers")
    name, p = op.name, op.params
    fresh: dict[str, Any] = dict(kind="v", base=index, writable=True)
    if name == "input":
        batched = bool(program.batched and program.batched[p[0]])
        return Meta(tuple(program.inputs[p[0]]), "v", index, False, batched)
    if name in UNARY:
        _value(args[0])
        _check(program.is_float or name in INT_UNARY, "float-only unary op")
        return Meta(args[0].shape, batched=args[0].batched, **fresh)
    if name in BINARY + COMPARE:
        for m in args:
            _value(m)
        _check(len(args) == 2 or (len(p) == 1 and name in SCALAR + COMPARE), "operands")
        _check(name != "div" or program.is_float, "div is for floats")
        shape, batched = broadcast(args)
        kind = "b" if name in COMPARE else "v"
        return Meta(shape, kind, index, True, batched)
    if name in LOGICAL:
        _check(all(m.kind == "b" for m in args), "logical ops take bools")
        _check(len(args) == (1 if name == "logical_not" else 2), "operands")
        shape, batched = broadcast(args)
        return Meta(shape, "b", index, True, batched)
    if name == "where":
        _check(args[0].kind == "b", "a bool condition")
        _value(args[1])
        _value(args[2])
        shape, batched = broadcast(args)
        return Meta(shape, batched=batched, **fresh)
    if name == "clip":
        _value(args[0])
        _check(p[0] < p[1], "clip bounds")
        return Meta(args[0].shape, batched=args[0].batched, **fresh)
    if name == "cast":
        _check(args[0].kind == "b", "cast takes a bool")
        return Meta(args[0].shape, batched=args[0].batched, **fresh)
    if name in REDUCE:
        return _reduce(program, args[0], name, p, fresh)
    if name == "matmul":
        return _matmul(program, args, fresh)
    if name in VIEWS:
        return _view(args[0], name, p)
    if name in INPLACE:
        return _inplace(program, args, name, p, index)
    if name in RANDOM:
        _check(program.is_float and program.mode != "buckets", "draws: float, not bucketed")
        if name == "dropout":
            _value(args[0])
            _check(0 < p[0] < 1, "dropout probability")
            return Meta(args[0].shape, **fresh)
        shape = tuple(p[0])
        _check(len(shape) >= 1 and math.prod(shape) >= 1, "draw shape")
        return Meta(shape, **fresh)
    raise Invalid(f"unknown op {name!r}")


def _reduce(program: Program, m: Meta, name: str, p: tuple, fresh: dict) -> Meta:
    _value(m)
    axis, keepdims = p
    _check(len(m.shape) >= 1, "reduce an array of at least one dimension")
    _check(name != "mean" or program.is_float, "mean is for floats")
    _check(axis is None or 0 <= axis < len(m.shape), "axis")
    _check(not m.batched or (axis is not None and axis > 0), "a reduction over rows")
    axes = range(len(m.shape)) if axis is None else (axis,)
    shape = tuple(1 if a in axes else s for a, s in enumerate(m.shape) if keepdims or a not in axes)
    return Meta(shape, batched=m.batched, **fresh)


def _matmul(program: Program, args: list[Meta], fresh: dict) -> Meta:
    a, b = args
    _value(a)
    _value(b)
    _check(program.is_float, "matmul is for floats (torch has no integer matmul on CUDA)")
    _check(len(a.shape) >= 2 and len(b.shape) >= 2, "matmul of matrices")
    _check(a.shape[-1] == b.shape[-2], "inner dimensions")
    batch, _ = broadcast([Meta(a.shape[:-2] or (1,), "v", 0), Meta(b.shape[:-2] or (1,), "v", 0)])
    shape = (*batch, a.shape[-2], b.shape[-1])[-max(len(a.shape), len(b.shape)):]
    batched = a.batched or b.batched
    for m, is_b in ((a, False), (b, True)):
        if m.batched:
            _check(len(m.shape) == len(shape) and not (is_b and len(m.shape) == 2), "rows mix")
        elif batched:  # its batch dimensions, if any, must not meet the rows
            _check(len(m.shape) == 2 or len(m.shape) < len(shape) or m.shape[0] == 1,
                   "an unbatched operand spans rows")
    return Meta(shape, batched=batched, **fresh)


def _view(m: Meta, name: str, p: tuple) -> Meta:
    view: dict[str, Any] = dict(kind=m.kind, base=m.base, batched=m.batched)
    _check(m.kind in "vb", "a view of an array")
    if name == "slice":
        _check(not m.batched or p[0][0] is None, "slicing rows")
        return Meta(sliced(m.shape, p[0]), writable=m.writable, **view)
    if name == "transpose":
        _check(sorted(p[0]) == list(range(len(m.shape))), "a permutation")
        _check(not m.batched or p[0][0] == 0, "rows stay first")
        return Meta(tuple(m.shape[a] for a in p[0]), writable=m.writable, **view)
    if name == "reshape":
        target = tuple(p[0])
        rows = m.shape[0] if m.batched else None
        _check((target[:1] == (-1,)) == m.batched and -1 not in target[1:], "reshape target")
        shape = (rows, *target[1:]) if m.batched else target
        _check(math.prod(shape) == math.prod(m.shape), "reshape keeps the size")
        # Never written through: a reshape is a view or a copy depending on strides, which
        # differ between a call's size and its bucket's.
        return Meta(shape, writable=False, **view)
    if name == "broadcast":
        target = tuple(p[0])
        _check((target[:1] == (-1,)) == m.batched and len(target) >= len(m.shape), "target")
        _check(not m.batched or len(target) == len(m.shape), "rows stay first")
        shape = (m.shape[0], *target[1:]) if m.batched else target
        tail = shape[len(shape) - len(m.shape):]
        _check(all(s in (1, t) for s, t in zip(m.shape, tail, strict=True)), "broadcastable")
        return Meta(shape, writable=False, **view)
    axis = p[0]  # expand_dims
    _check(0 <= axis <= len(m.shape) and (not m.batched or axis >= 1), "expand_dims axis")
    return Meta((*m.shape[:axis], 1, *m.shape[axis:]), writable=m.writable, **view)


def _inplace(program: Program, args: list[Meta], name: str, p: tuple, index: int) -> Meta:
    target = args[2] if name == "add_out" else args[0]
    sources = args[:2] if name == "add_out" else args[1:]
    _check(target.kind == "v" and target.writable, "a writable value register")
    for m in sources:
        _value(m)
        _check(m.base != target.base, "a source aliasing the target")
    region = Meta(sliced(target.shape, p[0] if name == "setitem" else None), "v", 0,
                  batched=target.batched)
    _check(not (target.batched and name == "setitem" and p[0] and p[0][0] is not None),
           "slicing rows")
    if sources:
        shape, batched = broadcast([region, *sources] if name != "add_out" else sources)
        _check(shape == region.shape and batched == region.batched, "fits the target")
    else:
        _check(name == "setitem" and len(p) == 2, "a scalar to set")
    return Meta((), "-", index)
