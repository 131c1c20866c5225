"""CUDA libraries inside captures: cuBLAS GEMMs, cuFFT, reductions, and clear refusals."""

from __future__ import annotations

import cupy
import numpy as np
import pytest

import cugraphrt
from cugraphrt import CaptureError, Graph, graph

pytestmark = pytest.mark.gpu

TOLERANCE = {np.float16: 2e-2, np.float32: 1e-4, np.float64: 1e-10, np.complex64: 1e-4}

MATMULS = {
    "matmul_operator": lambda a, b: a @ b,
    "cupy.matmul": lambda a, b: cupy.matmul(a, b),
    "cupy.dot": lambda a, b: cupy.dot(a, b),
    "tensordot": lambda a, b: cupy.tensordot(a, b, axes=1),
    "einsum": lambda a, b: cupy.einsum("ij,jk->ik", a, b),
    "matvec": lambda a, b: a @ b[:, 0],
    "transposed": lambda a, b: a.T.copy().T @ b,
}


@pytest.mark.parametrize("dtype", list(TOLERANCE))
@pytest.mark.parametrize("name", list(MATMULS))
def test_matmul_family_replays_like_eager(name, dtype, randn):
    fn = MATMULS[name]
    a, b = randn((64, 48), dtype), randn((48, 32), dtype)
    fn(a, b)  # warm-up: CuPy's cuBLAS handle exists before the capture
    g = Graph()
    with graph(g):
        out = fn(a, b)
    for _ in range(3):
        na, nb = randn((64, 48), dtype), randn((48, 32), dtype)
        a[...] = na
        b[...] = nb
        g.replay()
        expected = fn(na, nb)
        ref = cupy.asnumpy(expected).astype(np.complex128)
        err = np.linalg.norm(cupy.asnumpy(out).astype(np.complex128) - ref)
        assert err <= TOLERANCE[dtype] * max(np.linalg.norm(ref), 1.0), (name, err)


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.complex64])
def test_batched_matmul_replays_like_eager(dtype, randn):
    a, b = randn((8, 16, 24), dtype), randn((8, 24, 12), dtype)
    a @ b
    g = Graph()
    with graph(g):
        out = cupy.matmul(a, b)
        broadcast = a @ b[0]
    na, nb = randn((8, 16, 24), dtype), randn((8, 24, 12), dtype)
    a[...] = na
    b[...] = nb
    g.replay()
    tol = TOLERANCE[dtype]
    cupy.testing.assert_allclose(out, na @ nb, rtol=tol * 10, atol=tol * 10)
    cupy.testing.assert_allclose(broadcast, na @ nb[0], rtol=tol * 10, atol=tol * 10)


def test_matmul_against_float64_numpy(randn):
    a, b = randn((128, 64)), randn((64, 96))
    a @ b
    g = Graph()
    with graph(g):
        out = a @ b
    g.replay()
    ref = cupy.asnumpy(a).astype(np.float64) @ cupy.asnumpy(b).astype(np.float64)
    rel = np.linalg.norm(cupy.asnumpy(out) - ref) / np.linalg.norm(ref)
    assert rel < 1e-3  # float32, or TF32 where CuPy enables it


def test_each_graph_owns_its_workspace(randn):
    a, b = randn((256, 256)), randn((256, 256))
    a @ b
    g1, g2 = Graph(), Graph()
    with graph(g1):
        y1 = a @ b
    with graph(g2):
        y2 = (a @ b) * 2
    g1.reset()
    del y1
    cugraphrt.empty_cache()
    junk = [cupy.ones((1 << 22,), dtype=cupy.float32) for _ in range(8)]  # reuse freed memory
    for _ in range(3):
        na = randn((256, 256))
        a[...] = na
        g2.replay()
        cupy.testing.assert_allclose(y2, (na @ b) * 2, rtol=1e-3, atol=1e-3)
    eager = a @ b  # CuPy's own handle was never touched
    cupy.testing.assert_allclose(eager, cupy.asnumpy(a) @ cupy.asnumpy(b), rtol=1e-3,
                                 atol=1e-3)
    assert all(bool((j == 1).all()) for j in junk)


def test_other_cublas_routines_are_refused_by_name(randn):
    import cupy.cublas

    x, y = randn((64,)), randn((64,))
    cupy.cublas.axpy(2.0, x, y)  # warm-up: handle exists, module loaded
    with pytest.raises(CaptureError, match=r"cuBLAS call cublas\.saxpy") as info:
        with graph(Graph()):
            cupy.cublas.axpy(2.0, x, y)
    assert isinstance(info.value, NotImplementedError)  # as CuPy's refusal is


def test_cupy_random_in_capture_names_the_replacement(randn):
    cupy.random.rand(4)  # warm-up: the legacy generator exists
    w = randn((4,))
    with pytest.raises(NotImplementedError, match="cugraphrt.random") as info:
        with graph(Graph()):
            cupy.random.rand(16)
    assert isinstance(info.value, CaptureError)
    with pytest.raises(CaptureError, match="cugraphrt.random"):
        with graph(Graph()):
            cupy.random.RandomState(1)
    with graph(g := Graph()):  # the stream still captures fine
        z = w * 0 + 1
    g.replay()
    del z


def test_cupy_random_outside_capture_still_works():
    rs = cupy.random.RandomState(5)
    a = rs.rand(10)
    b = cupy.random.RandomState(5).rand(10)
    cupy.testing.assert_array_equal(a, b)


def test_fft_captures_after_warm_up(randn):
    x = randn((4096,), np.complex64)
    cupy.fft.fft(x)  # warm-up caches the plan
    g = Graph()
    with graph(g):
        y = cupy.fft.fft(x) * 2
    fresh = randn((4096,), np.complex64)
    x[...] = fresh
    g.replay()
    cupy.testing.assert_allclose(y, cupy.fft.fft(fresh) * 2, rtol=1e-4, atol=1e-3)


def _cached_keys():
    from cupy.fft.config import get_plan_cache

    return {key for key, _ in get_plan_cache()}


def test_fft_plan_created_in_a_capture_belongs_to_the_graph(randn):
    from cupy.fft.config import get_plan_cache

    x = randn((3000,), np.complex64)  # no plan is cached for this size
    before = _cached_keys()
    g = Graph()
    with graph(g):  # 'global' mode: the plan is made with the thread's mode relaxed
        y = cupy.fft.ifft(cupy.fft.fft(x) * 2)  # both transforms share the new plan
    assert _cached_keys() == before  # kept out of CuPy's cache: eager FFTs never use it
    for _ in range(2):
        fresh = randn((3000,), np.complex64)
        x[...] = fresh
        g.replay()
        expected = np.fft.ifft(np.fft.fft(cupy.asnumpy(fresh).astype(np.complex128)) * 2)
        cupy.testing.assert_allclose(y, expected, rtol=1e-4, atol=1e-4)
        eager = cupy.fft.fft(fresh)  # plans (and caches) a plan of its own
        cupy.testing.assert_allclose(eager, np.fft.fft(cupy.asnumpy(fresh)), rtol=1e-3,
                                     atol=1e-3)
    assert len(_cached_keys() - before) == 1
    get_plan_cache().clear()  # destroys every cached plan: the graph's is not among them
    fresh = randn((3000,), np.complex64)
    x[...] = fresh
    g.replay()
    expected = np.fft.ifft(np.fft.fft(cupy.asnumpy(fresh).astype(np.complex128)) * 2)
    cupy.testing.assert_allclose(y, expected, rtol=1e-4, atol=1e-4)


def test_fft_plan_of_a_failed_capture_is_dropped(randn):
    x = randn((2940,), np.complex64)
    before = _cached_keys()
    with pytest.raises(CaptureError):
        with graph(Graph()):
            cupy.fft.fft(x)
            x.sum().get()  # a host sync: the capture fails after the plan was made
    assert _cached_keys() == before
    cupy.testing.assert_allclose(cupy.fft.fft(x), np.fft.fft(cupy.asnumpy(x)), rtol=1e-3,
                                 atol=1e-3)


def test_fft_plan_cufft_cannot_make_in_a_capture_is_a_capture_error_and_cuffts(randn):
    # cuFFT cannot create plans for lengths with a large prime factor while a capture is
    # underway (CuPy's own capture fails the same way): the error is cugraphrt's, also
    # CuPy's CuFFTError, and names the warm-up; after a warm-up the same FFT captures.
    from cupy.cuda.cufft import CuFFTError

    x = randn((3001,), np.complex64)
    before = _cached_keys()
    pool = cugraphrt.MemPool()
    with pytest.raises(CaptureError) as caught:
        with graph(Graph(), pool=pool):
            cupy.fft.fft(x)
    error = caught.value
    assert isinstance(error, CuFFTError) and error.result == caught.value.__cause__.result
    assert "shape 3001" in str(error) and "warm-up" in str(error)
    assert "cupy.fft.fft(x)" in str(error)  # the caller's line
    assert _cached_keys() == before and pool.stats().active_bytes == 0
    cupy.fft.fft(x)  # warm-up: the plan is cached
    g = Graph()
    with graph(g):
        y = cupy.fft.fft(x)
    fresh = randn((3001,), np.complex64)
    x[...] = fresh
    g.replay()
    cupy.testing.assert_allclose(y, np.fft.fft(cupy.asnumpy(fresh)), rtol=1e-3, atol=1e-3)


def test_fft_plan_created_in_a_branch_body(randn):
    x = randn((2997,), np.complex64)
    out = cupy.zeros_like(x)
    flag = cupy.ones((), dtype=cupy.bool_)
    g = Graph()
    with graph(g):
        cugraphrt.cond(flag, lambda: out.__setitem__(Ellipsis, cupy.fft.fft(x)))
    for value in (True, False, True):
        fresh = randn((2997,), np.complex64)
        x[...] = fresh
        out[...] = 0
        flag[...] = value
        g.replay()
        expected = np.fft.fft(cupy.asnumpy(fresh)) if value else np.zeros(2997)
        cupy.testing.assert_allclose(out, expected, rtol=1e-3, atol=1e-3)


def test_reductions_capture(randn):
    x = randn((1000, 37))
    g = Graph()
    with graph(g):
        total = x.sum()
        rows = x.max(axis=1)
        mean = x.mean(axis=0)
    fresh = randn((1000, 37))
    x[...] = fresh
    g.replay()
    cupy.testing.assert_allclose(total, fresh.sum(), rtol=1e-4)
    cupy.testing.assert_allclose(rows, fresh.max(axis=1))
    cupy.testing.assert_allclose(mean, fresh.mean(axis=0), rtol=1e-5, atol=1e-6)


def test_cusolver_in_capture_is_a_capture_error(randn):
    a = randn((32, 32), np.float64)
    spd = a @ a.T + 32 * cupy.eye(32)
    cupy.linalg.cholesky(spd)  # warm-up
    with pytest.raises(CaptureError, match="cuSOLVER"):
        with graph(Graph()):
            cupy.linalg.cholesky(spd)


def test_cusparse_in_capture_is_a_capture_error(randn):
    import cupyx.scipy.sparse as sparse

    dense = randn((64, 64))
    dense[cupy.abs(dense) < 1.0] = 0
    matrix = sparse.csr_matrix(dense)
    matrix @ matrix  # warm-up: cuSPARSE handle and module
    with pytest.raises(CaptureError, match="cuSPARSE|synchroniz"):
        with graph(Graph()):
            matrix @ matrix


LINALG_CALLS = {
    "svd": lambda a, spd, v: cupy.linalg.svd(a),
    "eig": lambda a, spd, v: cupy.linalg.eig(a),
    "eigvals": lambda a, spd, v: cupy.linalg.eigvals(a),
    "qr": lambda a, spd, v: cupy.linalg.qr(a),
    "lstsq": lambda a, spd, v: cupy.linalg.lstsq(a, v, rcond=None),
    "inv": lambda a, spd, v: cupy.linalg.inv(a),
    "pinv": lambda a, spd, v: cupy.linalg.pinv(a),
    "solve": lambda a, spd, v: cupy.linalg.solve(a, v),
    "cholesky": lambda a, spd, v: cupy.linalg.cholesky(spd),
    "eigh": lambda a, spd, v: cupy.linalg.eigh(spd),
    "det": lambda a, spd, v: cupy.linalg.det(a),
    "matrix_rank": lambda a, spd, v: cupy.linalg.matrix_rank(a),
}


@pytest.mark.parametrize("warm", [False, True])
@pytest.mark.parametrize("name", list(LINALG_CALLS))
def test_every_solver_is_a_capture_error_naming_the_call(name, warm, randn):
    a = randn((24, 24), np.float64)
    spd, v = a @ a.T + 24 * cupy.eye(24), randn((24,), np.float64)
    call = LINALG_CALLS[name]
    if warm:
        call(a, spd, v)  # handles, workspaces and modules exist: still not capturable
    with pytest.raises(CaptureError, match=rf"call cupy\.linalg\.{name} cannot be captured") \
            as info:
        with graph(Graph()):
            call(a, spd, v)
    assert isinstance(info.value, NotImplementedError)
    with graph(g := Graph()):  # nothing was left broken
        w = a * 2
    g.replay()
    cupy.testing.assert_allclose(w, a * 2)
    call(a, spd, v)  # and the solver still works eagerly


def test_kernels_compiled_during_a_capture_are_noted_and_work(randn):
    # Loading a module during a capture is legal on current drivers; cugraphrt notes the
    # kernels so that an invalidated capture can name them.
    from cugraphrt._capture import stream_capture as _capture

    x = randn((512,))
    kernel = cupy.ElementwiseKernel("float32 a", "float32 b", "b = a * 3.25f + 1.0f",
                                    "cgrt_test_noted_kernel")
    g = Graph()
    with graph(g):
        notes = _capture.current_capture().notes
        y = kernel(x)
    assert any("cgrt_test_noted_kernel" in note for note in notes), notes
    g.replay()
    cupy.testing.assert_allclose(y, x * 3.25 + 1, rtol=1e-5, atol=1e-6)  # FMA or not
