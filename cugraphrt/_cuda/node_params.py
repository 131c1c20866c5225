"""Reading the parameters of a graph's nodes, and setting them in its executable.

What :mod:`cugraphrt._callables.rebind_plan` needs to find where an address appears in a
graph and to change it between launches without capturing again:

* a kernel node's parameters as bytes, one entry per parameter with its offset and size in
  the device-side layout (``cuFuncGetParamInfo``, CUDA 12.4+; ``cuKernelGetParamInfo`` for a
  node that names a ``CUkernel``);
* memcpy and memset nodes' addresses;
* setters that write new parameters into the executable (``cuGraphExecKernelNodeSetParams``,
  ``cuGraphExecMemcpyNodeSetParams``, ``cuGraphExecMemsetNodeSetParams``). CUDA applies them
  to later launches only: a launch already queued keeps the parameters it was queued with.

A kernel setter owns the bytes it passes: a host buffer laid out like the device-side
parameters, and the ``void**`` array pointing into it. Changing an address is a store into
that buffer followed by one setter call, about 1.5 µs of driver time per node on an H100
(docs/rebinding.md).

Everything goes through NVIDIA's ``cuda-bindings`` and
:func:`cugraphrt._cuda.runtime.error_from_status`, as :mod:`cugraphrt._cuda.graph_nodes` does.
"""

from __future__ import annotations

import ctypes
from typing import Any

import numpy

from cugraphrt._cuda import runtime as _cuda
from cugraphrt._cuda.conditional import driver_api, unpack

__all__ = ["KernelParams", "kernel_params", "copy_params", "set_params", "ExecSetter"]

# The most parameters one kernel may take: CUDA's parameter space is 32 KiB, and a parameter
# takes at least one byte. The loop below stops at the first index CUDA refuses.
_MAX_PARAMS = 32768


# The keys of a launch's ``extra`` array (cuda.h): the whole parameter buffer, its size, the end.
_BUFFER_POINTER, _BUFFER_SIZE, _END = 1, 2, 0


class KernelParams:
    """A kernel node's parameters: ``offsets``, ``sizes`` and ``raw`` bytes of each, as the
    device-side layout has them; ``size`` is the end of the last one. ``packed``: they came
    as one buffer through ``extra`` (cuBLASLt and cuDNN launch this way), one entry at 0.
    ``why_not`` is None, or why they cannot be read (then the other fields are empty)."""

    __slots__ = ("params", "offsets", "sizes", "raw", "size", "why_not", "packed")

    def __init__(self, params: Any, offsets: list[int], sizes: list[int], raw: list[bytes],
                 why_not: str | None = None, packed: bool = False) -> None:
        self.params = params
        self.offsets = offsets
        self.sizes = sizes
        self.raw = raw
        self.size = max((o + s for o, s in zip(offsets, sizes, strict=True)), default=0)
        self.why_not = why_not
        self.packed = packed


def _packed(params: Any, extra: int) -> KernelParams:
    """The parameters of a launch through ``extra``: {BUFFER_POINTER, p, BUFFER_SIZE, &n, END}."""
    buffer = size = None
    entries = (ctypes.c_void_p * 16).from_address(extra)
    for i in range(0, 16, 2):
        key = entries[i] or 0
        if key == _END:
            break
        if key == _BUFFER_POINTER:
            buffer = entries[i + 1] or 0
        elif key == _BUFFER_SIZE:
            size = ctypes.c_size_t.from_address(entries[i + 1] or 0).value
        else:
            return KernelParams(params, [], [], [], f"its 'extra' holds key {key}")
    if not buffer or size is None:
        return KernelParams(params, [], [], [], "its 'extra' holds no parameter buffer")
    return KernelParams(params, [0], [size], [ctypes.string_at(buffer, size)], packed=True)


def _param_info(params: Any) -> list[tuple[int, int]] | None:
    driver = driver_api()
    func = params.func
    if int(func):
        query, target = driver.cuFuncGetParamInfo, func
    elif int(params.kern):
        query, target = driver.cuKernelGetParamInfo, params.kern
    else:
        return None
    found = []
    for index in range(_MAX_PARAMS):
        result = query(target, index)
        if int(result[0]) != _cuda.SUCCESS:  # past the last parameter: INVALID_VALUE
            break
        found.append((int(result[1]), int(result[2])))
    return found


def kernel_params(node: Any) -> KernelParams:
    """The parameters of kernel node ``node`` (see :class:`KernelParams`)."""
    params = unpack(driver_api().cuGraphKernelNodeGetParams(node), "cuGraphKernelNodeGetParams")
    if int(params.extra or 0):
        return _packed(params, int(params.extra))
    info = _param_info(params)
    if info is None:
        return KernelParams(params, [], [], [], "it names no function CUDA can describe")
    pointers = int(params.kernelParams or 0)
    if info and not pointers:
        return KernelParams(params, [], [], [], "CUDA gives no parameter values for it")
    table = (ctypes.c_void_p * len(info)).from_address(pointers) if info else ()
    raw = [ctypes.string_at(table[i] or 0, size) for i, (_, size) in enumerate(info)]
    return KernelParams(params, [o for o, _ in info], [s for _, s in info], raw)


def copy_params(node: Any) -> Any:
    """A memcpy node's ``CUDA_MEMCPY3D``."""
    return unpack(driver_api().cuGraphMemcpyNodeGetParams(node), "cuGraphMemcpyNodeGetParams")


def set_params(node: Any) -> Any:
    """A memset node's ``CUDA_MEMSET_NODE_PARAMS``."""
    return unpack(driver_api().cuGraphMemsetNodeGetParams(node), "cuGraphMemsetNodeGetParams")


class ExecSetter:
    """Writes one node's parameters into an executable: ``setter(exec_obj)``.

    ``words`` is a ``uint64`` array the caller stores new addresses into (a view of a larger
    one, so that one store serves every node). For a kernel node it holds the parameters in
    the device-side layout, and the ``void**`` array CUDA reads points into it; for memcpy
    and memset nodes it holds the values of the address ``fields``, copied into the params
    object on each call.
    """

    __slots__ = ("node", "kind", "words", "_params", "_table", "_fields", "_call", "_ctx",
                 "_name", "_size")

    def __init__(self, node: Any, kind: str, params: Any, words: numpy.ndarray, *,
                 layout: KernelParams | None = None, fields: tuple[str, ...] = ()) -> None:
        driver = driver_api()
        self.node = node
        self.kind = kind
        self.words = words
        self._params = params
        self._fields = fields
        self._ctx = None
        self._table: Any = None
        if kind == "KERNEL":
            assert layout is not None
            view = words.view(numpy.uint8)
            for offset, data in zip(layout.offsets, layout.raw, strict=True):
                view[offset:offset + len(data)] = numpy.frombuffer(data, dtype=numpy.uint8)
            base = words.ctypes.data
            if layout.packed:  # one buffer, as the capture had it: {POINTER, SIZE, END}
                self._size = ctypes.c_size_t(layout.size)
                self._table = (ctypes.c_void_p * 5)(
                    _BUFFER_POINTER, base, _BUFFER_SIZE, ctypes.addressof(self._size), _END)
                params.kernelParams = 0
                params.extra = ctypes.addressof(self._table)
            else:
                self._table = (ctypes.c_void_p * max(len(layout.offsets), 1))(
                    *[base + offset for offset in layout.offsets])
                params.kernelParams = ctypes.addressof(self._table)
                params.extra = 0
            self._call = driver.cuGraphExecKernelNodeSetParams
            self._name = "cuGraphExecKernelNodeSetParams"
        else:
            words[:] = [int(getattr(params, field)) for field in fields]
            self._ctx = unpack(driver.cuCtxGetCurrent(), "cuCtxGetCurrent")
            if kind == "MEMCPY":
                self._call, self._name = (driver.cuGraphExecMemcpyNodeSetParams,
                                          "cuGraphExecMemcpyNodeSetParams")
            else:
                self._call, self._name = (driver.cuGraphExecMemsetNodeSetParams,
                                          "cuGraphExecMemsetNodeSetParams")

    @staticmethod
    def words_for(kind: str, layout: KernelParams | None, fields: tuple[str, ...]) -> int:
        """How many ``uint64`` words a setter of this node needs."""
        if kind == "KERNEL":
            assert layout is not None
            return (layout.size + 7) // 8 or 1
        return len(fields)

    def __call__(self, exec_obj: Any) -> None:
        if self._ctx is None:
            status = self._call(exec_obj, self.node, self._params)[0]
        else:
            params = self._params
            for field, value in zip(self._fields, self.words.tolist(), strict=True):
                setattr(params, field, value)
            status = self._call(exec_obj, self.node, params, self._ctx)[0]
        if status:  # CUDA_SUCCESS is 0
            raise _cuda.error_from_status(int(status), self._name)
