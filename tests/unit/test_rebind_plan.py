"""The rebinding plan's logic without a GPU: extents, finding addresses in parameter bytes,
the reasons a plan is incomplete, the ``extra`` parameter buffer, and the setter's bytes.

The GPU side (real graphs, replays against eager) is tests/gpu/test_rebind_gpu.py and
tests/torch/test_rebind_gpu.py; the generated programs run rebinding too (tests/stress).
"""

from __future__ import annotations

import ctypes
import struct

import numpy as np
import pytest

pytest.importorskip("cupy")

from cugraphrt._callables import rebind_plan as rp
from cugraphrt._callables.rebind import check_inputs_mode
from cugraphrt.errors import OptionsError

A, B = 0x7F00_0000_0000, 0x7F00_0010_0000  # two inputs of 4 KiB, far apart


def _finder():
    return rp._Finder([(A, A, A + 4096), (B, B, B + 4096)])


def _q(*values: int) -> bytes:
    return b"".join(struct.pack("<Q", v) for v in values)


def test_byte_extent_of_views_and_empty_arrays():
    assert rp.byte_extent(1000, (4, 8), (32, 4), 4) == (1000, 1128)
    # A reversed view: its first element is the highest address.
    assert rp.byte_extent(1000, (4,), (-4,), 4) == (988, 1004)
    assert rp.byte_extent(1000, (0, 3), (12, 4), 4) == (1000, 1000)


def test_finder_sees_whole_interior_and_unaligned_addresses():
    raw = _q(5, A, B + 100, 7)
    assert _finder().hits(raw) == [(8, 0, False), (16, 1, False)]
    shifted = b"\0\0\0\0" + _q(A + 8)  # a packed struct: the address at byte 4
    assert _finder().hits(shifted) == [(4, 0, False)]
    assert _finder().hits(_q(A - 1, A + 4096 + 8, 12345)) == []


def test_finder_flags_an_end_pointer_unless_it_starts_another_input():
    assert _finder().hits(_q(A + 4096)) == [(0, 0, True)]
    adjacent = rp._Finder([(A, A, A + 4096), (A + 4096, A + 4096, A + 8192)])
    assert adjacent.hits(_q(A + 4096)) == [(0, 1, False)]  # the second input's start


def test_reasons_for_shared_inputs_and_outputs_inside_inputs():
    names = ["args[0]", "args[1]"]
    assert rp._shared_inputs([(A, A, A + 100), (A + 50, A + 50, A + 200)], names) == [
        "inputs args[0] and args[1] share memory"]
    assert rp._shared_inputs([(A, A, A + 100), (B, B, B + 100)], names) == []
    inside = rp._outputs_inside([(A, A, A + 100)], [(A + 8, A + 16, "output 0")], names[:1])
    assert inside and "output 0 lies inside input args[0]" in inside[0]
    assert rp._outputs_inside([(A, A, A + 100)], [(B, B + 8, "output 0")], names[:1]) == []


def test_plan_explains_itself():
    plan = rp.RebindPlan(2)
    plan.sites_per_input = [2, 1]
    plan.site_word = np.array([0, 1, 2])
    assert plan.complete
    assert plan.explain(["x", "w"]) == ("inputs are rebound: 3 address(es) in 0 node(s) "
                                        "(x: 2, w: 1)")
    plan.reasons += ["a", "b", "a"]
    assert not plan.complete and plan.explain(["x", "w"]) == "inputs are copied: a; b"


def test_inputs_mode_is_checked():
    assert check_inputs_mode("copy") == "copy" and check_inputs_mode("rebind") == "rebind"
    with pytest.raises(OptionsError, match="'copy' and 'rebind'"):
        check_inputs_mode("alias")


def test_packed_parameters_are_read_from_extra():
    np_ = pytest.importorskip("cuda.bindings.driver")
    from cugraphrt._cuda import node_params as npar

    payload = ctypes.create_string_buffer(_q(1, A + 64, 3), 24)
    size = ctypes.c_size_t(24)
    extra = (ctypes.c_void_p * 5)(1, ctypes.addressof(payload), 2, ctypes.addressof(size), 0)
    layout = npar._packed(np_.CUDA_KERNEL_NODE_PARAMS(), ctypes.addressof(extra))
    assert layout.packed and layout.why_not is None
    assert layout.offsets == [0] and layout.sizes == [24] and layout.raw == [payload.raw]
    assert _finder().hits(layout.raw[0]) == [(8, 0, False)]
    odd = (ctypes.c_void_p * 3)(7, 0, 0)
    assert "key 7" in npar._packed(np_.CUDA_KERNEL_NODE_PARAMS(), ctypes.addressof(odd)).why_not


def test_kernel_setter_lays_parameters_out_and_points_cuda_at_them():
    driver = pytest.importorskip("cuda.bindings.driver")
    from cugraphrt._cuda import node_params as npar

    layout = npar.KernelParams(driver.CUDA_KERNEL_NODE_PARAMS(), [0, 8, 16],
                               [8, 4, 16], [_q(A), b"\x07\0\0\0", _q(B, 9)])
    words = np.zeros(npar.ExecSetter.words_for("KERNEL", layout, ()), dtype=np.uint64)
    setter = npar.ExecSetter(None, "KERNEL", layout.params, words, layout=layout)
    assert words.tolist() == [A, 7, B, 9]
    table = (ctypes.c_void_p * 3).from_address(int(layout.params.kernelParams))
    assert [t - words.ctypes.data for t in table] == [0, 8, 16]
    words[0] = A + 4096  # what a rebinding stores is what CUDA reads
    assert ctypes.c_uint64.from_address(table[0]).value == A + 4096
    assert setter.kind == "KERNEL"


class _FakeGraph:
    """Nodes of a made-up graph for build_plan: ('KERNEL', KernelParams) or ('MEMCPY', obj)."""

    def __init__(self, monkeypatch, nodes):
        from cugraphrt._cuda import node_params as npar

        self.nodes = nodes
        monkeypatch.setattr(rp._nodes, "nodes", lambda graph: list(range(len(nodes))))
        monkeypatch.setattr(rp._nodes, "kind", lambda node: nodes[node][0])
        monkeypatch.setattr(npar, "kernel_params", lambda node: nodes[node][1])
        monkeypatch.setattr(npar, "copy_params", lambda node: nodes[node][1])


def _kernel(*raws: bytes, why_not=None):
    driver = pytest.importorskip("cuda.bindings.driver")
    from cugraphrt._cuda import node_params as npar

    offsets, at = [], 0
    for raw in raws:
        offsets.append(at)
        at += (len(raw) + 7) // 8 * 8
    return npar.KernelParams(driver.CUDA_KERNEL_NODE_PARAMS(), offsets,
                             [len(r) for r in raws], list(raws), why_not)


EXTENTS = [(A, A, A + 4096), (B, B, B + (2 << 20))]  # a 4 KiB input and a 2 MiB one


def test_build_plan_finds_sites_and_leaves_small_inputs_to_copies(monkeypatch):
    _FakeGraph(monkeypatch, [("KERNEL", _kernel(_q(A + 16), b"\x01\0\0\0")),
                             ("KERNEL", _kernel(_q(7, B + 64, B)))])
    plan = rp.build_plan(object(), EXTENTS, ["x", "w"])
    assert plan.complete and plan.sites_per_input == [1, 2]
    assert sorted(plan.site_delta.tolist()) == [0, 16, 64]
    assert len(plan.setters) == 2
    words = plan.words.tolist()
    assert A + 16 in words and B + 64 in words and 7 in words  # the capture's values
    small = rp.build_plan(object(), EXTENTS, ["x", "w"], min_bytes=1 << 20)
    assert small.complete and small.sites_per_input == [0, 2] and len(small.setters) == 1
    assert "x: copied (smaller than" in small.explain(["x", "w"])


def test_build_plan_reasons(monkeypatch):
    _FakeGraph(monkeypatch, [("KERNEL", _kernel(_q(A + 4096)))])
    assert "end pointer" in rp.build_plan(object(), EXTENTS, ["x", "w"]).reasons[0]
    _FakeGraph(monkeypatch, [("KERNEL", _kernel(why_not="it names no function"))])
    assert "cannot be read" in rp.build_plan(object(), EXTENTS, ["x", "w"]).reasons[0]

    class HostCopy:
        srcMemoryType, dstMemoryType, srcDevice, dstDevice = 1, 2, 0, A
        Height = Depth = 1

    _FakeGraph(monkeypatch, [("MEMCPY", HostCopy())])
    assert "host memory" in rp.build_plan(object(), EXTENTS, ["x", "w"]).reasons[0]


def test_min_bytes_default_and_environment(monkeypatch):
    from cugraphrt._callables import rebind

    monkeypatch.delenv(rebind.MIN_BYTES_ENV, raising=False)
    assert rebind.min_bytes() == 1 << 20
    monkeypatch.setenv(rebind.MIN_BYTES_ENV, "0")
    assert rebind.min_bytes() == 0
    for bad in ("-1", "1MiB"):
        monkeypatch.setenv(rebind.MIN_BYTES_ENV, bad)
        with pytest.raises(OptionsError, match=rebind.MIN_BYTES_ENV):
            rebind.min_bytes()
