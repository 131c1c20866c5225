"""Imported first by the package: CuPy must be importable, or say which extra installs it.

CuPy comes from an extra chosen by CUDA version (``cuda13``, ``cuda12``); without it every
module of cugraphrt would fail with a bare ``No module named 'cupy'``.
"""

from __future__ import annotations

__all__: list[str] = []

try:
    import cupy  # noqa: F401
except ImportError as _exc:
    if not (_exc.name or "").startswith(("cupy", "cupy_backends")):
        raise  # CuPy is there but something it needs is not: its own message says what
    raise ImportError(
        f"cugraphrt needs CuPy (got: {_exc}); install cugraphrt with the CuPy extra for your "
        f'CUDA version: pip install "cugraphrt[cuda13]" (CUDA 13) or '
        f'pip install "cugraphrt[cuda12]" (CUDA 12); in a clone of cugraphrt: '
        f'pip install -e ".[cuda13]"',
        name=_exc.name,
    ) from _exc
