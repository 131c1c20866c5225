"""One graph-safe Philox stream per row of a batch (:class:`RowGenerator`), and its NumPy
twin (:func:`row_draws`): what batched sampling draws from, one seed per request.

Published as :mod:`cugraphrt.random` names.
"""

from __future__ import annotations

from collections.abc import Sequence

import cupy
import numpy as np

from cugraphrt._cuda import runtime as _cuda
from cugraphrt._libraries import philox as _philox
from cugraphrt._libraries import philox_device as _device
from cugraphrt.errors import OptionsError
from cugraphrt.options import GeneratorState

__all__ = ["RowGenerator", "row_draws"]

_KINDS = {"uniform": 0, "gumbel": 1}


class RowGenerator:
    """One graph-safe Philox stream per row of a batch: what batched sampling draws from.

    Row ``r`` draws from its own seed at its own position, both in device memory, so what it
    draws depends on its seed and on how many draws it made, never on which other rows share
    the batch or how many there are. Each draw is one kernel launch that advances every row's
    position on the device: captured, or inside a ``while_loop`` body, every replay and every
    iteration draws fresh numbers, and the sequence equals the same calls made eagerly.

    Parameters
    ----------
    rows : int
        The number of streams (rows), at least 1.
    seeds : sequence of int, optional
        One seed per row in ``[0, 2**64)``; row ``r`` gets ``r`` if omitted.
    device : int, optional
        Device; the current one by default.
    """

    def __init__(self, rows: int, seeds: Sequence[int] | None = None,
                 device: int | None = None) -> None:
        if isinstance(rows, bool) or not isinstance(rows, (int, np.integer)) or rows < 1:
            raise OptionsError("rows", rows, "a positive integer")
        _device.refuse_in_capture("creating a cugraphrt.random.RowGenerator")
        self._rows = int(rows)
        self._device_id = _cuda.get_device() if device is None else int(device)
        with cupy.cuda.Device(self._device_id):
            self._seeds = cupy.zeros(self._rows, dtype=np.uint64)
            # One position per row, then the last-block counter of the draw kernel.
            self._state = cupy.zeros(self._rows + 1, dtype=np.uint64)
            _device.kernel("cgrt_rows_f32", self._device_id)
        self.manual_seed(range(self._rows) if seeds is None else seeds)

    @property
    def rows(self) -> int:
        """The number of streams."""
        return self._rows

    def manual_seed(self, seeds: Sequence[int], rows: Sequence[int] | None = None
                    ) -> RowGenerator:
        """Seed ``rows`` (all, by default) with ``seeds``, one each, at position 0. Not
        allowed during capture. Returns ``self``."""
        targets = list(range(self._rows)) if rows is None else [int(r) for r in rows]
        values = [_device.check_seed(v) for v in seeds]
        if len(values) != len(targets) or any(not 0 <= r < self._rows for r in targets):
            raise OptionsError("seeds", values, f"one seed per row of {targets} (rows in "
                               f"[0, {self._rows}))")
        _device.refuse_in_capture("manual_seed()")
        with cupy.cuda.Device(self._device_id):
            index = cupy.asarray(np.array(targets, dtype=np.int64))
            self._seeds[index] = cupy.asarray(np.array(values, dtype=np.uint64))
            self._state[index] = 0
        return self

    def get_state(self) -> list[GeneratorState]:
        """Each row's seed and position (synchronizes with the device)."""
        _device.refuse_in_capture("get_state()")
        with cupy.cuda.Device(self._device_id):
            seeds, positions = self._seeds.get(), self._state.get()
        return [GeneratorState(seed=int(s), offset=int(p))
                for s, p in zip(seeds, positions[:self._rows], strict=True)]

    def uniform(self, n: int, out: cupy.ndarray | None = None) -> cupy.ndarray:
        """``(rows, n)`` float32 draws, uniform in (0, 1) (never 0 or 1)."""
        return self._draw(n, out, _KINDS["uniform"])

    def gumbel(self, n: int, out: cupy.ndarray | None = None) -> cupy.ndarray:
        """``(rows, n)`` float32 Gumbel noise: ``argmax(logits + noise)`` samples a row's
        token from ``softmax(logits)`` (the Gumbel-max trick)."""
        return self._draw(n, out, _KINDS["gumbel"])

    def _draw(self, n: int, out: cupy.ndarray | None, kind: int) -> cupy.ndarray:
        if _cuda.get_device() != self._device_id:
            raise OptionsError("device", _cuda.get_device(),
                               f"draw on the generator's device {self._device_id}")
        if out is None:
            out = cupy.empty((self._rows, int(n)), dtype=np.float32)
        elif out.shape != (self._rows, n) or out.dtype != np.float32 \
                or not out.flags.c_contiguous:
            raise OptionsError("out", f"{out.dtype}{out.shape}",
                               f"a C-contiguous float32 array of shape ({self._rows}, {n})")
        counters = self._rows * ((int(n) + 3) // 4)
        if counters:
            args = (self._seeds, self._state, out, np.int64(self._rows), np.int64(n),
                    np.int32(kind), np.int32(1))
            _device.kernel("cgrt_rows_f32", self._device_id)(
                (_device.blocks_for(counters),), (_device.THREADS,), args)
        return out

    def __repr__(self) -> str:
        return f"<cugraphrt.random.RowGenerator rows={self._rows} device={self._device_id}>"


def row_draws(seeds: Sequence[int], positions: Sequence[int], n: int,
              kind: str = "uniform") -> np.ndarray:
    """What a :class:`RowGenerator` draws, computed on the host with NumPy: ``(rows, n)``
    float32, row ``r`` from seed ``seeds[r]`` at position ``positions[r]`` (a draw of ``n``
    per row advances each position by ``ceil(n / 4)``). ``kind`` ``"uniform"`` equals the
    device's draws bit for bit; ``"gumbel"`` is within an ulp of them (CUDA's ``logf`` and
    NumPy's ``log`` may round differently). For CPU runs and tests."""
    if kind not in _KINDS:
        raise OptionsError("kind", kind, "'uniform' or 'gumbel'")
    seeds = [_device.check_seed(s) for s in seeds]
    if len(positions) != len(seeds) or any(int(p) < 0 for p in positions):
        raise OptionsError("positions", list(positions), "one position >= 0 per seed")
    return _philox.reference_rows(seeds, [int(p) for p in positions], int(n), kind)
