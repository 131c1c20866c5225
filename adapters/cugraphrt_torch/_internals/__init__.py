"""The adapter's floor for torch's and transformers' private names.

No other module of ``cugraphrt_torch`` touches a private name of torch (``torch._*``,
``torch._C``, dynamo, Inductor and functorch internals, an operator's ``_schema``, a
tensor's ``_version``) or of transformers (a cache's layer internals): they call the named
functions here, one module per area. ``tests/torch/test_torch_floor_cpu.py`` enforces it, as
``tests/unit/test_layers.py`` does for the core's CUDA floor.

Each function's docstring names the versions it was tested on. The matrix (docs/torch.md,
"Versions"): torch 2.11 with CUDA 13 on H100s and H200s (the GPU suite), torch 2.11, 2.13 and
2.14 on CPU (CI); transformers 5.17. torch 2.8 fails the CPU suite (a ``ReduceOp`` it does
not let one read, Inductor's CPU code generation under ``emulate_precision_casts``), so 2.11
is the lower bound. Where versions differ a function probes (``hasattr``,
``getattr`` with a default) and says what each version has, so a new release that drops a
name fails in one place, with a name, instead of silently in a user's program.

* :mod:`.cuda`: the caching allocator's hooks, the cuBLAS workspace cache, raw streams.
* :mod:`.tensors`: version counters, storage use counts and access marks, DLPack without
  the stream handshake, ``_foreach`` copies.
* :mod:`.ops`: operator schemas.
* :mod:`.autograd`: grad mode and autocast at C speed, functorch transforms, the C
  ``Function.apply``.
* :mod:`.compile`: dynamo, Inductor, AOTAutograd and functorch configuration and entry
  points.
* :mod:`.distributed`: the C10d process group class.
* :mod:`.transformers`: ``StaticCache`` and its layers.
* :mod:`.row_cache` and :mod:`.window_cache`: ``StaticCache`` layers that write each row at
  its own position, or hand a sliding-window layer's attention ``generate``'s keys, and the
  masks that go with them.
"""
