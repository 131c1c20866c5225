"""Device-side control flow: :func:`cugraphrt.while_loop` and :func:`cugraphrt.cond`.

:mod:`.loops` decides and validates; the conditional nodes themselves are built by
:mod:`cugraphrt._cuda.conditional`.
"""
