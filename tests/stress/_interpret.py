"""The interpreter of generated programs and its backends: NumPy, CuPy and torch.

One interpreter (:func:`apply`, :class:`Machine`) runs a :class:`~tests.stress._programs.Program`
on any backend, so the ops that run under capture and the ops of the eager reference are the
same ops. NumPy (and torch on the CPU) stand in for the GPU in the unit tests.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ._programs import BINARY, COMPARE, LOGICAL, RANDOM, REDUCE, UNARY, Program


def _index(index) -> tuple:
    if index is None:
        return (Ellipsis,)
    return tuple(slice(None) if part is None else slice(*part) for part in index)


class ArrayBackend:
    """NumPy, or an array module with NumPy's API (CuPy: :class:`CupyBackend`)."""

    name = "numpy"

    def __init__(self, xp=np) -> None:
        self.xp = xp
        self.rng = np.random.default_rng(0)

    # -- the harness's needs ---------------------------------------------------------------

    def manual_seed(self, seed: int) -> None:
        self.rng = np.random.default_rng(seed)

    def from_host(self, array: np.ndarray):
        return self.xp.array(array)

    def to_host(self, value) -> np.ndarray:
        return np.array(value, copy=True)

    def copy_into(self, static, array: np.ndarray) -> None:
        static[...] = array

    def warm_up(self, run) -> None:
        run()

    # -- ops -------------------------------------------------------------------------------

    def unary(self, name: str, x):
        xp = self.xp
        if name == "neg":
            return -x
        if name == "square":
            return x * x
        if name == "sqrt1":
            return xp.sqrt(xp.abs(x) + 1)
        if name == "log1p":
            return xp.log1p(xp.abs(x))
        if name == "expneg":
            return xp.exp(-xp.abs(x))
        return getattr(xp, name)(x)  # abs, sin, cos, tanh

    def binary(self, name: str, a, b):
        if name in ("maximum", "minimum"):
            return getattr(self.xp, name)(a, b)
        if name == "div":
            return a / (b * b + 1)
        if name == "add":
            return a + b
        return a - b if name == "sub" else a * b

    def logical(self, name: str, *args):
        return getattr(self.xp, name)(*args)

    def where(self, c, a, b):
        return self.xp.where(c, a, b)

    def clip(self, x, low, high):
        return self.xp.clip(x, low, high)

    def cast(self, x, dtype: str):
        return x.astype(dtype)

    def reduce(self, name: str, x, axis, keepdims: bool, dtype: str):
        return getattr(self.xp, name)(x, axis=axis, keepdims=keepdims).astype(dtype, copy=False)

    def transpose(self, x, perm):
        return x.transpose(perm)

    def broadcast(self, x, shape):
        shape = tuple(x.shape[0] if s == -1 else s for s in shape)
        return self.xp.broadcast_to(x, shape)

    def expand_dims(self, x, axis: int):
        return self.xp.expand_dims(x, axis)

    def setitem(self, target, index: tuple, value) -> None:
        target[index] = value

    def iadd(self, target, value) -> None:
        self.xp.add(target, value, out=target)

    def add_out(self, a, b, target) -> None:
        self.xp.add(a, b, out=target)

    def draw(self, name: str, params: tuple, dtype: str):
        shape = params[0]
        if name == "uniform":
            return self.rng.uniform(params[1], params[2], shape).astype(dtype)
        if name == "normal":
            return self.rng.standard_normal(shape).astype(dtype)
        return (self.rng.random(shape) < params[1]).astype(dtype)

    def dropout(self, x, p: float, dtype: str):
        return x * self.draw("bernoulli", (x.shape, 1 - p), dtype) / (1 - p)

    def wrap(self, value):
        # NumPy turns 0-d results into scalars; registers must stay (writable) arrays.
        return value if isinstance(value, self.xp.ndarray) else self.xp.asarray(value)


class CupyBackend(ArrayBackend):
    """CuPy arrays; random draws from a ``cugraphrt.random.Generator``."""

    name = "cupy"

    def __init__(self) -> None:
        import cupy

        super().__init__(cupy)
        self.generator: Any = None  # a cugraphrt.random.Generator, made by manual_seed

    def manual_seed(self, seed: int) -> None:
        if self.generator is None:
            import cugraphrt.random

            self.generator = cugraphrt.random.Generator(seed)
        self.generator.manual_seed(seed)

    def from_host(self, array: np.ndarray):
        return self.xp.asarray(array)

    def to_host(self, value) -> np.ndarray:
        return self.xp.asnumpy(value)

    def copy_into(self, static, array: np.ndarray) -> None:
        static.set(array)

    def draw(self, name: str, params: tuple, dtype: str):
        gen, shape = self.generator, params[0]
        if name == "uniform":
            return gen.uniform(params[1], params[2], size=shape, dtype=dtype)
        if name == "normal":
            return gen.normal(0.0, 1.0, size=shape, dtype=dtype)
        return gen.bernoulli(params[1], size=shape, dtype=dtype)


class TorchBackend(ArrayBackend):
    """Torch tensors on ``device``; random draws from torch's default generator."""

    name = "torch"

    def __init__(self, device: str = "cuda") -> None:
        import torch

        super().__init__(torch)
        self.torch, self.device = torch, torch.device(device)

    def manual_seed(self, seed: int) -> None:
        self.torch.manual_seed(seed)

    def from_host(self, array: np.ndarray):
        return self.torch.tensor(array, device=self.device)

    def to_host(self, value) -> np.ndarray:
        if self.device.type == "cuda":
            self.torch.cuda.synchronize()  # replays run on CuPy's current stream
        return value.detach().cpu().numpy().copy()

    def copy_into(self, static, array: np.ndarray) -> None:
        static.copy_(self.torch.from_numpy(array))

    def warm_up(self, run) -> None:
        if self.device.type != "cuda":
            return run()
        import cugraphrt_torch.capture._torch as _torch

        import cugraphrt

        # On the capture stream: cuBLAS workspaces are per stream, and one made during the
        # capture would stay in the graph's pool.
        torch = self.torch
        stream = _torch.torch_stream_for(cugraphrt.default_capture_stream().ptr,
                                         self.device.index or 0)
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            run()
        torch.cuda.current_stream().wait_stream(stream)

    def dtype(self, name: str):
        return getattr(self.torch, name)

    def clip(self, x, low, high):
        return self.torch.clamp(x, low, high)

    def cast(self, x, dtype: str):
        return x.to(self.dtype(dtype))

    def reduce(self, name: str, x, axis, keepdims: bool, dtype: str):
        torch = self.torch
        reducer = {"sum": torch.sum, "mean": torch.mean, "max": torch.amax, "min": torch.amin}
        dims = tuple(range(x.ndim)) if axis is None else axis
        return reducer[name](x, dim=dims, keepdim=keepdims).to(self.dtype(dtype))

    def transpose(self, x, perm):
        return x.permute(*perm)

    def broadcast(self, x, shape):
        return x.expand(*shape)

    def expand_dims(self, x, axis: int):
        return x.unsqueeze(axis)

    def setitem(self, target, index: tuple, value) -> None:
        if isinstance(value, (int, float)):
            # torch writes a Python scalar through a host tensor (a pageable host-to-device
            # copy, which torch refuses during a capture, as torch.cuda.graph does): fill the
            # view on the device instead, as code meant for capture does.
            target[index].fill_(value)
        else:
            target[index] = value

    def iadd(self, target, value) -> None:
        target.add_(value)

    def add_out(self, a, b, target) -> None:
        self.torch.add(a, b, out=target)

    def draw(self, name: str, params: tuple, dtype: str):
        torch, shape = self.torch, tuple(params[0])
        kind = dict(device=self.device, dtype=self.dtype(dtype))
        if name == "uniform":
            return torch.rand(shape, **kind) * (params[2] - params[1]) + params[1]
        if name == "normal":
            return torch.randn(shape, **kind)
        return (torch.rand(shape, **kind) < params[1]).to(kind["dtype"])

    def dropout(self, x, p: float, dtype: str):
        return self.torch.nn.functional.dropout(x, p, training=True)

    def wrap(self, value):
        return value


def apply(backend, op, args: list, dtype: str, inputs: tuple):
    """The value of ``op`` (None for an in-place op, which writes into its target)."""
    name, p = op.name, op.params
    if name == "input":
        return inputs[p[0]]
    if name in ("setitem", "iadd", "add_out"):
        if name == "setitem":
            backend.setitem(args[0], _index(p[0]), args[1] if len(args) == 2 else p[1])
        else:
            getattr(backend, name)(*args)
        return None
    if name in UNARY:
        value = backend.unary(name, args[0])
    elif name in BINARY:
        value = backend.binary(name, args[0], args[1] if len(args) == 2 else p[0])
    elif name in COMPARE:
        a, b = args[0], args[1] if len(args) == 2 else p[0]
        value = a > b if name == "greater" else a < b if name == "less" else a == b
    elif name in LOGICAL:
        value = backend.logical(name, *args)
    elif name in REDUCE:
        value = backend.reduce(name, args[0], *p, dtype)
    elif name in RANDOM:
        value = (backend.dropout(args[0], p[0], dtype) if name == "dropout"
                 else backend.draw(name, p, dtype))
    elif name == "matmul":
        value = args[0] @ args[1]
    elif name == "slice":
        value = args[0][_index(p[0])]
    elif name == "reshape":
        value = args[0].reshape(p[0])
    elif name == "clip":
        value = backend.clip(args[0], *p)
    elif name == "cast":
        value = backend.cast(args[0], dtype)
    elif name == "where":
        value = backend.where(*args)
    else:  # transpose, broadcast, expand_dims: one parameter each
        value = getattr(backend, name)(args[0], p[0])
    return backend.wrap(value)


class Machine:
    """Registers of one run of a program; each register is dropped after its last reader,
    so under capture its memory is freed mid-capture and reused, as real code does."""

    def __init__(self, program: Program, backend, inputs) -> None:
        self.program, self.backend, self.inputs = program, backend, tuple(inputs)
        self.values: list = [None] * len(program.ops)
        self._frees: list[list[int]] = [[] for _ in program.ops]
        last = {i: i for i in range(len(program.ops)) if i not in program.outputs}
        last.update(program.last_uses())
        for register, index in last.items():
            self._frees[index].append(register)

    def run(self, start: int = 0, stop: int | None = None) -> Machine:
        ops, dtype = self.program.ops, self.program.dtype
        for index in range(start, len(ops) if stop is None else stop):
            op = ops[index]
            args = [self.values[a] for a in op.args]
            self.values[index] = apply(self.backend, op, args, dtype, self.inputs)
            for register in self._frees[index]:
                self.values[register] = None
        return self

    def outputs(self) -> tuple:
        return tuple(self.values[o] for o in self.program.outputs)
