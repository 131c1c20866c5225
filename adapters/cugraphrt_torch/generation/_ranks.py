"""The ranks a tensor-parallel model is split over, and what a sampled generation makes them
agree on.

A model split with torch's tensor parallelism (``DTensor`` parameters, ``tp_plan="auto"``)
runs the same generation on every rank of its split: each rank computes the same logits (the
row-parallel all-reduce leaves them whole), so greedy tokens, EOS and the loop's stop agree
by themselves. Sampled tokens agree only if every rank draws the same noise: the same seeds
and settings per row. A rank that samples another token feeds its shard another input, and
one whose row stops at another step leaves its peers' all-reduces unpaired (a hang). So
before a sampled generation the ranks of each split exchange their rows' settings: seeds
drawn from torch's default generator (``seed=None``) become the first rank's, as
``torch.manual_seed`` on that rank makes the call reproducible; anything else that differs
is an error, raised on every rank alike (a rank raising alone would leave the others
waiting in the generation's collectives).

Data parallelism (``Replicate`` placements, ranks serving different prompts) is not a
split: those ranks sample independently and exchange nothing.
"""

from __future__ import annotations

from typing import Any

import torch.distributed as dist

from cugraphrt.errors import OptionsError

from ._sampling import Sampling

__all__ = ["split_groups", "agree"]


def split_groups(model: Any) -> tuple[Any, ...]:
    """The process groups of the device-mesh dimensions over which ``model``'s parameters
    are sharded (``Shard`` or ``Partial`` placements), those of more than one rank, in mesh
    order; ``()`` for a model that is not split."""
    if not dist.is_available() or not dist.is_initialized():
        return ()
    from torch.distributed.tensor import DTensor, Replicate

    dims: dict[int, Any] = {}
    for parameter in model.parameters():
        if isinstance(parameter, DTensor):
            mesh = parameter.device_mesh
            for dim, placement in enumerate(parameter.placements):
                if not isinstance(placement, Replicate) and mesh.size(dim) > 1:
                    dims.setdefault(dim, mesh.get_group(dim))
    return tuple(dims[dim] for dim in sorted(dims))


def agree(rows: list[Sampling], drawn: bool, groups: tuple[Any, ...]) -> list[Sampling]:
    """``rows`` as every rank of ``groups`` will sample them: with ``drawn`` (the seeds came
    from torch's default generator) the seeds of each group's first rank, in turn, so that
    the whole split shares one rank's; OptionsError on every rank where any other setting,
    or a seed given explicitly, differs between ranks."""
    # Drawn seeds may differ (the first rank's are taken); nothing else may.
    free = {"seed"} if drawn else set()
    for group in groups:
        everyone: list[Any] = [None] * dist.get_world_size(group)
        dist.all_gather_object(everyone, rows, group=group)
        for rank, theirs in enumerate(everyone[1:], start=1):
            _same(everyone[0], theirs, rank, free)
        rows = everyone[0]
    return rows


def _same(first: list[Sampling], other: list[Sampling], rank: int, free: set[str]) -> None:
    """OptionsError naming the first setting outside ``free`` in which a rank's rows differ
    from the split's first rank's (every rank raises the same, having gathered the same
    rows)."""
    if len(first) != len(other):
        raise OptionsError("input_ids", f"{len(other)} rows",
                           f"{len(first)} rows, as on the split's first rank (rank {rank} "
                           "has these): every rank of a tensor-parallel model generates the "
                           "same batch")
    for row, (mine, theirs) in enumerate(zip(first, other, strict=True)):
        for name, value in theirs.__dict__.items():
            if name not in free and value != mine.__dict__[name]:
                raise OptionsError(name, value,
                                   f"{mine.__dict__[name]!r} for row {row}, as on the "
                                   f"split's first rank (rank {rank} has this): every rank of "
                                   "a tensor-parallel model samples with the same settings "
                                   "and seeds")
