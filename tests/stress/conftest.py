"""The reliability suite: each case runs short in the normal GPU run and long under --stress.

A case takes the ``level`` fixture (parametrized "short" and "long"; the long one is marked
``stress``) and asks it for its sizes: ``level.pick(short=..., long=...)``. Figures the cases
record with ``figures.add(...)`` are printed at the end of the run (they feed
docs/reliability.md).
"""

from __future__ import annotations

import gc

import pytest

from tests.gpu.conftest import randn, rng  # noqa: F401 - shared fixtures

_FIGURES: list[tuple[str, str]] = []


class Level:
    def __init__(self, name: str) -> None:
        self.name = name

    def pick(self, short, long):
        return long if self.name == "long" else short


@pytest.fixture(params=["short", pytest.param("long", marks=pytest.mark.stress)])
def level(request):
    return Level(request.param)


class Figures:
    def add(self, case: str, text: str) -> None:
        _FIGURES.append((case, text))
        print(f"{case}: {text}")


@pytest.fixture
def figures():
    return Figures()


@pytest.fixture(autouse=True)
def _clean_state():
    """No capture underway before or after a case, and nothing left for the next one."""
    from cugraphrt._capture import stream_capture as _capture
    from cugraphrt._memory.backing import capture_activity

    yield
    leaked = list(_capture._tls.captures)
    for capture in leaked:
        _capture.abort(capture)
    gc.collect()
    assert not leaked, "a case left a capture underway"
    assert capture_activity.active == 0, "a capture of another thread is still counted"


def pytest_terminal_summary(terminalreporter):
    if not _FIGURES:
        return
    terminalreporter.section("reliability figures")
    for case, text in _FIGURES:
        terminalreporter.write_line(f"{case}: {text}")
