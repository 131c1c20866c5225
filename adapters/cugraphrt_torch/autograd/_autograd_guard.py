"""Gradients handed to autograd never stay aliases of buffers a replay overwrites.

The backward graph writes each input's gradient into a static buffer. Returning that buffer
costs nothing, but autograd may keep it: ``AccumulateGrad`` adopts an incoming gradient as
``param.grad`` when ``.grad`` is None (it "steals" it instead of copying), and
``torch.autograd.grad`` or a tensor hook hands it to the user. The next replay of a graph that
writes the buffer then changes that ``.grad`` behind autograd's back: a second backward before
``optimizer.step()`` accumulates the new gradient onto itself (PyTorch issue 181723).

Copying every gradient on every backward would fix that at the price of one kernel and one
allocation per parameter per step. Instead we copy only what is really kept, and only at the
last moment: **copy-on-overwrite**.

* A backward returns fresh tensor objects over the static buffers (as torch does) and notes,
  per buffer, which objects it handed out (weak references) in the pool's :class:`AliasGuard`.
* Before any replay that can overwrite a noted buffer, the guard reads the buffer's storage
  reference count (one C call, no allocation). Equal to the count the graphed callable itself
  accounts for: nothing kept it, no copy — the usual loop, whose ``zero_grad(set_to_none=True)``
  dropped last step's ``.grad`` first.
* Higher: someone kept an alias. The known holders — the ``.grad`` of the parameters and leaf
  inputs the gradient went to, and the handed-out objects themselves (what
  ``autograd.grad`` returns and hooks receive) — are moved to a private copy in place
  (``t.data = t.clone()``), so every reference to them stays valid and stops aliasing. That
  is one copy per kept gradient per accumulation window, the copy eager autograd would have
  made when accumulating.
* If the count is still high, an unknown object (a view a hook kept) holds the buffer: we
  warn and return that gradient as a copy from then on.

Which replays can overwrite a buffer? Memory a capture allocated stays the graph's as long as
its tensors live, so later captures into the pool never get it; earlier captures may have used
it as scratch. Hence a replay of the graph captured ``seq``-th can overwrite the outputs of the
graphs captured at or after ``seq`` in the same pool, and the guard settles only those. That
rule, and the per-pool list of what is pending, is
:class:`cugraphrt.adapter.OverwriteOrder`,
which the check of overwritten forward outputs
(:mod:`cugraphrt_torch.capture._output_check`) shares:
``AliasGuard`` is its name here.

The pool's pending list holds a :class:`_Watch` of the buffers, never the buffers: a graphed
callable that is gone must not keep its static buffers, and through their segments its pool
and the pool's guard, alive for good. Gradients it handed out that are still alive then alias
memory the pool's earlier graphs overwrite: the watch moves them to a copy at the next
settle, as it would have.
"""

from __future__ import annotations

import warnings
import weakref
from collections.abc import Sequence
from typing import Any

import torch

from cugraphrt.adapter import OverwriteOrder, order_for

from .._internals import tensors as _tensors

__all__ = ["AliasGuard", "GradBuffers", "guard_for", "use_count_available"]

# A private torch entry point (storage key -> use count), absent from some builds.
_use_count: Any = _tensors.storage_use_count()
_ref = weakref.ref


#: The per-pool guard: capture-order numbers and the gradients pending a check.
AliasGuard = OverwriteOrder
#: The guard of a cugraphrt MemPool (graphs sharing a pool share one).
guard_for = order_for


def use_count_available() -> bool:
    """Whether storage reference counts can be read (else gradients are always copied)."""
    return _use_count is not None


def _storage_id(tensor: torch.Tensor) -> int | None:
    try:
        return _tensors.storage_key(tensor.untyped_storage())
    except Exception:  # noqa: BLE001 - sparse and other storage-less tensors alias nothing
        return None


class GradBuffers:
    """The static gradient buffers of one backward graph and how they are handed out.

    Parameters
    ----------
    slots : sequence of (int, Tensor, Tensor or None, str)
        Per gradient: its position in the tuple backward returns, the static buffer, the
        parameter it belongs to (None for an argument) and a name for messages.
    held : sequence of Tensor
        Every tensor the graphed callable keeps (static inputs, outputs, gradient buffers):
        the references a storage count must allow for.
    name : str
        The callable's name, for messages.
    """

    def __init__(self, slots: Sequence[tuple], held: Sequence[torch.Tensor], name: str) -> None:
        self.name = name
        self.positions = tuple(s[0] for s in slots)
        self.buffers = tuple(s[1] for s in slots)
        self.params = tuple(s[2] for s in slots)
        self.labels = tuple(s[3] for s in slots)
        self.copy = [_use_count is None] * len(slots)
        self._any_copy = any(self.copy)
        self.storages: list[tuple[int, int, tuple[int, ...]]] = []
        self.watch = _Watch(self)
        if _use_count is None:
            return
        # The held tensors by storage, once: a ResNet-18 has 62 gradient buffers and about
        # 200 held tensors, and a pass over all of them per buffer was build time on the host.
        held_by_key: dict[int, list[torch.Tensor]] = {}
        for tensor in held:
            if tensor is not None:
                held_key = _storage_id(tensor)
                if held_key is not None:
                    held_by_key.setdefault(held_key, []).append(tensor)
        members: dict[int, list[int]] = {}
        for j, buffer in enumerate(self.buffers):
            key = _storage_id(buffer)
            if key is None:
                self.copy[j] = True
            else:
                members.setdefault(key, []).append(j)
        for key, group in members.items():
            baseline = _baseline(key, held_by_key.get(key, ()))
            if baseline is None:
                for j in group:  # the count does not behave as expected: copy instead
                    self.copy[j] = True
            else:
                self.storages.append((key, baseline, tuple(group)))
        self._any_copy = any(self.copy)

    def hand_out(self, result: list) -> tuple:
        """Put this backward's gradients into ``result``; returns what to watch."""
        if self._any_copy:
            return self._hand_out_copies(result)
        tensors = [buffer.data for buffer in self.buffers]
        for position, tensor in zip(self.positions, tensors, strict=False):
            result[position] = tensor
        return tuple(map(_ref, tensors))

    def _hand_out_copies(self, result: list) -> tuple:
        handed: list[weakref.ref | None] = []
        for j, buffer in enumerate(self.buffers):
            if self.copy[j]:
                result[self.positions[j]] = buffer.clone()
                handed.append(None)
            else:
                tensor = buffer.data
                result[self.positions[j]] = tensor
                handed.append(_ref(tensor))
        return tuple(handed)

    def settle(self, handed: tuple, leaves: tuple) -> None:
        """Move every kept alias of the buffers to its own memory before they are overwritten.

        ``handed`` holds weak references to the tensors a backward returned, ``leaves`` weak
        references to the argument tensors whose ``.grad`` may have adopted them (one per slot,
        None for parameters).
        """
        for key, baseline, group in self.storages:
            if _use_count(key) <= baseline:
                continue
            for j in group:
                self._relocate(key, self._holders(j, handed, leaves))
            if _use_count(key) > baseline:
                self._give_up(group, _use_count(key) - baseline)

    def _holders(self, j: int, handed: tuple, leaves: tuple) -> list:
        holders = []
        param = self.params[j]
        if param is not None:
            holders.append(param.grad)
        elif leaves and leaves[j] is not None:
            leaf = leaves[j]()
            if leaf is not None:
                holders.append(leaf.grad)
        if handed and handed[j] is not None:
            holders.append(handed[j]())
        return holders

    @staticmethod
    def _relocate(key: int, holders: list) -> None:
        for tensor in holders:
            if tensor is not None and _storage_id(tensor) == key:
                # In place on the tensor object: every reference to it (param.grad, a list the
                # user kept) now sees a private copy with the same values.
                tensor.data = tensor.clone()

    def _give_up(self, group: tuple[int, ...], extra: int) -> None:
        for j in group:
            self.copy[j] = True
        self._any_copy = True
        # The unknown holder may live on: stop watching a buffer that is no longer handed out.
        self.storages = [entry for entry in self.storages if entry[2] != group]
        names = ", ".join(self.labels[j] for j in group)
        warnings.warn(
            f"a gradient that graphed callable {self.name} returned for {names} is still "
            f"referenced when the next replay overwrites it (got {extra} reference(s) besides "
            f".grad and the returned tensors, such as a view kept by a hook); that holder now "
            f"sees new values. These gradients are returned as copies from now on; clone "
            f"gradients you keep across steps to avoid this warning",
            UserWarning,
            stacklevel=4,
        )


class _Watch:
    """What a pool's pending list holds for one backward's gradients (see the module).

    While the graphed callable lives, its :class:`GradBuffers` settle. Once it is gone, every
    gradient it handed out that still aliases one of its buffers' storages is moved to a
    copy: without the buffers no storage count can be read, so nothing tells a kept alias
    from a dropped one but the alias itself.
    """

    __slots__ = ("buffers", "keys", "params")

    def __init__(self, buffers: GradBuffers) -> None:
        self.buffers = _ref(buffers)
        self.keys = tuple(_storage_id(buffer) for buffer in buffers.buffers)
        self.params = tuple(None if p is None else _ref(p) for p in buffers.params)

    def settle(self, handed: tuple, leaves: tuple) -> None:
        buffers = self.buffers()
        if buffers is not None:
            buffers.settle(handed, leaves)
            return
        for j, key in enumerate(self.keys):
            holders = []
            param_ref = self.params[j]
            param = param_ref() if param_ref is not None else None
            if param is not None:
                holders.append(param.grad)
            leaf = leaves[j]() if leaves and leaves[j] is not None else None
            if leaf is not None:
                holders.append(leaf.grad)
            if handed and handed[j] is not None:
                holders.append(handed[j]())
            if key is not None:
                GradBuffers._relocate(key, holders)


def _baseline(key: int, held: Sequence[torch.Tensor]) -> int | None:
    """The storage count of ``key`` with no alias outside the graphed callable, or None.

    ``held`` are the callable's tensors over that storage.

    Counted, not only measured: a temporary of the capture still alive now (waiting for the
    garbage collector) would raise a measured baseline, and an alias of the same size would
    then go unseen. A storage is referenced once per tensor over it (views add their base)
    plus once by its Python object, which ``_storage_id`` created. The smaller of counted and
    measured is used: too high could let an alias through, too low only sends the buffer to
    the copying path (with a warning), and the GPU tests check that it does not happen.
    """
    owners = {}
    for tensor in held:
        owners[id(tensor)] = tensor
        base = tensor._base
        if base is not None:
            owners[id(base)] = base
    counted = len(owners) + 1
    measured = _use_count(key)
    baseline = min(counted, measured)
    # Self-test of the mechanism on this torch build: one alias must add exactly one.
    if not owners:
        return None
    probe = next(iter(owners.values())).data
    seen = _use_count(key)
    del probe
    if seen != measured + 1 or _use_count(key) != measured:
        return None
    return baseline
