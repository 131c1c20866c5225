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


@needs_no_gpu
def test_info_without_a_gpu_says_what_to_do(capsys):
    assert main(["info"]) == NO_GPU_EXIT_CODE
    lines = capsys.readouterr().out.splitlines()
    no_gpu = [i for i, line in enumerate(lines) if line.startswith("no CUDA GPU is available")]
    assert no_gpu and lines[no_gpu[0] + 1].startswith("  what to do: "), lines


@pytest.mark.parametrize("status, driver, expected", [
    (35, 0, "no NVIDIA driver is loaded"),
    (35, 12040, "the driver supports CUDA up to 12.4, older than the CUDA 13.0 runtime"),
    (100, 13000, "the driver sees no GPU: check CUDA_VISIBLE_DEVICES"),
    (999, 13000, "check nvidia-smi"),
    (None, None, "check nvidia-smi")])
def test_gpu_advice_follows_the_cuda_status(status, driver, expected):
    from cugraphrt.cli import gpu_advice

    assert gpu_advice(status, driver, 13000).startswith(expected)


def test_info_names_a_missing_torch_as_optional():
    from cugraphrt.cli import _render_info

    info = InfoResult(cugraphrt_version="0", cupy_version="14",
                      torch_error="ModuleNotFoundError: No module named 'torch'")
    assert "torch         not installed (optional: the PyTorch adapter" in _render_info(info)
    broken = info.model_copy(update={"torch_error": "OSError: libcudnn.so.9 missing"})
    assert "torch         not importable (OSError: libcudnn.so.9 missing)" in (
        _render_info(broken))
