"""torch.compile(backend="cugraphrt", options={"buckets": ...}) on a GPU, against eager."""

from __future__ import annotations

import copy
import warnings

import pytest

from ._compile_reports import CompileReports

torch = pytest.importorskip("torch")

pytestmark = pytest.mark.gpu

_reports = CompileReports()


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    yield from _reports.around_test()


def _dynamic_reports():
    return [r for r in _reports() if r.buckets or r.bucket_note]


def _mlp():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.GELU(),
                               torch.nn.Linear(64, 8)).cuda().eval()


def _batch(n):
    x = torch.randn(n, 32, device="cuda")
    torch._dynamo.mark_dynamic(x, 0)
    return x


@pytest.mark.parametrize("compiler", ["inductor", "aot_eager"])
def test_every_batch_size_is_served_by_the_smallest_bucket_that_fits(compiler, exact_math):
    model = _mlp()
    control = copy.deepcopy(model)
    compiled = torch.compile(model, backend="cugraphrt",
                             options={"compiler": compiler, "buckets": [4, 8, 16]})
    sizes = (3, 5, 8, 11, 16, 2, 7, 13, 3, 16)
    with torch.no_grad():
        for n in sizes:
            x = _batch(n)
            got = compiled(x)
            assert got.shape == (n, 8)
            torch.testing.assert_close(got, control(x), rtol=1e-4, atol=1e-5)
    (report,) = _dynamic_reports()
    # The first call warms up; every size after it is one of three bucket graphs.
    assert report.graphed and report.buckets == (4, 8, 16) and report.graphs == 3
    assert report.replays == len(sizes) - 1 and report.bucket_note is None


def test_pow2_buckets_and_sizes_above_them_get_their_own_recording(exact_math):
    model = _mlp()
    control = copy.deepcopy(model)
    compiled = torch.compile(model, backend="cugraphrt",
                             options={"compiler": "aot_eager", "buckets": "pow2",
                                      "max_bucket": 8})
    with torch.no_grad():
        for n in (6, 6, 3, 20, 20, 20, 5):
            x = _batch(n)
            torch.testing.assert_close(compiled(x), control(x), rtol=1e-4, atol=1e-5)
    (report,) = _dynamic_reports()
    # Buckets 4 and 8 hold graphs; size 20 is above them: warmed up, then recorded alone.
    assert report.buckets == (4, 8) and report.graphs == 3


def test_pieces_buckets_cannot_serve_keep_one_graph_per_size(exact_math):
    def flat(x):
        return torch.tanh(x).reshape(-1) * 2      # the output's size is 32*s0

    compiled = torch.compile(flat, backend="cugraphrt",
                             options={"compiler": "aot_eager", "buckets": [4, 8]})
    for n in (3, 3, 5, 5, 3):
        x = _batch(n)
        torch.testing.assert_close(compiled(x), flat(x))
    (report,) = _dynamic_reports()
    assert report.buckets == () and report.graphs == 2
    assert "derived from" in report.bucket_note
    import cugraphrt_torch

    assert "no buckets: output 0" in cugraphrt_torch.format_compile_report()


def test_a_moved_weight_releases_the_bucket_graphs_and_they_read_the_new_one():
    def scaled(weight, x):
        return x @ weight + 1

    weights = [torch.randn(16, 16, device="cuda") for _ in range(2)]
    for w in weights:
        torch._dynamo.mark_static_address(w, guard=False)
    compiled = torch.compile(scaled, backend="cugraphrt",
                             options={"compiler": "aot_eager", "buckets": [4, 8]})
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for w in weights:
            for n in (3, 6, 3):
                x = torch.randn(n, 16, device="cuda")
                torch._dynamo.mark_dynamic(x, 0)
                torch.testing.assert_close(compiled(w, x), scaled(w, x))
    (report,) = _dynamic_reports()
    assert report.rerecords == 1 and report.buckets == (4, 8)
    assert not [w for w in caught if "cugraphrt" in str(w.message) or "piece" in
                str(w.message)], "a moved static re-records within max_rerecords silently"
