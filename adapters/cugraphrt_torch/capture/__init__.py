"""The ground floor: torch's memory during a capture (``_alloc``), streams shared with CuPy
(``_torch``), the capture itself and its warm-ups (``capture``, ``_fence``), what it hands
back and the adopted graph's lifetime (``_adopted``: ``CapturedGraph``, ``Owner``,
``Replay``), ``torch.cuda``'s graph names (``cuda_graph``), the collectives recorded during a
capture (``_collective_mode``, ``_lifecycle``), DLPack conversion (``dlpack``), the adapter's
Framework (``framework``), the overwritten-output check and the capture errors. Everything
above builds on it; it imports only the core's public names and ``_internals``."""
