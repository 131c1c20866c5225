"""inputs="rebind" on CuPy graphs: replays on the call's own arrays equal eager, no copies.

Every case compares against eager CuPy on the same fresh arrays (an independent run of the
same function), and checks that the plan patched what it should: kernel parameters (whole
and interior pointers, cuBLAS's struct of pointers), memcpy and memset nodes. The fallbacks
(output viewing an input, inputs sharing memory, another layout, an argument in the graph's
pool) are checked to copy and stay correct. docs/rebinding.md describes the rules.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest

cupy = pytest.importorskip("cupy")

import cugraphrt  # noqa: E402

pytestmark = pytest.mark.gpu


@pytest.fixture(autouse=True)
def _rebind_every_input(monkeypatch):
    """These inputs are small: rebind them anyway (by default, inputs under 1 MiB copy)."""
    monkeypatch.setenv("CUGRAPHRT_REBIND_MIN_BYTES", "0")


def _mixed(x, w, b):
    """Elementwise, an interior slice, a reduction, a matmul (cuBLAS), a memcpy of a slice
    and a memset of an input's rows: every kind of place an address appears."""
    y = cupy.tanh(x @ w) + b
    y[:, :3] = x[:, 5:8]  # memcpy-like copy of an interior slice (a kernel for 2-D views)
    s = x[2:, 1:].sum(axis=0)
    flat = cupy.empty(x.size, dtype=x.dtype)
    flat[:] = x.ravel()  # a contiguous copy: a memcpy node reading x
    b[3:6] = 0  # a memset of part of an input (in place, as eager does it)
    return y, s, flat


def _fresh(randn):
    return randn((16, 32)), randn((32, 24)), randn((24,))


def _eager(fn, args):
    copies = [a.copy() for a in args]
    out = fn(*copies)
    return out, copies


def test_rebind_equals_eager_and_patches_every_kind(randn):
    sample = _fresh(randn)
    f = cugraphrt.make_graphed(_mixed, sample, inputs="rebind")
    plan = f.rebinding
    assert plan is not None and plan.complete, plan.explain(["x", "w", "b"]) if plan else None
    kinds = {setter.kind for setter in plan.setters}
    assert "KERNEL" in kinds
    assert {"MEMCPY", "MEMSET"} & kinds, kinds  # the flat copy and the memset
    assert all(n > 0 for n in plan.sites_per_input)
    for _ in range(4):
        args = _fresh(randn)
        (ey, es, eflat), ecopies = _eager(_mixed, args)
        y, s, flat = f(*args)
        cupy.testing.assert_allclose(y, ey, rtol=1e-5, atol=1e-5)
        cupy.testing.assert_allclose(s, es, rtol=1e-5, atol=1e-5)
        cupy.testing.assert_array_equal(flat, eflat)
        # The in-place update lands in the caller's array, as in eager (not in a static).
        cupy.testing.assert_array_equal(args[2], ecopies[2])


def test_no_copy_reaches_the_static_inputs(randn):
    x0 = randn((1 << 16,))
    f = cugraphrt.make_graphed(lambda x: x * 2 + 1, (x0,), inputs="rebind")
    before = x0.copy()
    x1 = randn((1 << 16,))
    out = f(x1)
    cupy.testing.assert_allclose(out, x1 * 2 + 1, rtol=1e-6)
    cupy.testing.assert_array_equal(x0, before)  # rebound, not copied into x0
    out = f(x0)  # back to the capture's own buffer
    cupy.testing.assert_allclose(out, x0 * 2 + 1, rtol=1e-6)


def test_same_buffer_again_sees_new_contents(randn):
    x = randn((4096,))
    f = cugraphrt.make_graphed(lambda x: x.cumsum(), (x,), inputs="rebind")
    y = randn((4096,))
    f(y)
    y[...] = cupy.arange(4096, dtype=cupy.float32)  # same address, new data: no rebind
    cupy.testing.assert_allclose(f(y), cupy.arange(4096, dtype=cupy.float32).cumsum(),
                                 rtol=1e-5)


def test_output_viewing_an_input_falls_back_to_copy(randn):
    x = randn((64,))
    with pytest.warns(UserWarning, match="falls back to copying.*inside input"):
        f = cugraphrt.make_graphed(lambda x: (x[1:], x * 2), (x,), inputs="rebind")
    assert not f.rebinding.complete
    z = randn((64,))
    view, double = f(z)
    cupy.testing.assert_array_equal(view, z[1:])
    cupy.testing.assert_allclose(double, z * 2)


def test_inputs_sharing_memory_fall_back(randn):
    base = randn((128,))
    a, b = base[:96], base[32:]
    with pytest.warns(UserWarning, match="share memory"):
        f = cugraphrt.make_graphed(lambda a, b: a + b, (a, b), inputs="rebind")
    assert not f.rebinding.complete
    base[...] = randn((128,))
    cupy.testing.assert_allclose(f(a, b), a + b)  # the statics themselves: nothing copied


def test_other_strides_are_copied(randn):
    x = randn((32, 32))
    f = cugraphrt.make_graphed(lambda x: x * 3, (x,), inputs="rebind")
    t = randn((32, 32)).T  # the same shape, transposed strides
    cupy.testing.assert_allclose(f(t), t * 3, rtol=1e-6)


def test_x_equals_f_x_copies_the_pool_argument(randn):
    x = randn((2048,))

    def step(x):
        y = x + 1
        return y * 2 - x  # reads x after writing y: wrong if x were y's buffer

    f = cugraphrt.make_graphed(step, (x,), inputs="rebind")
    ref = x.copy()
    value = x
    for _ in range(5):
        value = f(value)  # the output (pool memory) comes back as the argument
        ref = step(ref)
        cupy.testing.assert_allclose(value, ref, rtol=1e-5)


def test_reinstantiated_graph_is_patched(randn):
    x = randn((512,))
    f = cugraphrt.make_graphed(lambda x: x - 5, (x,), inputs="rebind")
    z = randn((512,))
    f(z)
    f.graph.instantiate()  # a new executable, made from the capture's addresses
    w = randn((512,))
    cupy.testing.assert_allclose(f(w), w - 5)
    cupy.testing.assert_allclose(f(z), z - 5)


def test_direct_replay_reads_the_last_call(randn):
    x = randn((256,))
    f = cugraphrt.make_graphed(lambda x: x * 4, (x,), inputs="rebind")
    z = randn((256,))
    out = f(z)
    del z  # held by the graphed function until its next call
    out_before = out.copy()
    f.graph.replay()
    cupy.testing.assert_array_equal(out, out_before)


def test_random_draws_match_copy_mode(randn):
    """Same seed, same draws: the rebound graph and the copying one agree bit for bit."""
    from cugraphrt import random as crandom

    def make(inputs):
        gen = crandom.Generator(seed=7)

        def fn(x, w):
            return (x @ w) + gen.randn(*x.shape[:1], w.shape[1], dtype=np.float32)

        return fn, gen

    x, w = randn((8, 16)), randn((16, 4))
    fn_r, _ = make("rebind")
    fn_c, _ = make("copy")
    f_r = cugraphrt.make_graphed(fn_r, (x.copy(), w.copy()), inputs="rebind")
    f_c = cugraphrt.make_graphed(fn_c, (x.copy(), w.copy()), inputs="copy")
    assert f_r.rebinding.complete
    for _ in range(3):
        a, b = randn((8, 16)), randn((16, 4))
        cupy.testing.assert_array_equal(f_r(a, b), f_c(a, b))


def test_buckets_rebind_their_own_size_and_copy_smaller(randn):
    x = randn((64, 16))
    w = randn((16, 8))
    f = cugraphrt.make_graphed(lambda x, w: x @ w, (x, w), buckets=[16, 64], inputs="rebind",
                               dynamic_dim=(0, None))
    f.capture_all()
    for n in (64, 10, 16, 64, 3):
        a = randn((n, 16))
        cupy.testing.assert_allclose(f(a, w), a @ w, rtol=1e-5, atol=1e-5)


def test_copy_is_the_default_and_bad_mode_is_refused(randn):
    x = randn((8,))
    f = cugraphrt.make_graphed(lambda x: x + 1, (x,))
    assert f.rebinding is None
    with pytest.raises(cugraphrt.OptionsError, match="inputs"):
        cugraphrt.make_graphed(lambda x: x + 1, (x,), inputs="alias")


def test_no_warning_for_a_complete_plan(randn):
    x = randn((8, 8))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        f = cugraphrt.make_graphed(lambda x: x.T @ x, (x,), inputs="rebind")
    a = randn((8, 8))
    np.testing.assert_allclose(cupy.asnumpy(f(a)), cupy.asnumpy(a.T @ a), rtol=1e-5,
                               atol=1e-5)


def test_small_inputs_copy_by_default(randn, monkeypatch):
    monkeypatch.delenv("CUGRAPHRT_REBIND_MIN_BYTES")
    small, big = randn((64,)), randn((1 << 18,))  # 256 B and 1 MiB
    f = cugraphrt.make_graphed(lambda s, b: b * s.sum(), (small, big), inputs="rebind")
    plan = f.rebinding
    assert plan.complete and plan.sites_per_input[0] == 0 and plan.sites_per_input[1] > 0
    assert "s: copied (smaller than" in plan.explain(["s", "b"])
    for _ in range(2):
        s, b = randn((64,)), randn((1 << 18,))
        cupy.testing.assert_allclose(f(s, b), b * s.sum(), rtol=1e-5)
    monkeypatch.setenv("CUGRAPHRT_REBIND_MIN_BYTES", "lots")
    with pytest.raises(cugraphrt.OptionsError, match="CUGRAPHRT_REBIND_MIN_BYTES"):
        cugraphrt.make_graphed(lambda x: x + 1, (small,), inputs="rebind")


# -- inputs="rebind" keeps its meaning where it copies (issue 51) ---------------------------


def _bump_and_sum(x):
    """The issue's program: an in-place update of the input, then a reduction of it."""
    x += 1.0
    return x[:1], (x * 3.0).sum(axis=0)  # an output inside the input: the plan copies


def test_a_fallback_writes_the_updated_input_back(randn):
    with pytest.warns(UserWarning, match="falls back to copying.*copied back"):
        f = cugraphrt.make_graphed(_bump_and_sum, (randn((64, 32)),), inputs="rebind")
    assert not f.rebinding.complete and f.rebinding.written == [True]
    for _ in range(3):
        a = randn((64, 32))
        mine = a.copy()
        first, sums = _bump_and_sum(mine)  # eager, on a copy: the reference
        got_first, got_sums = f(a)
        cupy.testing.assert_array_equal(a, mine)  # the update landed in the caller's array
        cupy.testing.assert_allclose(got_sums, sums, rtol=1e-5)
        cupy.testing.assert_array_equal(got_first, first)


def test_strict_raises_where_it_would_fall_back(randn):
    with pytest.raises(cugraphrt.CaptureError, match="cannot rebind every input.*inside"):
        cugraphrt.make_graphed(_bump_and_sum, (randn((64, 32)),), inputs="rebind",
                               strict=True)
    f = cugraphrt.make_graphed(lambda x: x * 2, (randn((8,)),), inputs="rebind", strict=True)
    assert f.rebinding.complete  # nothing to fall back from: strict changes nothing
    with pytest.raises(cugraphrt.OptionsError, match="strict"):
        cugraphrt.make_graphed(lambda x: x * 2, (randn((8,)),), strict="yes")


def test_only_the_inputs_the_graph_writes_go_back(randn):
    def fn(x, w):
        flat = cupy.empty(x.size, dtype=x.dtype)
        flat[:] = x.ravel()  # a memcpy node that only reads x
        w *= 2.0  # a kernel writing w
        return x[:1], flat + w.sum()

    x, w = randn((16,)), randn((16,))
    with pytest.warns(UserWarning, match="falls back to copying"):
        f = cugraphrt.make_graphed(fn, (x, w), inputs="rebind")
    assert f.rebinding.written == [False, True]
    a, b = randn((16,)), randn((16,))
    a0, b0 = a.copy(), b.copy()
    _, got = f(a, b)
    cupy.testing.assert_array_equal(a, a0)
    cupy.testing.assert_allclose(b, b0 * 2, rtol=0)
    cupy.testing.assert_allclose(got, a0 + (b0 * 2).sum(), rtol=1e-5)


def test_an_input_copied_for_its_strides_is_written_back(randn):
    def fn(x):
        x *= 2.0
        return x.sum()

    f = cugraphrt.make_graphed(fn, (randn((32, 32)),), inputs="rebind")
    assert f.rebinding.complete
    t = randn((32, 32)).T  # other strides: copied, then written back
    t0 = t.copy()
    cupy.testing.assert_allclose(f(t), (t0 * 2).sum(), rtol=1e-5)
    cupy.testing.assert_array_equal(t, t0 * 2)
    z = randn((32, 32))  # the captured strides: rebound, updated where it lies
    z0 = z.copy()
    f(z)
    cupy.testing.assert_array_equal(z, z0 * 2)


def test_buckets_write_back_the_rows_of_a_padded_call(randn):
    def fn(x):
        x += 1.0
        return x * 2

    f = cugraphrt.make_graphed(fn, (randn((64, 8)),), buckets=[16, 64], inputs="rebind")
    f.capture_all()
    for n in (10, 64, 16, 3):
        a = randn((n, 8))
        a0 = a.copy()
        cupy.testing.assert_allclose(f(a), (a0 + 1) * 2, rtol=1e-6)
        cupy.testing.assert_allclose(a, a0 + 1, rtol=0)  # padded or rebound: updated in place
