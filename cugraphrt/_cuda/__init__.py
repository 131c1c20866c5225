"""The floor: every call into CUDA and its libraries goes through this package.

* :mod:`.runtime`: the CUDA runtime (captures, launches, executables, memory, devices), with
  the one translation of CUDA statuses into cugraphrt's errors (``error_from_status``);
* :mod:`.conditional`: conditional graph nodes, through NVIDIA's ``cuda.bindings``;
* :mod:`.cublas`: the cuBLAS calls CuPy refuses inside a capture;
* :mod:`.status_errors`: errors that are also CuPy's (a CUDA status as CuPy raises it);
* :mod:`.devices`: which device a stream, pool or graph belongs to.

Nothing above this package imports ``cupy.cuda.runtime``, ``cuda.bindings`` or ``ctypes``
(``tests/unit/test_layers.py``).
"""
