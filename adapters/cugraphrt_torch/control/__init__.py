"""``while_loop`` and ``cond``: loops and branches decided on the device, captured as CUDA
conditional nodes (``control``). Built on :mod:`..capture`."""
