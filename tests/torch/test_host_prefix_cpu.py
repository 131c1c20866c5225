"""The host prefix of an inference graph (``compile._host_prefix``): the CPU work a forward
does from tensors it holds on the CPU, split off to run eagerly before the device work.

A CPU build of torch has no CUDA device, so these graphs stand the ``meta`` device in for
it: anything not on the CPU is device work. The prefix runs here for real (its values are
checked against eager's); the device graph runs on meta tensors (shapes only). The GPU test
(test_pieces_gpu.py) checks the whole against eager on a CUDA device."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from cugraphrt_torch.compile._host_prefix import HostPrefixed, split_host_prefix  # noqa: E402
from torch.fx.experimental.proxy_tensor import make_fx  # noqa: E402

from ._pieces_models import HostAnchors  # noqa: E402


def _traced(fn, *inputs):
    gm = make_fx(fn, tracing_mode="fake")(*inputs)
    examples = [n.meta["val"] for n in gm.graph.find_nodes(op="placeholder")]
    return gm, examples


def _anchors_forward(x, first, second, pair0, pair1):
    model = HostAnchors()
    model.wh_pairs = [pair0, pair1]
    y = torch.nn.functional.linear(x, first).relu()
    y = torch.nn.functional.linear(y, second)
    boxes = model.boxes()
    return y + boxes.to(x.device).sum(0), boxes


def _inputs(device="meta"):
    model = HostAnchors()
    return (torch.randn(3, 16, device=device), torch.randn(16, 16, device=device),
            torch.randn(4, 16, device=device), *model.wh_pairs)


def test_the_cpu_work_runs_in_the_prefix_and_the_device_graph_has_none():
    gm, examples = _traced(_anchors_forward, *_inputs())
    split = split_host_prefix(gm, examples)
    assert split is not None
    assert split.prefix_inputs == (3, 4) and split.device_inputs == (0, 1, 2)
    assert split.copies == 1 and split.copy_names[0].startswith("host prefix: ")
    for node in split.device.graph.nodes:
        value = node.meta.get("val")
        if isinstance(value, torch.Tensor):
            assert value.device.type == "meta", node  # no CPU work left
    prefix_ops = {n.target for n in split.prefix.graph.nodes if n.op == "call_function"}
    assert torch.ops.aten.cat.default in prefix_ops
    assert torch.ops.aten._to_copy.default in prefix_ops  # the copy to the device too
    assert torch.ops.aten.mm.default not in prefix_ops


def test_the_split_graph_returns_eagers_host_values_and_the_device_results():
    inputs = _inputs()
    gm, examples = _traced(_anchors_forward, *inputs)
    split = split_host_prefix(gm, examples)
    calls = []

    def piece(args):
        calls.append([tuple(a.shape) for a in args])
        return split.device(*args)

    run = HostPrefixed(split, piece)
    pair0, pair1 = inputs[3], inputs[4]
    for _ in range(2):
        out, boxes = run(list(inputs))
        assert out.device.type == "meta" and out.shape == (3, 4)
        assert torch.equal(boxes, HostAnchors().boxes())
    # The prefix reads the CPU tensors' values of each call, as eager does.
    pair1[1, 1] = 0.25
    _, boxes = run(list(inputs))
    want = HostAnchors()
    want.wh_pairs = [pair0, pair1]
    assert torch.equal(boxes, want.boxes()) and boxes[3, 1] == 0.25
    assert calls[0] == [(3, 16), (16, 16), (4, 16), (4, 4)]  # the inputs, then the copy


def test_a_cpu_input_mutated_in_place_is_mutated_once_per_call():
    def count(x, counter):
        counter.add_(1)
        return (x * 2 + counter.to(x.device),)  # a list of outputs, as AOT graphs return

    x, counter = torch.randn(3, device="meta"), torch.zeros(3)
    gm, examples = _traced(count, x, counter)
    split = split_host_prefix(gm, examples)
    assert split is not None
    run = HostPrefixed(split, lambda args: split.device(*args))
    for calls in (1, 2, 3):
        run([x, counter])
        assert torch.equal(counter, torch.full((3,), float(calls)))


@pytest.mark.parametrize("case", ["scalar operand", "read back", "no host work"])
def test_graphs_whose_host_work_cannot_be_split_off_are_left_as_they_are(case):
    x, c = torch.randn(3, device="meta"), torch.tensor(2.0)

    def scalar_operand(x, c):  # a 0-d CPU tensor read by a device op: no copy to take out
        return x * (c + 1)

    def read_back(x, c):  # host work on a value read back from the device
        return (x.sum().cpu() + c).to(x.device) * x

    def no_host_work(x, c):
        return x * 2

    fn = {"scalar operand": scalar_operand, "read back": read_back,
          "no host work": no_host_work}[case]
    gm, examples = _traced(fn, x, c)
    assert split_host_prefix(gm, examples) is None
