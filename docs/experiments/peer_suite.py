"""Runs a peer's own CUDA-graph tests as published and with only cugraphrt's names swapped in:
the check of docs/migrating.md, "Checking against the peers' own tests".

You supply the peer's test file (the project does not ship it): PyTorch's
``test/test_cuda.py`` (or an extraction of its graph tests) or CuPy's
``tests/cupy_tests/cuda_tests/test_graph.py``, from the versions installed. The script writes
the renamed copy beside a copy of the original in a temporary folder, runs pytest on both
(extra arguments go to pytest) and prints each run's summary line::

    python docs/experiments/peer_suite.py torch path/to/test_cuda.py -- -k graph
    python docs/experiments/peer_suite.py cupy path/to/test_graph.py
    python docs/experiments/peer_suite.py torch path/to/test_cuda.py --show   # the renamed file

The renames are exactly the migration's (docs/migrating.md): ``torch.cuda.{CUDAGraph, graph,
make_graphed_callables, graph_pool_handle, is_current_stream_capturing}`` become
``cugraphrt_torch``'s, ``cupy.cuda.Stream`` becomes ``cugraphrt.Stream``.
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

TORCH_NAMES = ("CUDAGraph", "graph", "make_graphed_callables", "graph_pool_handle",
               "is_current_stream_capturing")
_TORCH = re.compile(r"\btorch\.cuda\.(" + "|".join(TORCH_NAMES) + r")\b")
_CUPY = re.compile(r"\bcupy\.cuda\.Stream\b")
# CuPy's own tests say ``cuda.Stream`` after ``from cupy import cuda``.
_CUPY_SHORT = re.compile(r"(?<![\w.])cuda\.Stream\b")


def rename(source: str, peer: str) -> str:
    """``source`` with the peer's names replaced by cugraphrt's and the import added."""
    if peer == "torch":
        renamed = _TORCH.sub(r"cugraphrt_torch.\1", source)
        module = "cugraphrt_torch"
    elif peer == "cupy":
        renamed = _CUPY.sub("cugraphrt.Stream", source)
        if re.search(r"^from cupy import .*\bcuda\b", source, re.MULTILINE):
            renamed = _CUPY_SHORT.sub("cugraphrt.Stream", renamed)
        module = "cugraphrt"
    else:
        raise ValueError(f"peer must be 'torch' or 'cupy' (got {peer!r})")
    if renamed == source:
        raise ValueError(f"nothing to rename: the file uses none of {peer}'s graph names")
    # The import goes after the module docstring and __future__ imports, before the code.
    lines = renamed.splitlines(keepends=True)
    at = next((i + 1 for i, line in reversed(list(enumerate(lines)))
               if line.startswith("from __future__")), 0)
    lines.insert(at, f"import {module}  # added by docs/experiments/peer_suite.py\n")
    return "".join(lines)


def _summary(output: str) -> str:
    lines = [line.strip("= ") for line in output.splitlines() if " in " in line
             and any(word in line for word in ("passed", "failed", "error", "skipped"))]
    return lines[-1] if lines else "(no summary line: see the output above)"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("peer", choices=("torch", "cupy"))
    parser.add_argument("test_file", type=Path)
    parser.add_argument("--show", action="store_true", help="print the renamed file and stop")
    parser.add_argument("pytest_args", nargs="*", help="after --: arguments for pytest")
    args = parser.parse_args(argv)
    renamed = rename(args.test_file.read_text(), args.peer)
    if args.show:
        print(renamed, end="")
        return 0
    results = {}
    with tempfile.TemporaryDirectory() as folder:
        for label, text in (("as published", None), ("names swapped", renamed)):
            target = Path(folder) / label.replace(" ", "_") / args.test_file.name
            target.parent.mkdir()
            if text is None:
                shutil.copy(args.test_file, target)
            else:
                target.write_text(text)
            done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                                   str(target), *args.pytest_args], capture_output=True,
                                  text=True, cwd=target.parent)
            print(done.stdout[-4000:], done.stderr[-2000:], sep="\n")
            results[label] = _summary(done.stdout)
    for label, summary in results.items():
        print(f"{label}: {summary}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
