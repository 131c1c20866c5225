"""torch.compile(backend="cugraphrt", options={"eager_numerics": "exact"}) on a GPU: inference
results bit for bit eager's, in three dtypes, over ops where Inductor's own kernels differ."""

from __future__ import annotations

import math

import pytest

from ._compile_reports import CompileReports

torch = pytest.importorskip("torch")

pytestmark = pytest.mark.gpu

_reports = CompileReports()


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    yield from _reports.around_test()


class Block(torch.nn.Module):
    """The ops of a transformer block and then some: RMS and layer norms, rotary cos/sin,
    softmax attention with a division, SiLU, GELU (erf and tanh), sigmoid, exp, biases."""

    def __init__(self, width=64):
        super().__init__()
        self.qkv = torch.nn.Linear(width, 3 * width)
        self.up = torch.nn.Linear(width, 2 * width, bias=False)
        self.down = torch.nn.Linear(2 * width, width)
        self.norm = torch.nn.LayerNorm(width)
        self.scale = torch.nn.Parameter(torch.ones(width))

    def forward(self, x):
        h = x.float()
        h = (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-6)).to(x.dtype) * self.scale
        q, k, v = self.qkv(h).chunk(3, -1)
        angles = torch.arange(x.shape[1], device=x.device, dtype=torch.float32)[:, None] * \
            torch.linspace(0.01, 1.0, q.shape[-1] // 2, device=x.device)
        cos, sin = torch.cat([angles, angles], -1).cos().to(x.dtype), \
            torch.cat([angles, angles], -1).sin().to(x.dtype)
        q = q * cos + torch.cat([-q[..., q.shape[-1] // 2:], q[..., :q.shape[-1] // 2]], -1) * sin
        scores = (q @ k.transpose(-1, -2)) / math.sqrt(q.shape[-1])
        h = h + torch.softmax(scores.float(), -1).to(x.dtype) @ v
        g = self.up(self.norm(h))
        a, b = g.chunk(2, -1)
        g = torch.cat([torch.nn.functional.silu(a) * b,
                       torch.nn.functional.gelu(a, approximate="tanh") + torch.sigmoid(b)], -1)
        out = h + self.down(torch.nn.functional.gelu(g)) * torch.exp(-h.abs())
        return out / (1 + out.abs())


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_inference_is_eager_bit_for_bit(dtype, exact_math):
    torch.manual_seed(0)
    model = Block().to("cuda", dtype).eval()
    compiled = torch.compile(model, backend="cugraphrt", options={"eager_numerics": "exact"})
    with torch.no_grad():
        for seed in range(4):
            x = torch.randn(4, 16, 64, device="cuda", dtype=dtype,
                            generator=torch.Generator("cuda").manual_seed(seed))
            got, expected = compiled(x), model(x)
            assert torch.equal(got, expected), (got.float() - expected.float()).abs().max()
    (report,) = _reports()
    assert report.graphed and report.replays == 3
