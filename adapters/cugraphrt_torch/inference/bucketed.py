"""graph_module with buckets: a torch module's forward graphed once per shape bucket.

The bucket machinery is the core's (:mod:`cugraphrt._callables.buckets`); this module only says how
torch tensors are copied, padded and cut, and captures one bucket the way :func:`graph_module`
captures its one shape (:func:`~._warm_up.capture_module`): under ``torch.no_grad()``, a
capture owned by torch's ``CUDAGraph`` with memory from the family's cugraphrt pool, the first
(largest) bucket's after warm-ups from that pool.
"""

from __future__ import annotations

from typing import Any

import cupy
import torch

from cugraphrt import Graph, MemPool
from cugraphrt.adapter import Bucketed, CapturedBucket, instantiate_measured, order_for
from cugraphrt.errors import ReplayError

from .._internals import tensors as _tensors
from ..capture import _torch
from ..capture._output_check import FIX_COPY, make_check
from ..capture.framework import TORCH
from ._warm_up import Experts, capture_module

__all__ = ["BucketedModule"]


def _release_torch_cache() -> None:
    # Torch hands the segments of a graph pool back (to the cugraphrt pool) only from
    # empty_cache, once no graph uses its pool; only called under memory-budget pressure.
    torch.cuda.synchronize()
    torch.cuda.empty_cache()


class BucketedModule:
    """A module's inference forward graphed once per shape bucket: call it like the module.

    Made by :func:`cugraphrt_torch.graph_module` with ``buckets``. All buckets share one
    cugraphrt pool; outputs are valid until the next call. A call made while the module's
    ``training`` flag differs from the capture's runs the module eagerly (see ``strict``).

    Attributes
    ----------
    module : torch.nn.Module
    buckets : tuple of int
        The bucket sizes, smallest first.
    pool : cugraphrt.MemPool
        The pool every bucket's graph allocates from.
    """

    def __init__(self, module: torch.nn.Module, sample_args: tuple, device: int, *,
                 num_warmup_iters: int, pool: MemPool | None, copy_outputs: bool,
                 buckets: Any, dynamic_dim: Any, pad: Any, memory_budget: int | None,
                 strict: bool, check_outputs: bool | None = None,
                 inputs: str = "copy") -> None:
        self.module = module
        self._training = module.training
        self._strict = strict
        self._device = device

        # The callbacks reach the module and the device, never self: self holds the core, and
        # a cycle would keep the graphs alive until a garbage collection.
        experts = Experts()  # the family's buckets run the experts its first capture chose

        def capture(args: tuple, pool: MemPool, warm: bool) -> CapturedBucket:
            with torch.inference_mode(False), torch.no_grad(), torch.cuda.device(device), \
                    cupy.cuda.Device(device):
                leaves = [a for a in args if isinstance(a, torch.Tensor)]
                versions = _tensors.versions(leaves)
                # Kept, to instantiate it apart and measure the executable (BucketStat).
                session, outputs = capture_module(
                    lambda: Graph(keep_graph=True), pool, module, args,
                    num_warmup_iters if warm else 0, experts)
                written = _tensors.moved(leaves, versions) if inputs == "rebind" else None
                if warm:  # the family's first capture
                    _torch.give_back_dropped_workspaces()
                captured = session.captured
                assert captured is not None  # set by a successful capture
                cuda_graph = captured.graph
                exec_bytes = instantiate_measured(cuda_graph)
            # Torch's own replay, on torch's current stream, past the pool-order checks: the
            # bucket graphs of one pool may replay in any order (see the buckets module).
            # ``launch`` is disarmed by a reset, where torch's bound method would keep torch's
            # graph and pool alive. The torch MemPool keeps the outputs' memory mapped once
            # they share it.
            return CapturedBucket(captured.launch, outputs, cuda_graph.reset, captured.seq,
                                  graph=cuda_graph if inputs == "rebind" else None,
                                  memory=captured.memory, exec_bytes=exec_bytes,
                                  written=written)

        def check(pool: MemPool):
            return make_check(check_outputs, f"graph_module({type(module).__name__}, buckets)",
                              FIX_COPY, order_for(pool))

        def eager(*args: Any) -> Any:
            with torch.no_grad():
                return module(*args)

        with torch.inference_mode(False), torch.no_grad(), torch.cuda.device(device):
            self._core = Bucketed(
                ops=TORCH, sample_args=sample_args, buckets=buckets,
                dynamic_dim=dynamic_dim, pad=pad, memory_budget=memory_budget, strict=strict,
                pool=pool, copy_outputs=copy_outputs, capture=capture, eager=eager,
                name=type(module).__name__, trim=_release_torch_cache,
                check=None if copy_outputs else check, inputs=inputs)
        self._eager = eager
        self.buckets = self._core.buckets
        self.pool = self._core.pool
        self.stats = self._core.stats
        self.release = self._core.release
        self.predict_reserved_bytes = self._core.predict_reserved_bytes

    def __call__(self, *args: Any) -> Any:
        if self.module.training != self._training:
            message = (f"the module's training flag changed since capture (expected "
                       f"training={self._training}, got training={self.module.training})")
            if self._strict:
                raise ReplayError(message + "; restore it, or graph the module again "
                                  "(strict=True)")
            return self._core.fallback(args, "training", message)
        with torch.no_grad():
            return self._core(*args)

    def capture_all(self, progress: bool | None = None) -> None:
        """Capture every bucket not captured yet, largest first (see
        :meth:`cugraphrt.BucketedFunction.capture_all`)."""
        self._core.capture_all(progress)

    def __repr__(self) -> str:
        return f"<cugraphrt_torch.BucketedModule of {type(self.module).__name__}: " \
               f"buckets {list(self.buckets)}, pool {self.pool.id}>"
