"""What an installed cugraphrt holds: its version, entry points and type markers.

These read the installed distribution's metadata (importlib.metadata), so they check an
editable install and an installed wheel alike (.ci/run runs them against both).
"""

from __future__ import annotations

import importlib
import importlib.metadata as metadata
import importlib.util
from pathlib import Path

import pytest

import cugraphrt


@pytest.fixture(scope="module")
def dist() -> metadata.Distribution:
    try:
        return metadata.distribution("cugraphrt")
    except metadata.PackageNotFoundError:
        pytest.skip("cugraphrt is not installed here (no distribution metadata): "
                    'pip install -e ".[cuda13,test]" first')


def _entry_point(dist: metadata.Distribution, group: str) -> metadata.EntryPoint:
    found = [ep for ep in dist.entry_points if ep.group == group and ep.name == "cugraphrt"]
    assert len(found) == 1, f"entry points named cugraphrt in {group}: {found}"
    return found[0]


def test_the_version_has_one_source(dist):
    assert dist.version == cugraphrt.__version__
    assert dist.version.count(".") >= 2 and dist.version[0].isdigit(), dist.version


def test_console_script_runs_the_cli(dist):
    from cugraphrt import cli

    script = _entry_point(dist, "console_scripts")
    assert script.value == "cugraphrt.cli:main"
    assert script.load() is cli.main


def test_dynamo_backend_entry_point_names_the_backend(dist):
    backend = _entry_point(dist, "torch_dynamo_backends")
    assert backend.value == "cugraphrt_torch.compile.dynamo:backend"
    if importlib.util.find_spec("torch") is None:
        pytest.skip("torch is not installed: the entry point is named right, loading it "
                    "needs torch (pip install torch)")
    from cugraphrt_torch.compile import dynamo

    assert backend.load() is dynamo.backend


@pytest.mark.parametrize("package", ["cugraphrt", "cugraphrt_torch"])
def test_each_package_ships_its_py_typed(package):
    # Where the package imports from (an installed wheel in .ci/run's wheel job), found
    # without importing it: cugraphrt_torch imports torch.
    spec = importlib.util.find_spec(package)
    assert spec is not None and spec.origin is not None, f"{package} is not importable"
    assert (Path(spec.origin).parent / "py.typed").is_file()
