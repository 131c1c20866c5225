"""Argument and output plans of graphed callables: flattening decided once, at capture.

A call of a graphed callable must not rebuild a pytree when it need not: :class:`ArgPlan`
records, at capture, where every tensor and every constant sits among the flattened
arguments, so the common call (positional tensors only) indexes ``args`` directly and only
nested or keyword arguments go through ``cugraphrt.adapter.tree``. :class:`OutputPlan` does the
same for the outputs. Also here: the checks made on the callables before anything is captured,
and the wording of every error about arguments.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from cugraphrt.adapter import tree as _tree
from cugraphrt.errors import OptionsError, ReplayError

__all__ = ["ArgPlan", "OutputPlan", "check_module", "describe", "normalize", "name_of"]

_Tensor = torch.Tensor
# Non-tensor output leaves returned unchanged on every call: values, not containers of tensors.
_CONSTANT_TYPES = (type(None), bool, int, float, complex, str, bytes, torch.dtype, torch.device,
                   torch.Size)
_HOOK_DICTS = ("_forward_pre_hooks", "_forward_hooks", "_backward_pre_hooks", "_backward_hooks")


def name_of(fn: Any) -> str:
    """A short name of a callable for messages."""
    if isinstance(fn, torch.nn.Module):
        return type(fn).__name__
    return getattr(fn, "__qualname__", None) or getattr(fn, "__name__", None) or repr(fn)


def describe(value: Any) -> str:
    """How a value reads in an error message."""
    if isinstance(value, _Tensor):
        device = value.get_device()
        where = "cpu" if device < 0 else f"{value.device.type}:{device}"
        return f"a tensor of shape {tuple(value.shape)}, {value.dtype}, on {where}"
    text = repr(value)
    return f"{type(value).__name__} {text if len(text) <= 60 else text[:57] + '...'}"


def _same(value: Any, expected: Any) -> bool:
    """Equality of a constant argument with its capture value, never raising."""
    try:
        return type(value) is type(expected) and bool(value == expected)
    except Exception:  # noqa: BLE001 - arrays and odd __eq__: not provably the same
        return False


class ArgPlan:
    """Where the tensors and constants of one callable's arguments are, fixed at capture.

    Parameters
    ----------
    args : tuple
        The sample positional arguments (tensors, constants, nested tuples, lists, dicts).
    kwargs : dict
        The sample keyword arguments.
    name : str
        The callable's name, for messages.
    convert_dtypes : bool, default False
        Convert a floating-point tensor of another floating-point dtype on copy-in (torch's
        behaviour) instead of refusing it.
    """

    def __init__(self, args: tuple, kwargs: dict, name: str, *,
                 convert_dtypes: bool = False) -> None:
        self.name = name
        self.convert_dtypes = convert_dtypes
        self.num_args = len(args)
        self.kw_keys = tuple(kwargs)
        self._kw_set = frozenset(kwargs)
        leaves, self.spec, _ = _tree.flatten((tuple(args), tuple(kwargs.values())))
        paths = _tree.flatten(tuple(args), "args")[2]
        for key, value in kwargs.items():
            paths += _tree.flatten(value, f"kwargs[{key!r}]")[2]
        self.paths = paths
        self.num_leaves = len(leaves)
        # Positional tensors and constants only: a call's args tuple is the leaves tuple.
        self.is_flat = not kwargs and all(not isinstance(a, (tuple, list, dict)) for a in args)
        self.statics = tuple(leaves)
        self.tensors = []  # per tensor leaf: everything the copy-in loop reads, unpacked once
        self.constants = []
        # A tensor passed twice at capture is one buffer in the graph: later calls must pass
        # one tensor there too, or the graph would see only the last copy.
        self.repeats = []
        first: dict[int, int] = {}
        for index, leaf in enumerate(leaves):
            if not isinstance(leaf, _Tensor):
                self.constants.append((index, leaf))
            elif id(leaf) in first:
                self.repeats.append((index, first[id(leaf)]))
            else:
                first[id(leaf)] = index
                self.tensors.append((index, leaf, leaf.data_ptr(), leaf.shape, leaf.dtype,
                                     leaf.get_device(), leaf.stride()))
        self.grad_indices = tuple(i for i, leaf, *_ in self.tensors if leaf.requires_grad)

    def leaves_of(self, args: tuple, kwargs: dict) -> tuple | list:
        """The flattened leaves of a call, in capture order; raises ReplayError on a new shape."""
        if self.is_flat and not kwargs:
            if len(args) != self.num_args:
                raise ReplayError(
                    f"graphed callable {self.name} was captured with {self.num_args} positional "
                    f"arguments (got {len(args)}); pass arguments as in sample_args"
                )
            return args
        if kwargs.keys() != self._kw_set:
            missing = sorted(self._kw_set - kwargs.keys())
            extra = sorted(kwargs.keys() - self._kw_set)
            raise ReplayError(
                f"graphed callable {self.name} was captured with keyword arguments "
                f"{sorted(self._kw_set)} (got {sorted(kwargs)}: missing {missing}, unexpected "
                f"{extra}); pass the keyword arguments of sample_kwargs"
            )
        value = (tuple(args), tuple(kwargs[k] for k in self.kw_keys))
        leaves, spec, _ = _tree.flatten(value)
        if spec != self.spec:
            raise ReplayError(
                f"the arguments of graphed callable {self.name} do not have the structure of "
                f"the capture (expected (args, kwargs values) = {self.spec.describe()}, got "
                f"{spec.describe()}); pass arguments nested like sample_args and sample_kwargs"
            )
        return leaves

    def load(self, leaves) -> None:
        """Check a call's leaves against the capture and copy new tensors into the statics.

        No copy when the caller passes a static input, or any tensor with its address and
        strides. Must run with grad mode off (inside the autograd Function's forward), so the
        copies are not recorded.
        """
        for index, static, ptr, shape, dtype, device, stride in self.tensors:
            value = leaves[index]
            if value is static:
                continue
            if (not isinstance(value, _Tensor) or value.shape != shape
                    or value.dtype is not dtype or value.get_device() != device):
                if not self._convertible(value, static):
                    raise self._mismatch(index, value)
                static.copy_(value)  # another floating dtype: converted, as torch does
                continue
            if value.data_ptr() != ptr:
                static.copy_(value)
            elif value.stride() != stride:  # the static buffer itself, laid out differently
                static.copy_(value.clone())
        for index, original in self.repeats:
            if leaves[index] is not leaves[original]:
                raise ReplayError(
                    f"argument {self.paths[index]} of graphed callable {self.name} was the same "
                    f"tensor as {self.paths[original]} at capture, so the graph has one buffer "
                    f"for both (got {describe(leaves[index])} there, a different tensor); pass "
                    f"the same tensor in both places, or capture with distinct sample tensors"
                )
        for index, expected in self.constants:
            value = leaves[index]
            if value is not expected and not _same(value, expected):
                raise ReplayError(
                    f"argument {self.paths[index]} of graphed callable {self.name} differs "
                    f"from the capture (expected {describe(expected)}, got {describe(value)}); "
                    f"non-tensor arguments are fixed at capture: pass the captured value, or "
                    f"graph the callable again"
                )

    def _convertible(self, value: Any, static: torch.Tensor) -> bool:
        return (self.convert_dtypes and isinstance(value, _Tensor)
                and value.shape == static.shape and value.device == static.device
                and value.is_floating_point() and static.is_floating_point())

    def _mismatch(self, index: int, value: Any) -> ReplayError:
        return ReplayError(
            f"argument {self.paths[index]} of graphed callable {self.name} does not match the "
            f"capture (expected {describe(self.statics[index])}, got {describe(value)}); pass "
            f"a tensor of the captured shape, dtype and device (make_graphed_callables converts "
            f"between floating dtypes unless strict_dtypes=True), or graph the callable again "
            f"for the new shape"
        )


class OutputPlan:
    """The outputs of one capture: static tensors, constants, and how to rebuild the nest.

    Parameters
    ----------
    outputs : Any
        What the callable returned during capture.
    name : str
        The callable's name, for messages.
    """

    def __init__(self, outputs: Any, name: str) -> None:
        leaves, self.spec, paths = _tree.flatten(outputs, "output")
        for leaf, path in zip(leaves, paths, strict=False):
            if not isinstance(leaf, (_Tensor, *_CONSTANT_TYPES)):
                raise OptionsError(
                    f"output of {name}", f"{path}: {type(leaf).__name__}",
                    "tensors and plain values (None, numbers, strings) nested in tuples, "
                    "lists and dicts; return the tensors themselves rather than objects that "
                    "hold them",
                )
        self.template = list(leaves)
        self.paths = tuple(paths)
        self.positions = tuple(i for i, leaf in enumerate(leaves) if isinstance(leaf, _Tensor))
        self.statics = tuple(leaves[i] for i in self.positions)
        # Apply returns a tensor for one output and a tuple otherwise: no rebuild needed when
        # that already is the structure the callable returned.
        self.is_single = self.spec.kind == "leaf" and len(self.statics) == 1
        self.is_direct = self.is_single or (self.spec.is_flat_tuple
                                            and len(self.statics) == len(leaves))
        self.diff = tuple(k for k, t in enumerate(self.statics) if t.requires_grad)
        self.nondiff = tuple(k for k, t in enumerate(self.statics) if not t.requires_grad)

    def hand_out(self):
        """Fresh tensors over the static outputs: what a call returns (``.data`` is the
        cheapest alias torch offers; the statics themselves must never reach the caller)."""
        if self.is_single:
            return self.statics[0].data
        return tuple([t.data for t in self.statics])

    def assemble(self, tensors) -> Any:
        """The callable's output structure around ``tensors`` (what the Function returned)."""
        if self.is_direct:
            return tensors
        leaves = list(self.template)
        if isinstance(tensors, _Tensor):
            tensors = (tensors,)
        for position, tensor in zip(self.positions, tensors, strict=False):
            leaves[position] = tensor
        return _tree.unflatten(self.spec, leaves)


def check_module(module: torch.nn.Module, label: str) -> None:
    """Reject a module whose capture would not mean what its eager calls mean.

    Raises
    ------
    OptionsError
        For hooks registered on the module, buffers that require grad, or a module that was
        graphed already.
    """
    hooks = [attr.strip("_") for attr in _HOOK_DICTS if getattr(module, attr, None)]
    if hooks:
        raise OptionsError(
            label, f"{type(module).__name__} with {', '.join(hooks)}",
            "a module without hooks: hooks registered before graphing would run inside the "
            "capture and again around every replay. Remove them (handle.remove()) and register "
            "them after make_graphed_callables, which is allowed",
        )
    for name, buffer in module.named_buffers():
        if buffer.requires_grad:
            raise OptionsError(
                label, f"buffer {name!r} that requires grad",
                "a module whose buffers do not require grad: only parameters can be graph "
                "inputs with gradients. Call requires_grad_(False) on the buffer, or make it "
                "an nn.Parameter",
            )
    if getattr(module.forward, "graphed", None) is not None:
        raise OptionsError(label, f"{type(module).__name__} already graphed",
                           "a module that has not been through make_graphed_callables; graph "
                           "a copy (copy.deepcopy) made before graphing")


def normalize(callables: Any, sample_args: Any, sample_kwargs: Any
              ) -> tuple[list[tuple[Callable, tuple, dict]], bool]:
    """Pair each callable with its sample args and kwargs; True when one callable was given.

    Raises
    ------
    OptionsError
        When the three arguments do not line up.
    """
    single = not isinstance(callables, tuple)
    if single:
        callables, sample_args, sample_kwargs = (callables,), (sample_args,), (sample_kwargs,)
    elif sample_kwargs is None:
        sample_kwargs = (None,) * len(callables)
    if not callables:
        raise OptionsError("callables", callables, "a callable or a non-empty tuple of them")
    for name, value in (("sample_args", sample_args), ("sample_kwargs", sample_kwargs)):
        if not isinstance(value, (tuple, list)) or len(value) != len(callables):
            raise OptionsError(name, value, f"one entry per callable ({len(callables)}) in a "
                                            f"tuple, when a tuple of callables is given")
    entries = []
    triples = zip(callables, sample_args, sample_kwargs, strict=False)
    for i, (fn, args, kwargs) in enumerate(triples):
        label = "callables" if single else f"callables[{i}]"
        if not callable(fn):
            raise OptionsError(label, fn, "a torch.nn.Module or a function")
        if not isinstance(args, (tuple, list)):
            where = "sample_args" if single else f"sample_args[{i}]"
            raise OptionsError(where, args, "a tuple of the arguments (for one tensor x: (x,))")
        if kwargs is None:
            kwargs = {}
        if not isinstance(kwargs, dict) or not all(isinstance(k, str) for k in kwargs):
            where = "sample_kwargs" if single else f"sample_kwargs[{i}]"
            raise OptionsError(where, kwargs, "a dict of keyword arguments by name, or None")
        entries.append((fn, tuple(args), dict(kwargs)))
    return entries, single
