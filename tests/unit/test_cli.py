"""The cugraphrt command on a machine without a GPU."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from cugraphrt.cli import NO_GPU_EXIT_CODE, InfoResult, main
from tests.conftest import NO_GPU_REASON

ROOT = Path(__file__).resolve().parents[2]
needs_no_gpu = pytest.mark.skipif(NO_GPU_REASON is None, reason="a GPU is present")


@needs_no_gpu
def test_info_says_no_gpu_and_exits_nonzero(capsys):
    assert main(["info"]) == NO_GPU_EXIT_CODE
    out = capsys.readouterr().out
    assert "cugraphrt" in out and "CuPy" in out
    assert "no CUDA GPU is available" in out


@needs_no_gpu
def test_info_json_is_a_valid_model(capsys):
    assert main(["info", "--json"]) == NO_GPU_EXIT_CODE
    info = InfoResult.model_validate_json(capsys.readouterr().out)
    assert info.gpus == [] and info.gpu_error


@needs_no_gpu
def test_python_dash_m_entry_point():
    result = subprocess.run([sys.executable, "-m", "cugraphrt", "info"], cwd=ROOT,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == NO_GPU_EXIT_CODE
    assert "no CUDA GPU is available" in result.stdout


def test_unknown_subcommand_is_an_argparse_error(capsys):
    with pytest.raises(SystemExit) as info:
        main(["frobnicate"])
    assert info.value.code == 2
    assert "invalid choice" in capsys.readouterr().err


def test_info_reports_torch_state():
    from cugraphrt.cli import collect_info

    info = collect_info()
    assert (info.torch_version is None) != (info.torch_error is None)
    json.loads(info.model_dump_json())
