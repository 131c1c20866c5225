"""The hypothesis strategy that draws :class:`~tests.stress._programs.Program` s.

The builder proposes ops family by family (element-wise, reductions, matmul, views, in-place
updates, random draws) and keeps what :func:`~tests.stress._programs.step` accepts; an op it
cannot place becomes a ``neg`` of a recent register, so every draw yields a valid program.
Operands are drawn most-recent-first, so hypothesis shrinks towards short dependency chains.
"""

from __future__ import annotations

import math

from hypothesis import strategies as st

from ._programs import (
    BINARY,
    COMPARE,
    DIMS,
    INPLACE,
    INT_UNARY,
    LOGICAL,
    MAX_ELEMENTS,
    MODES,
    RANDOM,
    REDUCE,
    SCALAR,
    UNARY,
    VIEWS,
    Invalid,
    Meta,
    Op,
    Program,
    broadcast,
    sliced,
    step,
)

DTYPES = ("float32", "float32", "float64", "int32")


@st.composite
def programs(draw, mode: str, max_ops: int = 8) -> Program:
    """Programs of 1 to ``max_ops`` drawn ops (plus their inputs) for one harness ``mode``."""
    if mode not in MODES:
        raise ValueError(f"mode {mode!r} is not one of {MODES}")
    return _Builder(draw, mode, draw(st.sampled_from(DTYPES))).build(draw(st.integers(1, max_ops)))


class _Builder:
    def __init__(self, draw, mode: str, dtype: str) -> None:
        self.draw, self.mode, self.dtype = draw, mode, dtype
        self.is_float = dtype.startswith("float")
        self.bucketed = mode == "buckets"
        self.batch = draw(st.sampled_from((4, 8, 12, 16))) if self.bucketed else 0
        self.inputs: list[tuple] = []
        self.batched: list[bool] = []
        self.ops: list[Op] = []
        self.metas: list[Meta] = []

    # -- drawing helpers -------------------------------------------------------------------

    def choose(self, options):
        return self.draw(st.sampled_from(options))

    def flip(self) -> bool:
        return self.draw(st.booleans())

    def pick_from(self, found: list[int]) -> int | None:
        return found[self.draw(st.integers(0, len(found) - 1))] if found else None

    def pick(self, accept) -> int | None:
        """A register ``accept(meta)`` likes, the most recent first (what shrinking keeps)."""
        return self.pick_from([i for i in reversed(range(len(self.metas)))
                               if accept(self.metas[i])])

    def value(self) -> int:
        found = self.pick(lambda m: m.kind == "v")
        assert found is not None  # register 0 is an input of the program's dtype
        return found

    def shape(self, ndim: int | None = None, limit: int = MAX_ELEMENTS) -> tuple:
        ndim = self.draw(st.integers(1, 3)) if ndim is None else ndim
        dims = [self.choose(DIMS) for _ in range(ndim)]
        while math.prod(dims) > limit:
            dims[dims.index(max(dims))] //= 2
        return tuple(dims)

    def constant(self):
        return self.choose((0.5, -1.5, 2.0, 0.25) if self.is_float else (1, -2, 3))

    def slice_of(self, size: int) -> tuple:
        start = self.draw(st.integers(0, size - 1))
        return (start, self.draw(st.integers(start + 1, size)), self.choose((1, 2)))

    def index_for(self, meta: Meta):
        low = 1 if meta.batched else 0
        return tuple(None if axis < low or self.flip() else self.slice_of(size)
                     for axis, size in enumerate(meta.shape))

    # -- adding ops ------------------------------------------------------------------------

    def _program(self) -> Program:
        return Program(self.dtype, self.mode, tuple(self.inputs), tuple(self.ops), (), 0,
                       tuple(self.batched))

    def valid(self, name: str, args=(), params=()) -> bool:
        try:
            step(self._program(), self.metas, Op(name, tuple(args), tuple(params)))
        except Invalid:
            return False
        return True

    def add(self, name: str, args=(), params=()) -> int | None:
        op = Op(name, tuple(args), tuple(params))
        try:
            meta = step(self._program(), self.metas, op)
        except Invalid:
            return None
        self.ops.append(op)
        self.metas.append(meta)
        return len(self.ops) - 1

    def input(self, shape: tuple, batched: bool = False) -> int:
        self.inputs.append(tuple(shape))
        self.batched.append(batched)
        index = self.add("input", (), (len(self.inputs) - 1,))
        assert index is not None
        return index

    def operand(self, a: int) -> int:
        """A value register that broadcasts with register ``a``: an earlier one, or a new input
        of ``a``'s shape, of its trailing dimensions, or with some dimensions set to 1."""
        m = self.metas[a]
        if self.flip():
            found = self.pick_from([i for i, n in enumerate(self.metas)
                                    if n.kind == "v" and self._broadcasts([m, n])])
            if found is not None:
                return found
        how = self.choose(("same", "trailing", "ones"))
        low = 1 if m.batched else 0
        if how == "trailing" and len(m.shape) > low:
            return self.input(m.shape[self.draw(st.integers(max(low, 1), len(m.shape))):])
        if how == "ones":
            return self.input(tuple(s if axis < low or self.flip() else 1
                                    for axis, s in enumerate(m.shape)), m.batched)
        return self.input(m.shape, m.batched)

    def operand_into(self, region: Meta, base: int, exact: bool = False) -> int:
        """A value register that can be written into ``region`` without aliasing ``base``."""
        def fits(n: Meta) -> bool:
            if n.kind != "v" or n.base == base:
                return False
            if exact:
                return n.shape == region.shape and n.batched == region.batched
            return self._broadcasts([region, n], region.shape, region.batched)

        if self.flip():
            found = self.pick(fits)
            if found is not None:
                return found
        low = 1 if region.batched else 0
        if not exact and self.flip() and len(region.shape) > low:
            return self.input(region.shape[self.draw(st.integers(max(low, 1),
                                                                 len(region.shape))):])
        return self.input(region.shape, region.batched)

    @staticmethod
    def _broadcasts(metas: list[Meta], shape=None, batched=None) -> bool:
        try:
            got = broadcast(metas)
        except Invalid:
            return False
        return shape is None or got == (shape, batched)

    # -- families --------------------------------------------------------------------------

    def elementwise(self) -> int | None:
        kind = self.choose(("unary", "binary", "scalar", "compare", "where", "clip", "cast",
                            "logical"))
        a = self.value()
        if kind == "unary":
            return self.add(self.choose(UNARY if self.is_float else INT_UNARY), (a,))
        if kind == "binary":
            names = BINARY if self.is_float else BINARY[:-1]
            return self.add(self.choose(names), (a, self.operand(a)))
        if kind == "scalar":
            return self.add(self.choose(SCALAR), (a,), (self.constant(),))
        if kind == "clip":
            low = self.choose((-1.0, -0.5, 0.0) if self.is_float else (-3, -1, 0))
            return self.add("clip", (a,), (low, low + self.choose((1, 2, 5))))
        cond = self.condition(a)
        if kind == "where":
            return self.add("where", (cond, a, self.operand(a)))
        if kind == "cast":
            return self.add("cast", (cond,))
        if kind == "logical":
            name = self.choose(LOGICAL)
            if name == "logical_not":
                return self.add(name, (cond,))
            return self.add(name, (cond, self.condition(self.operand(a))))
        return cond

    def condition(self, a: int) -> int:
        name = self.choose(COMPARE)
        made = (self.add(name, (a, self.operand(a))) if self.flip()
                else self.add(name, (a,), (self.constant(),)))
        assert made is not None
        return made

    def reduction(self) -> int | None:
        a = self.pick(lambda m: m.kind == "v" and len(m.shape) >= (2 if m.batched else 1))
        if a is None:
            return None
        m = self.metas[a]
        names = REDUCE if self.is_float else tuple(n for n in REDUCE if n != "mean")
        everything = not m.batched and self.draw(st.integers(0, 2)) == 0
        axis = None if everything else self.draw(st.integers(int(m.batched), len(m.shape) - 1))
        return self.add(self.choose(names), (a,), (axis, self.flip()))

    def matmul(self) -> int | None:
        if not self.is_float:
            return None
        a = self.pick(lambda m: m.kind == "v" and len(m.shape) >= 2)
        if a is None:
            rows = self.batch if self.bucketed else self.choose(DIMS)
            a = self.input((rows, self.choose(DIMS)), self.bucketed)
        m = self.metas[a]
        how = self.choose(("weight", "earlier", "gram"))
        if how == "earlier":
            found = self.pick_from([i for i, n in enumerate(self.metas)
                                    if n.kind == "v" and self.valid("matmul", (a, i))])
            if found is not None:
                return self.add("matmul", (a, found))
        if how == "gram":  # a @ a.T, through a transposed view
            nd = len(m.shape)
            t = self.add("transpose", (a,), (tuple(range(nd - 2)) + (nd - 1, nd - 2),))
            made = None if t is None else self.add("matmul", (a, t))
            if made is not None:
                return made
        return self.add("matmul", (a, self.input((m.shape[-1], self.choose(DIMS)))))

    def view(self) -> int | None:
        a = self.pick(lambda m: m.kind in "vb")
        assert a is not None
        m = self.metas[a]
        nd, low = len(m.shape), int(m.batched)
        name = self.choose(VIEWS) if nd > low else "expand_dims"
        if name == "slice":
            return self.add("slice", (a,), (self.index_for(m),))
        if name == "transpose":
            perm = self.draw(st.permutations(range(low, nd)))
            return self.add("transpose", (a,), (tuple(range(low)) + tuple(perm),))
        if name == "reshape":
            size = math.prod(m.shape[low:])
            cut = self.choose([d for d in range(1, size + 1) if size % d == 0])
            target = (size // cut, cut) if self.flip() else (size,)
            return self.add("reshape", (a,), (((-1,) if m.batched else ()) + target,))
        if name == "broadcast":
            wide = [self.choose((2, 3, 5)) if s == 1 and axis >= low and self.flip() else s
                    for axis, s in enumerate(m.shape)]
            if not m.batched and self.flip():
                wide.insert(0, self.choose((2, 3)))
            if m.batched:
                wide[0] = -1
            if math.prod(abs(s) for s in wide) * (self.batch or 1) > 4 * MAX_ELEMENTS:
                return None
            return self.add("broadcast", (a,), (tuple(wide),))
        return self.add("expand_dims", (a,), (self.draw(st.integers(low, nd)),))

    def inplace(self) -> int | None:
        t = self.pick(lambda m: m.kind == "v" and m.writable)
        if t is None:
            t = self.add(self.choose(INT_UNARY), (self.value(),))  # a fresh, writable result
        assert t is not None
        m = self.metas[t]
        name = self.choose(INPLACE)
        if name == "setitem":
            index = None if not m.shape or self.flip() else self.index_for(m)
            if self.flip():
                return self.add("setitem", (t,), (index, self.constant()))
            region = Meta(sliced(m.shape, index), "v", 0, batched=m.batched)
            return self.add("setitem", (t, self.operand_into(region, m.base)), (index,))
        if name == "iadd":
            return self.add("iadd", (t, self.operand_into(m, m.base)))
        first = self.operand_into(m, m.base, exact=True)
        return self.add("add_out", (first, self.operand_into(m, m.base), t))

    def random(self) -> int | None:
        if not self.is_float or self.bucketed:
            return None
        name = self.choose(RANDOM)
        if name == "dropout":
            return self.add("dropout", (self.value(),), (self.choose((0.1, 0.5)),))
        like = self.pick(lambda m: m.kind in "vb" and len(m.shape) >= 1)
        shape = self.metas[like].shape if like is not None and self.flip() else self.shape()
        if name == "uniform":
            return self.add(name, (), (shape, *self.choose(((-1.0, 1.0), (0.0, 2.0)))))
        if name == "bernoulli":
            return self.add(name, (), (shape, self.choose((0.3, 0.5))))
        return self.add(name, (), (shape,))

    # -- the whole program -----------------------------------------------------------------

    def build(self, count: int) -> Program:
        if self.bucketed:
            rest = self.shape(self.draw(st.integers(0, 2)), MAX_ELEMENTS // self.batch)
            self.input((self.batch, *rest), True)
        else:
            self.input(self.shape())
        families = [self.elementwise, self.elementwise, self.elementwise, self.reduction,
                    self.view, self.view, self.inplace]
        if self.is_float:
            families += [self.matmul, self.random] if not self.bucketed else [self.matmul]
        for _ in range(count):
            # A family that cannot place an op here (no register fits) gets one more try.
            if self.choose(families)() is None and self.choose(families)() is None:
                self.add("neg", (self.value(),))
        stages = self.stages() if self.mode == "shared_pool" else ()
        if not any(op.name != "input" and op.name not in VIEWS for op in self.ops):
            self.add("neg", (self.value(),))  # a graph of views alone would be empty
        outputs = self.outputs()
        buckets, sizes = self.bucket_plan()
        return Program(self.dtype, self.mode, tuple(self.inputs), tuple(self.ops), outputs,
                       self.draw(st.integers(0, 2**32 - 1)), tuple(self.batched), stages,
                       buckets, sizes, len(sizes) if sizes else 3)

    def kernels(self) -> list[int]:
        return [i for i, op in enumerate(self.ops) if op.name != "input" and op.name not in VIEWS]

    def stages(self) -> tuple:
        """Where the second and third graphs begin: each graph gets a kernel of its own."""
        wanted = self.draw(st.integers(2, 3))
        while len(self.kernels()) < wanted:
            self.add("neg", (self.value(),))
        starts = self.draw(st.sets(st.sampled_from(self.kernels()[1:]), min_size=wanted - 1,
                                   max_size=wanted - 1))
        return tuple(sorted(starts))

    def outputs(self) -> tuple:
        usable = [i for i, m in enumerate(self.metas) if m.kind in "vb"
                  and self.ops[i].name != "input" and (m.batched or not self.bucketed)]
        if not usable:
            made = self.add("neg", (0,))
            assert made is not None
            usable = [made]
        chosen = {usable[-1]}
        for _ in range(self.draw(st.integers(0, 2))):
            chosen.add(self.choose(usable))
        for op in self.ops:  # what the updates wrote, and every draw (checked for freshness)
            target = op.args[2 if op.name == "add_out" else 0] if op.name in INPLACE else None
            if target is not None and (self.metas[target].batched or not self.bucketed):
                chosen.add(target)
        chosen.update(i for i, op in enumerate(self.ops) if op.name in ("uniform", "normal"))
        return tuple(sorted(chosen))

    def bucket_plan(self) -> tuple:
        if not self.bucketed:
            return None, ()
        if self.flip():
            buckets: object = "pow2"
        else:
            extra = self.draw(st.sets(st.integers(1, self.batch - 1), max_size=2))
            buckets = tuple(sorted(extra | {self.batch}))
        sizes = tuple(self.draw(st.integers(1, self.batch)) for _ in range(4))
        return buckets, sizes
