"""cugraphrt_torch.while_loop / cond without a GPU: arguments and predicates."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

import cugraphrt_torch  # noqa: E402

from cugraphrt import CaptureError, OptionsError  # noqa: E402


def test_arguments_are_checked_first():
    with pytest.raises(OptionsError, match="'body_fn'"):
        cugraphrt_torch.while_loop(lambda: None, 3)
    with pytest.raises(OptionsError, match="'max_iters'"):
        cugraphrt_torch.while_loop(lambda: None, lambda: None, max_iters=-2)
    with pytest.raises(OptionsError, match="'true_fn'"):
        cugraphrt_torch.cond(torch.tensor(True), None)


@pytest.mark.parametrize("pred,got", [
    (torch.tensor(True), "a cpu tensor of shape () and dtype torch.bool"),
    (torch.ones(2, dtype=torch.bool), "a cpu tensor of shape (2,)"),
    (True, "bool"),
])
def test_predicate_must_be_a_0d_cuda_tensor(pred, got):
    with pytest.raises(CaptureError, match="pred must be a 0-d bool or integer CUDA tensor") \
            as info:
        cugraphrt_torch.cond(pred, lambda: None)
    assert f"(got {got}" in str(info.value)
