"""Exit codes of the ``cugraphrt`` command, shared by its subcommands.

A module of its own, importing nothing, so that the CLI and the bench both read it while the
dependency runs one way only: the CLI dispatches to the bench, the bench never imports the CLI.
"""

from __future__ import annotations

__all__ = ["NO_GPU_EXIT_CODE"]

#: Exit code of every subcommand when no CUDA GPU is available.
NO_GPU_EXIT_CODE = 2
