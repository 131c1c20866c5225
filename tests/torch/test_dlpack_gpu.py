"""to_cupy / from_cupy on a GPU: same memory, shape, strides, dtype and device."""

from __future__ import annotations

import importlib.util

import numpy
import pytest

torch = pytest.importorskip("torch")

import cugraphrt_torch  # noqa: E402
import cupy  # noqa: E402
from cugraphrt_torch.capture.dlpack import cupy_dtype_name  # noqa: E402

import cugraphrt  # noqa: E402
from cugraphrt import OptionsError  # noqa: E402
from tests.conftest import torch_gpu_marks  # noqa: E402

pytestmark = torch_gpu_marks(torch)

DTYPES = [torch.float32, torch.float16, torch.float64, torch.int8, torch.uint8, torch.int16,
          torch.int32, torch.int64, torch.bool, torch.complex64]


def _random(dtype, shape):
    if dtype is torch.bool:
        return torch.rand(shape, device="cuda") > 0.5
    if dtype.is_complex or dtype.is_floating_point:
        return torch.randn(shape, device="cuda", dtype=dtype)
    low = 0 if dtype is torch.uint8 else -100
    return torch.randint(low, 100, shape, device="cuda", dtype=dtype)


def _assert_same_view(array, tensor):
    assert array.data.ptr == tensor.data_ptr()
    assert array.shape == tuple(tensor.shape)
    assert array.strides == tuple(s * tensor.element_size() for s in tensor.stride())
    assert array.dtype.name == cupy_dtype_name(tensor.dtype)
    assert array.device.id == tensor.device.index


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_to_cupy_is_a_view_of_a_strided_tensor(dtype):
    tensor = _random(dtype, (6, 10))[1:, 2:8].T  # offset, non-contiguous
    array = cugraphrt_torch.to_cupy(tensor)
    _assert_same_view(array, tensor)
    numpy.testing.assert_array_equal(cupy.asnumpy(array), tensor.cpu().numpy())


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_from_cupy_is_a_view_of_a_strided_array(dtype):
    source = cugraphrt_torch.to_cupy(_random(dtype, (8, 12)))
    array = cupy.array(source)[::2, 1::3]  # a CuPy-owned, strided array
    tensor = cugraphrt_torch.from_cupy(array)
    _assert_same_view(array, tensor)
    numpy.testing.assert_array_equal(tensor.cpu().numpy(), cupy.asnumpy(array))


def test_round_trip_keeps_the_pointer_and_writes_show_through():
    tensor = torch.randn(128, 64, device="cuda")
    back = cugraphrt_torch.from_cupy(cugraphrt_torch.to_cupy(tensor))
    assert back.data_ptr() == tensor.data_ptr()
    assert back.stride() == tensor.stride() and back.dtype is tensor.dtype
    assert back.device == tensor.device
    back.mul_(3)
    torch.cuda.synchronize()
    assert torch.equal(back, tensor)

    array = cupy.random.standard_normal((40, 30)).astype(cupy.float32)
    again = cugraphrt_torch.to_cupy(cugraphrt_torch.from_cupy(array))
    assert again.data.ptr == array.data.ptr
    again += 1
    cupy.testing.assert_array_equal(again, array)


def test_bfloat16_converts_or_says_what_is_missing():
    tensor = torch.randn(16, 8, device="cuda", dtype=torch.bfloat16)
    if importlib.util.find_spec("ml_dtypes") is None:
        with pytest.raises(OptionsError, match="ml_dtypes"):
            cugraphrt_torch.to_cupy(tensor)
        return
    try:
        array = cugraphrt_torch.to_cupy(tensor)
    except OptionsError as exc:  # a CuPy without bfloat16: the message must say so
        assert "bfloat16" in str(exc)
        return
    _assert_same_view(array, tensor)
    back = cugraphrt_torch.from_cupy(array)
    assert back.dtype is torch.bfloat16 and torch.equal(back, tensor)


def test_unexportable_tensors_are_refused_with_advice():
    with pytest.raises(OptionsError, match="detach"):
        cugraphrt_torch.to_cupy(torch.randn(3, device="cuda", requires_grad=True))
    if hasattr(torch, "float8_e4m3fn"):
        with pytest.raises(OptionsError, match="float8_e4m3fn"):
            cugraphrt_torch.to_cupy(torch.zeros(4, device="cuda").to(torch.float8_e4m3fn))


def test_views_across_streams_are_ordered():
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        source = torch.randn(1 << 20, device="cuda")
        produced = source * 3  # queued on `side`; CuPy reads it on its own stream
        array = cugraphrt_torch.to_cupy(produced)
        total = float(cupy.asnumpy(array.sum()))
    torch.cuda.synchronize()
    assert total == pytest.approx(float(produced.double().sum()), rel=1e-4)


def test_conversions_inside_a_capture_do_not_break_it():
    x = torch.randn(1000, device="cuda")
    g = cugraphrt.Graph()
    with cugraphrt_torch.graph(g):
        array = cugraphrt_torch.to_cupy(x * 2)
        out = cugraphrt_torch.from_cupy(array) + 1
    for _ in range(2):
        x.copy_(torch.randn(1000, device="cuda"))
        g.replay()
        torch.cuda.synchronize()
        torch.testing.assert_close(out, x * 2 + 1)
