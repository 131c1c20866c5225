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


def test_the_loop_body_guard_refuses_draws_and_passes_what_does_not_draw():
    from cugraphrt_torch.control.control import _NoTorchRandom

    F = torch.nn.functional
    q = torch.randn(1, 2, 8, 16)
    x = torch.randn(32)
    lstm = torch.nn.LSTM(16, 8, num_layers=2, dropout=0.3).eval()
    with _NoTorchRandom():
        F.scaled_dot_product_attention(q, q, q, is_causal=True)  # dropout_p=0: no draw
        F.dropout(x, 0.5, training=False)
        F.dropout(x, 0.0, training=True)
        lstm(q[0, 0][:, None, :])
        for draw in (lambda: torch.rand(3), lambda: torch.randn_like(x),
                     lambda: F.dropout(x, 0.5, training=True), lambda: x.bernoulli(),
                     lambda: F.scaled_dot_product_attention(q, q, q, dropout_p=0.1)):
            with pytest.raises(CaptureError, match="same numbers on every iteration"):
                draw()


def test_a_compiled_function_stays_compiled_inside_and_after_the_loop_body_guard():
    from cugraphrt_torch.control.control import _NoTorchRandom

    calls = {"compiles": 0, "compiled": 0}

    def backend(gm, example_inputs):
        calls["compiles"] += 1

        def run(*args):
            calls["compiled"] += 1
            return gm(*args)
        return run

    def step(x):
        return torch.sin(x) * 2 + 1

    torch._dynamo.reset()
    compiled = torch.compile(step, backend=backend)
    x = torch.randn(8)
    compiled(x)
    with _NoTorchRandom():
        torch.testing.assert_close(compiled(x), step(x))
    compiled(x)
    # Not run eagerly in the body, and not skipped by dynamo afterwards.
    assert calls == {"compiles": 1, "compiled": 3}
    torch._dynamo.reset()
