"""CUDA libraries inside captures: cuBLAS handles and workspaces, cuFFT plans, Philox.

:mod:`.capture_setup` runs before every capture; :mod:`.fft_plans` gives plans made during a
capture to its graph; :mod:`.philox` holds the counter-based generator behind
:mod:`cugraphrt.random`.
"""
