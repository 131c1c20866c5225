"""The torch scripts of docs/experiments/ still name what they time.

``capture_time_steps.py`` times a build by wrapping the adapter's own functions; a renamed one
breaks the script at import (``_Instantiate`` became ``Instantiate`` in the adapter's move to
folders, and the figures of docs/performance.md could no longer be re-made). Loading it needs
no GPU: the steps are looked up, not run.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

pytest.importorskip("torch")

SCRIPT = Path(__file__).resolve().parents[2] / "docs" / "experiments" / "capture_time_steps.py"


def test_every_step_the_capture_time_script_wraps_exists():
    spec = importlib.util.spec_from_file_location("capture_time_steps", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # builds STEPS: an AttributeError for a stale name
    missing = [label for owner, name, label in module.STEPS
               if not callable(getattr(owner, name, None))]
    assert not missing, missing
    assert len(module.STEPS) >= 20
