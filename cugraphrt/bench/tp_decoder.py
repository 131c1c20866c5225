"""A tensor-parallel Llama-style decoder for one decode step (torch; used under torchrun).

Megatron-style 2-way (any-way) tensor parallelism: per layer, the query/key/value and the
gate/up projections are column-parallel (each rank holds its heads, its slice of the MLP),
the output and down projections row-parallel, each followed by one ``all_reduce`` of the
partial sums. One decode step reads one token per sequence, writes its key and value into a
static KV cache at the position held on the device (``pos``, advanced by the step), and
attends over the cache with the positions past ``pos`` masked: static shapes, so the whole
step can be captured once and replayed for every token.

:func:`build` makes the layers from one seed, identical on every rank (each keeps its
shards); :meth:`Decoder.reference` runs the same math unsharded in float64 on one rank, the
independent reference of the tests. torch is passed in, never imported here.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

__all__ = ["Dims", "Decoder", "build"]


@dataclass(frozen=True)
class Dims:
    """The decoder's sizes (the defaults make a launch-bound step: small matrices, many
    kernels, two all-reduces per layer)."""

    layers: int = 4
    hidden: int = 512
    heads: int = 8
    ffn: int = 1408
    batch: int = 4
    max_len: int = 128

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads


class Decoder:
    """The shards of this rank, the KV cache and the position: ``step(x)`` is one token."""

    def __init__(self, torch: Any, dims: Dims, full: list[dict], rank: int, world: int,
                 device: Any, dtype: Any) -> None:
        if dims.heads % world or dims.ffn % world:
            raise ValueError(f"heads ({dims.heads}) and ffn ({dims.ffn}) must divide by the "
                             f"{world} ranks")
        self.torch, self.dims, self.full, self.world = torch, dims, full, world
        heads, d = dims.heads // world, dims.head_dim
        rows = slice(rank * heads * d, (rank + 1) * heads * d)
        cols = slice(rank * dims.ffn // world, (rank + 1) * dims.ffn // world)
        self.heads = heads
        self.layers = []
        for w in full:
            shard = {"norm1": w["norm1"], "norm2": w["norm2"],
                     "q": w["q"][rows], "k": w["k"][rows], "v": w["v"][rows],
                     "o": w["o"][:, rows], "gate": w["gate"][cols], "up": w["up"][cols],
                     "down": w["down"][:, cols]}
            self.layers.append({n: t.to(device=device, dtype=dtype).contiguous()
                                for n, t in shard.items()})
        shape = (dims.batch, heads, dims.max_len, d)
        self.k_cache = [torch.zeros(shape, device=device, dtype=dtype) for _ in full]
        self.v_cache = [torch.zeros(shape, device=device, dtype=dtype) for _ in full]
        self.pos = torch.zeros(1, device=device, dtype=torch.long)
        self.positions = torch.arange(dims.max_len, device=device)

    def reset(self) -> None:
        """Empty the cache and go back to position 0 (in place: graphs keep their buffers)."""
        for cache in self.k_cache + self.v_cache:
            cache.zero_()
        self.pos.zero_()

    def step(self, x: Any) -> Any:
        """One decode step for ``x`` (batch, hidden); returns the layer stack's output."""
        torch, dist = self.torch, self.torch.distributed
        b, d = self.dims.batch, self.dims.head_dim
        masked = self.positions > self.pos  # positions not written yet
        for w, kc, vc in zip(self.layers, self.k_cache, self.v_cache, strict=True):
            h = _rms(torch, x, w["norm1"])
            q = (h @ w["q"].T).view(b, self.heads, 1, d)
            kc.index_copy_(2, self.pos, (h @ w["k"].T).view(b, self.heads, 1, d))
            vc.index_copy_(2, self.pos, (h @ w["v"].T).view(b, self.heads, 1, d))
            scores = (q @ kc.transpose(-1, -2)) * (1.0 / math.sqrt(d))
            probs = torch.softmax(scores.masked_fill(masked, float("-inf")).float(), -1)
            attn = (probs.to(x.dtype) @ vc).reshape(b, self.heads * d) @ w["o"].T
            if self.world > 1:
                dist.all_reduce(attn)
            x = x + attn
            h = _rms(torch, x, w["norm2"])
            mlp = (torch.nn.functional.silu(h @ w["gate"].T) * (h @ w["up"].T)) @ w["down"].T
            if self.world > 1:
                dist.all_reduce(mlp)
            x = x + mlp
        self.pos += 1
        return x

    def reference(self, xs: list) -> list:
        """The same steps unsharded, in float64 on this rank (for the tests)."""
        torch, dims = self.torch, self.dims
        b, d, n = dims.batch, dims.head_dim, dims.heads
        device = xs[0].device
        weights = [{k: t.to(device=device, dtype=torch.float64) for k, t in w.items()}
                   for w in self.full]
        keys = [torch.zeros(b, n, 0, d, device=device, dtype=torch.float64) for _ in weights]
        values = [k.clone() for k in keys]
        outs = []
        for x in xs:
            x = x.double()
            for i, w in enumerate(weights):
                h = _rms(torch, x, w["norm1"])
                q = (h @ w["q"].T).view(b, n, 1, d)
                keys[i] = torch.cat([keys[i], (h @ w["k"].T).view(b, n, 1, d)], 2)
                values[i] = torch.cat([values[i], (h @ w["v"].T).view(b, n, 1, d)], 2)
                probs = torch.softmax(q @ keys[i].transpose(-1, -2) / math.sqrt(d), -1)
                x = x + (probs @ values[i]).reshape(b, n * d) @ w["o"].T
                h = _rms(torch, x, w["norm2"])
                x = x + (torch.nn.functional.silu(h @ w["gate"].T) * (h @ w["up"].T)) \
                    @ w["down"].T
            outs.append(x)
        return outs


def _rms(torch: Any, x: Any, weight: Any) -> Any:
    variance = x.float().pow(2).mean(-1, keepdim=True)
    return (x.float() * torch.rsqrt(variance + 1e-6)).to(x.dtype) * weight


def build(torch: Any, dims: Dims, *, rank: int, world: int, device: Any, dtype: Any,
          seed: int = 0) -> Decoder:
    """The decoder of ``rank``: full weights drawn from ``seed`` on the CPU (the same on
    every rank), this rank's shards on ``device``."""
    gen = torch.Generator().manual_seed(seed)
    h, f = dims.hidden, dims.ffn

    def rand(*shape, fan_in):
        return torch.randn(*shape, generator=gen, dtype=torch.float64) / math.sqrt(fan_in)

    full = [{"norm1": 1 + 0.1 * torch.randn(h, generator=gen, dtype=torch.float64),
             "norm2": 1 + 0.1 * torch.randn(h, generator=gen, dtype=torch.float64),
             "q": rand(h, h, fan_in=h), "k": rand(h, h, fan_in=h), "v": rand(h, h, fan_in=h),
             "o": rand(h, h, fan_in=h), "gate": rand(f, h, fan_in=h),
             "up": rand(f, h, fan_in=h), "down": rand(h, f, fan_in=f)}
            for _ in range(dims.layers)]
    return Decoder(torch, dims, full, rank, world, device, dtype)
