"""The GPU suite's one-GPU parts (.ci/gpu-suite one-gpu / one-gpu-memory) run the tests that
read the whole device's memory alone: every such test file must be in .ci/memory-readers, or
another process's allocations on the same GPU would move its readings."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
#: What marks a test file as reading the whole device's memory: the call itself, or the
#: helpers that make it.
READS = re.compile(r"mem_get_info|memGetInfo|tests\.lifetimes|from \._measure import")


def _listed() -> list[str]:
    lines = (ROOT / ".ci" / "memory-readers").read_text().splitlines()
    return [line.strip() for line in lines if line.strip() and not line.startswith("#")]


def _covered(path: str, listed: list[str]) -> bool:
    return any(path == entry or path.startswith(entry.rstrip("/") + "/") for entry in listed)


def test_every_test_file_reading_device_memory_is_listed():
    listed = _listed()
    readers = sorted(str(path.relative_to(ROOT)) for path in (ROOT / "tests").rglob("test_*.py")
                     if path != Path(__file__).resolve() and READS.search(path.read_text()))
    assert "tests/torch/test_lifetimes_gpu.py" in readers  # the pattern finds them
    missing = [path for path in readers if not _covered(path, listed)]
    assert not missing, f"add to .ci/memory-readers: {missing}"


def test_every_listed_path_exists():
    assert [entry for entry in _listed() if not (ROOT / entry).exists()] == []
    assert not _covered("tests/torch/test_generation_gpu.py", _listed())
