"""Graph-safe random numbers.

Counter-based Philox4x32-10 with the generator's seed and counter position held in device
memory. Every draw is one kernel launch that reads the position and advances it on the
device, so a captured draw produces fresh numbers on every replay, with no host work per
replay, and the sequence of replays equals the same calls made eagerly from the same seed,
bit for bit. CuPy's own ``cupy.random`` cannot do this (its cuRAND calls cannot be captured,
and a captured draw would repeat its numbers forever).

Draws on one generator must be ordered (one stream, or streams joined by events); give
concurrent branches of a graph a generator each.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Sequence

import cupy
import numpy as np

from cugraphrt._capture import stream_capture as _capture
from cugraphrt._cuda import runtime as _cuda
from cugraphrt._libraries import philox as _philox
from cugraphrt._libraries import philox_device as _device
from cugraphrt._random_rows import RowGenerator, row_draws
from cugraphrt.errors import OptionsError
from cugraphrt.options import GeneratorState

__all__ = [
    "Generator",
    "RowGenerator",
    "row_draws",
    "default_generator",
    "manual_seed",
    "seed",
    "get_state",
    "set_state",
    "rand",
    "randn",
    "uniform",
    "normal",
    "randint",
    "bernoulli",
]

_FLOATS = {np.dtype(np.float16): "cgrt_fill_f16", np.dtype(np.float32): "cgrt_fill_f32",
           np.dtype(np.float64): "cgrt_fill_f64"}
_INTS = {np.dtype(np.int32): "cgrt_randint_i32", np.dtype(np.int64): "cgrt_randint_i64"}
_UNIFORM, _NORMAL, _UNIFORM_HALF = 0, 1, 2
class Generator:
    """A graph-safe Philox random-number generator on one device.

    Parameters
    ----------
    seed : int, optional
        Initial seed in ``[0, 2**64)``; drawn from the OS if omitted.
    device : int, optional
        Device; the current one by default.

    Raises
    ------
    CaptureError
        When created during a capture (its state must be written eagerly).
    """

    def __init__(self, seed: int | None = None, device: int | None = None) -> None:
        _device.refuse_in_capture("creating a cugraphrt.random.Generator")
        self._device_id = _cuda.get_device() if device is None else int(device)
        with cupy.cuda.Device(self._device_id):
            # [seed, position (in 128-bit counters), last-block counter]
            self._state = cupy.zeros(3, dtype=np.uint64)
            _device.kernel(_philox.KERNEL_NAMES[0], self._device_id)
        self.manual_seed(_device.random_seed() if seed is None else seed)

    @property
    def device_id(self) -> int:
        """The device whose memory holds this generator's state."""
        return self._device_id

    # -- state -----------------------------------------------------------------------------

    def manual_seed(self, seed: int) -> Generator:
        """Reset to ``seed`` at position 0. Not allowed during capture.

        Returns
        -------
        Generator
            ``self``.
        """
        seed = _device.check_seed(seed)
        _device.refuse_in_capture("manual_seed()")
        self._write(seed, 0)
        self._seed = seed
        return self

    def seed(self) -> int:
        """Reseed from the operating system's entropy; returns the new seed."""
        value = _device.random_seed()
        self.manual_seed(value)
        return value

    def initial_seed(self) -> int:
        """The seed last set with :meth:`manual_seed`, :meth:`seed` or :meth:`set_state`."""
        return self._seed

    def get_state(self) -> GeneratorState:
        """The seed and counter position (synchronizes with the device).

        Returns
        -------
        GeneratorState
        """
        _device.refuse_in_capture("get_state()")
        with cupy.cuda.Device(self._device_id):
            seed, position, _ = (int(v) for v in self._state.get())
        return GeneratorState(seed=seed, offset=position)

    def set_state(self, state: GeneratorState) -> None:
        """Restore a state from :meth:`get_state`. Not allowed during capture."""
        if not isinstance(state, GeneratorState):
            raise OptionsError("state", state, "a GeneratorState from get_state()")
        _device.refuse_in_capture("set_state()")
        self._write(state.seed, state.offset)
        self._seed = state.seed

    def _write(self, seed: int, position: int) -> None:
        with cupy.cuda.Device(self._device_id):
            self._state.set(np.array([seed, position, 0], dtype=np.uint64))

    # -- draws -----------------------------------------------------------------------------

    def rand(self, *size: int, dtype=np.float64) -> cupy.ndarray:
        """Uniform samples in [0, 1) of the given shape."""
        return self._fill(_shape(size), dtype, _UNIFORM, 1.0, 0.0)

    def randn(self, *size: int, dtype=np.float64) -> cupy.ndarray:
        """Standard normal samples of the given shape."""
        return self._fill(_shape(size), dtype, _NORMAL, 1.0, 0.0)

    def uniform(self, low: float = 0.0, high: float = 1.0, size=None,
                dtype=np.float64) -> cupy.ndarray:
        """Uniform samples in [low, high)."""
        return self._fill(_shape(size), dtype, _UNIFORM, float(high) - float(low), float(low))

    def normal(self, loc: float = 0.0, scale: float = 1.0, size=None,
               dtype=np.float64) -> cupy.ndarray:
        """Normal samples with mean ``loc`` and standard deviation ``scale``."""
        if scale < 0:
            raise OptionsError("scale", scale, "allowed values are numbers >= 0")
        return self._fill(_shape(size), dtype, _NORMAL, float(scale), float(loc))

    def randint(self, low: int, high: int | None = None, size=None,
                dtype=np.int64) -> cupy.ndarray:
        """Integers in [low, high) (or [0, low) when ``high`` is omitted)."""
        if high is None:
            low, high = 0, low
        low, high = int(low), int(high)
        dt = np.dtype(dtype)
        if dt not in _INTS:
            raise OptionsError("dtype", dtype, "allowed values are int32 and int64")
        info = np.iinfo(dt)
        if not (low < high and info.min <= low and high - 1 <= info.max):
            raise OptionsError("high", high, f"an integer with low < high and both within "
                                             f"{dt} (got low={low})")
        shape = _shape(size)
        out = cupy.empty(shape, dtype=dt)
        if out.size:
            self._launch(_INTS[dt], out, (np.int64(low), np.uint64(high - low)),
                         _philox.counters_for("u32", out.size, wide=high - low > 2**32))
        return out

    def bernoulli(self, p, size=None, dtype=np.float32) -> cupy.ndarray:
        """1 with probability ``p`` and 0 otherwise.

        Parameters
        ----------
        p : float or cupy.ndarray
            Probability (an array broadcasts against ``size``).
        """
        if not isinstance(p, cupy.ndarray) and not 0.0 <= float(p) <= 1.0:
            raise OptionsError("p", p, "allowed values are probabilities in [0, 1]")
        shape = _shape(size) if size is not None else getattr(p, "shape", ())
        draws = self._fill(shape, np.float32, _UNIFORM, 1.0, 0.0)
        return (draws < p).astype(dtype)

    def _fill(self, shape: tuple, dtype, kind: int, a: float, b: float) -> cupy.ndarray:
        dt = np.dtype(dtype)
        name = _FLOATS.get(dt)
        if name is None:
            raise OptionsError("dtype", dtype, "allowed values are float16, float32, float64")
        if kind == _UNIFORM and dt == np.float16:
            kind = _UNIFORM_HALF
        out = cupy.empty(shape, dtype=dt)
        if out.size:
            scalar = np.float64 if dt == np.float64 else np.float32
            family = "u64" if dt == np.float64 else "u32"
            self._launch(name, out, (np.int32(kind), scalar(a), scalar(b)),
                         _philox.counters_for(family, out.size))
        return out

    def _launch(self, name: str, out: cupy.ndarray, extra: tuple, counters: int) -> None:
        if _cuda.get_device() != self._device_id:
            raise OptionsError("device", _cuda.get_device(),
                               f"draw on the generator's device {self._device_id}")
        kernel = _device.kernel(name, self._device_id)
        kernel((_device.blocks_for(counters),), (_device.THREADS,),
               (self._state, out, np.int64(out.size)) + extra + (np.int32(1),))

    def __repr__(self) -> str:
        return f"<cugraphrt.random.Generator device={self._device_id} seed={self._seed}>"


def _shape(size) -> tuple:
    if size is None:
        return ()
    if isinstance(size, (int, np.integer)):
        return (int(size),)
    if len(size) == 1 and isinstance(size[0], Sequence):
        size = size[0]
    return tuple(int(s) for s in size)


# -- the default generators and module-level functions ----------------------------------------

_defaults: dict[int, Generator] = {}
_defaults_lock = threading.Lock()


def default_generator(device: int | None = None) -> Generator:
    """The process-wide default generator of ``device`` (the current device by default).

    Created on first use, which may be inside a capture: its state is then written eagerly
    on a side stream, so draws in the captured graph start from the seed.
    """
    device_id = _cuda.get_device() if device is None else int(device)
    generator = _defaults.get(device_id)
    if generator is None:
        with _defaults_lock:
            generator = _defaults.get(device_id)
            if generator is None:
                env = os.environ.get("CUGRAPHRT_SEED")
                generator = _outside_capture(Generator, int(env) if env else None, device_id)
                _defaults[device_id] = generator
    return generator


def _outside_capture(make, *args):
    """``make(*args)`` run eagerly, even while this thread captures.

    The default generator must work on its first use, and that may be inside a capture. Its
    state is then written on a side stream that does not capture, from CuPy's own memory
    pool (the capture router sends only the capture's streams to the graph's pool), in
    relaxed capture mode (the allocation, the seed's host-to-device copy and the side
    stream's synchronization are unsafe calls a global-mode capture would refuse), so the
    graph only reads and advances state that exists before any replay.
    """
    if _capture.current_capture() is None and not _capture.is_current_stream_capturing():
        return make(*args)
    side = cupy.cuda.Stream(non_blocking=True)
    with _cuda.relaxed_capture_mode(), side:
        made = make(*args)
        side.synchronize()
    return made


def _ensure_default_generator() -> None:
    """Called before captures begin, so a first draw inside a capture finds its state."""
    default_generator()


def manual_seed(seed: int) -> None:
    """Seed the current device's default generator (position back to 0)."""
    default_generator().manual_seed(seed)


def seed() -> int:
    """Reseed the current device's default generator from the OS; returns the seed."""
    return default_generator().seed()


def get_state() -> GeneratorState:
    """State of the current device's default generator."""
    return default_generator().get_state()


def set_state(state: GeneratorState) -> None:
    """Restore the current device's default generator."""
    default_generator().set_state(state)


def rand(*size: int, dtype=np.float64) -> cupy.ndarray:
    """Uniform [0, 1) samples from the default generator."""
    return default_generator().rand(*size, dtype=dtype)


def randn(*size: int, dtype=np.float64) -> cupy.ndarray:
    """Standard normal samples from the default generator."""
    return default_generator().randn(*size, dtype=dtype)


def uniform(low: float = 0.0, high: float = 1.0, size=None, dtype=np.float64) -> cupy.ndarray:
    """Uniform [low, high) samples from the default generator."""
    return default_generator().uniform(low, high, size, dtype)


def normal(loc: float = 0.0, scale: float = 1.0, size=None, dtype=np.float64) -> cupy.ndarray:
    """Normal samples from the default generator."""
    return default_generator().normal(loc, scale, size, dtype)


def randint(low: int, high: int | None = None, size=None, dtype=np.int64) -> cupy.ndarray:
    """Integers in [low, high) from the default generator."""
    return default_generator().randint(low, high, size, dtype)


def bernoulli(p, size=None, dtype=np.float32) -> cupy.ndarray:
    """Bernoulli(p) samples (1 or 0) from the default generator."""
    return default_generator().bernoulli(p, size, dtype)

