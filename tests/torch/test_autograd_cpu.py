"""GPU-free tests of make_graphed_callables: argument checks, flattening plans, messages, and
the call path and gradient-alias guard run against "graphs" that recompute on the CPU.

A fake graph here is an object whose ``replay`` recomputes the callable eagerly and copies
the results into the static buffers, as a real replay writes them: enough to exercise
copy-in, autograd, ``AccumulateGrad`` adopting returned gradients, and the guard.
"""

from __future__ import annotations

import copy
import warnings
import weakref
from collections import namedtuple

import pytest

torch = pytest.importorskip("torch")

from cugraphrt_torch.autograd import _autograd_guard  # noqa: E402
from cugraphrt_torch.autograd._autograd_guard import AliasGuard, GradBuffers  # noqa: E402
from cugraphrt_torch.autograd._autograd_plan import ArgPlan, OutputPlan, name_of  # noqa: E402
from cugraphrt_torch.autograd._autograd_runtime import GraphedCallable, graphed_forward  # noqa: E402
from cugraphrt_torch.autograd.autograd import make_graphed_callables  # noqa: E402

from cugraphrt import _tree  # noqa: E402
from cugraphrt.errors import CugraphrtError, OptionsError, ReplayError  # noqa: E402

F64 = torch.float64


class FakeGraph:
    def __init__(self, replay) -> None:
        self.replay = replay
        self._route = None  # replayed by its own replay, as a CuPy graph is


def _tensors(value, requiring_grad=False):
    return [t for t in _tree.leaves_of(value) if isinstance(t, torch.Tensor)
            and (t.requires_grad or not requiring_grad)]


def fake_group(items, guard=None):
    """Graph (fn, args, kwargs) items like make_graphed_callables, with recomputing fakes:
    forward seqs in order, backward seqs in reverse, one guard."""
    guard = guard or AliasGuard()
    built = []
    for fn, args, kwargs in items:
        plan = ArgPlan(args, kwargs, name_of(fn))
        outputs = OutputPlan(fn(*args, **kwargs), plan.name)
        built.append([fn, args, kwargs, plan, outputs, guard.next_seq()])
    runtimes = [None] * len(built)
    for index in reversed(range(len(built))):
        module, args, kwargs, plan, outputs, fwd_seq = built[index]
        params = list(module.named_parameters()) if isinstance(module, torch.nn.Module) else []
        # Recompute with the forward of now: a graphed module's forward would call back here.
        # The module is reached weakly, as the real graphs do not reach it at all.
        fn = _class_forward(module) if isinstance(module, torch.nn.Module) else module
        targets = [plan.statics[i] for i in plan.grad_indices] + [p for _, p in params]
        diff = [outputs.statics[k] for k in outputs.diff]
        grad_outs = [torch.zeros_like(o) for o in diff]
        backward_graph = None
        grads = (None,) * len(targets)
        if diff and targets:
            grads = torch.autograd.grad(diff, targets, grad_outs, allow_unused=True)

        def forward(fn=fn, args=args, kwargs=kwargs, outputs=outputs):
            with torch.no_grad():
                for static, new in zip(outputs.statics, _tensors(fn(*args, **kwargs)), strict=True):
                    static.copy_(new)

        def backward(fn=fn, args=args, kwargs=kwargs, targets=targets, grad_outs=grad_outs,
                     grads=grads):
            with torch.enable_grad():
                new = torch.autograd.grad(_tensors(fn(*args, **kwargs), True), targets,
                                          grad_outs, allow_unused=True)
            for static, value in zip(grads, new, strict=True):
                if static is not None:
                    static.copy_(value)

        if diff and targets:
            backward_graph = FakeGraph(backward)
        runtimes[index] = GraphedCallable(
            name=plan.name, fn=module, args=plan, outputs=outputs, forward_graph=FakeGraph(forward),
            backward_graph=backward_graph, guard=guard, forward_seq=fwd_seq,
            backward_seq=guard.next_seq(), params=[p for _, p in params],
            param_names=[n for n, _ in params], static_grad_outputs=grad_outs,
            static_grad_inputs=grads)
    return runtimes


def _class_forward(module):
    ref, forward = weakref.ref(module), type(module).forward
    return lambda *args, **kwargs: forward(ref(), *args, **kwargs)


def fake(fn, *args, **kwargs):
    return fake_group([(fn, args, kwargs)])[0]


def linear_pair(seed=0):
    torch.manual_seed(seed)
    graphed = torch.nn.Linear(8, 4).to(F64)
    control = copy.deepcopy(graphed)
    return graphed, control


def backward_twice(*fns):
    """Two seeded backward passes through each of ``fns`` (a graphed callable and its eager
    control), with the same inputs for each: their gradients accumulate over both."""
    for fn in fns:
        for seed in (11, 12):
            torch.manual_seed(seed)
            fn(torch.randn(5, 8, dtype=F64)).pow(2).sum().backward()


@pytest.fixture
def relocations(monkeypatch):
    """Counts the gradients the guard had to move away from a static buffer."""
    moved = []
    original = GradBuffers._relocate

    def counting(key, holders):
        before = [t.untyped_storage()._cdata if t is not None else None for t in holders]
        original(key, holders)
        moved.extend(1 for t, b in zip(holders, before, strict=True) if b == key)

    monkeypatch.setattr(GradBuffers, "_relocate", staticmethod(counting))
    return moved


# -- argument checks before any capture ---------------------------------------------------------

def test_bad_arguments_are_rejected_with_the_argument_named():
    lin = torch.nn.Linear(2, 2)
    x = torch.randn(3, 2)
    cases = [
        (dict(callables=(lin, lin), sample_args=((x,),)), "sample_args"),
        (dict(callables=42, sample_args=(x,)), "callables"),
        (dict(callables=lin, sample_args=x), "sample_args"),
        (dict(callables=lin, sample_args=(x,), sample_kwargs=[1]), "sample_kwargs"),
        (dict(callables=lin, sample_args=(x,), num_warmup_iters=-1), "num_warmup_iters"),
        (dict(callables=lin, sample_args=(x,), num_warmup_iters=True), "num_warmup_iters"),
        (dict(callables=lin, sample_args=(x,), allow_unused_input=1), "allow_unused_input"),
        (dict(callables=lin, sample_args=(x,), pool=(0, 1)), "pool"),
    ]
    for kwargs, field in cases:
        with pytest.raises(OptionsError, match=f"option '{field}") as info:
            make_graphed_callables(**kwargs)
        assert info.value.field == field


@pytest.mark.parametrize("register", [
    lambda m: m.register_forward_hook(lambda *a: None),
    lambda m: m.register_forward_pre_hook(lambda *a: None),
    lambda m: m.register_full_backward_hook(lambda *a: None),
    lambda m: m.register_full_backward_pre_hook(lambda *a: None),
])
def test_modules_with_hooks_are_rejected(register):
    lin = torch.nn.Linear(2, 2)
    handle = register(lin)
    with pytest.raises(OptionsError, match="hooks.*register them after make_graphed"):
        make_graphed_callables(lin, (torch.randn(3, 2),))
    handle.remove()
    with pytest.raises(OptionsError, match="CUDA tensors"):  # past the hook check now
        make_graphed_callables(lin, (torch.randn(3, 2),))


def test_buffers_requiring_grad_are_rejected():
    bn = torch.nn.BatchNorm1d(2)
    bn.running_mean.requires_grad_(True)
    with pytest.raises(OptionsError, match="buffer 'running_mean' that requires grad"):
        make_graphed_callables((torch.nn.Linear(2, 2), bn), ((torch.randn(3, 2),),) * 2)


def test_sample_tensors_must_be_cuda_and_are_named():
    with pytest.raises(OptionsError, match=r"kwargs\['w'\]\[1\].*\.cuda\(\)"):
        make_graphed_callables(lambda x, w: x, (1,), sample_kwargs={"w": [2, torch.ones(2)]})


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the error without a GPU")
def test_without_cuda_a_clear_error():
    with pytest.raises(CugraphrtError, match="CUDA build of PyTorch"):
        make_graphed_callables(lambda n: n, (3,))


def test_already_graphed_module_is_rejected():
    lin = torch.nn.Linear(2, 2)
    rt = fake(lin, torch.randn(3, 2))
    lin.forward = graphed_forward(rt, lin, lin.forward)
    with pytest.raises(OptionsError, match="already graphed"):
        make_graphed_callables(lin, (torch.randn(3, 2),))


# -- flattening plans --------------------------------------------------------------------------

def test_flat_plan_uses_args_directly_and_checks_count():
    x, y = torch.randn(2), torch.randn(3)
    plan = ArgPlan((x, 4, y), {}, "f")
    assert plan.is_flat and plan.num_leaves == 3
    args = (torch.randn(2), 4, torch.randn(3))
    assert plan.leaves_of(args, {}) is args
    with pytest.raises(ReplayError, match="captured with 3 positional arguments \\(got 2\\)"):
        plan.leaves_of(args[:2], {})


def test_nested_and_keyword_plan():
    Pair = namedtuple("Pair", "a b")
    x, w, b = torch.randn(2), torch.randn(2), torch.randn(1)
    plan = ArgPlan(({"x": x, "k": [w]},), {"bias": Pair(b, 3), "scale": 2.0}, "f")
    assert not plan.is_flat
    assert plan.paths == ["args[0]['x']", "args[0]['k'][0]", "kwargs['bias'][0]",
                          "kwargs['bias'][1]", "kwargs['scale']"]
    # keyword order does not matter, structure does
    leaves = plan.leaves_of(({"x": 1, "k": [2]},), {"scale": 5, "bias": Pair(3, 4)})
    assert list(leaves) == [1, 2, 3, 4, 5]
    with pytest.raises(ReplayError, match=r"missing \['scale'\], unexpected \['sacle'\]"):
        plan.leaves_of(({"x": x, "k": [w]},), {"bias": Pair(b, 3), "sacle": 2.0})
    with pytest.raises(ReplayError, match="do not have the structure"):
        plan.leaves_of(({"x": x, "k": (w,)},), {"bias": Pair(b, 3), "scale": 2.0})


def test_load_copies_only_new_tensors_and_names_mismatches():
    x = torch.randn(4, 4)
    plan = ArgPlan((x, "mean"), {}, "f")
    new = torch.randn(4, 4)
    plan.load((new, "mean"))
    assert torch.equal(x, new)
    view = x.view(4, 4)
    plan.load((view, "mean"))  # same address and strides: nothing to copy
    transposed = x.t()  # same address, other strides: copied
    expected = x.t().clone()
    plan.load((transposed, "mean"))
    assert torch.equal(x, expected)
    for bad, got in [(torch.randn(4, 5), r"shape \(4, 5\)"), (torch.randn(4, 4, dtype=F64),
                     "torch.float64"), ([1.0], "list")]:
        with pytest.raises(ReplayError, match=f"argument args\\[0\\] of graphed callable f.*"
                                              f"got .*{got}"):
            plan.load((bad, "mean"))
    with pytest.raises(ReplayError, match=r"args\[1\].*differs from the capture \(expected str "
                                          r"'mean', got str 'sum'\)"):
        plan.load((new, "sum"))


def test_a_tensor_passed_twice_must_stay_one_tensor():
    y = torch.randn(3)
    plan = ArgPlan((y, y), {}, "loss")
    z = torch.randn(3)
    plan.load((z, z))
    assert torch.equal(y, z)
    with pytest.raises(ReplayError, match=r"args\[1\].*same tensor as args\[0\]"):
        plan.load((z, torch.randn(3)))


def test_output_plans():
    t = torch.randn(2, requires_grad=True) * 1
    n = torch.arange(3)
    single = OutputPlan(t, "f")
    assert single.is_single and single.is_direct and single.diff == (0,)
    flat = OutputPlan((t, n), "f")
    assert flat.is_direct and flat.nondiff == (1,)
    tree = OutputPlan({"y": [t, None], "n": n, "tag": "ok"}, "f")
    assert not tree.is_direct
    out = tree.assemble(tree.hand_out())
    assert out["tag"] == "ok" and out["y"][1] is None
    assert torch.equal(out["y"][0], t) and out["y"][0] is not t
    with pytest.raises(OptionsError, match=r"output\['y'\]: object"):
        OutputPlan({"y": object()}, "f")


# -- the call path and autograd, on fake graphs ---------------------------------------------

def test_sgd_steps_match_eager_exactly():
    graphed, control = linear_pair()
    rt = fake(graphed, torch.randn(5, 8, dtype=F64))
    opts = [torch.optim.SGD(m.parameters(), lr=0.1) for m in (graphed, control)]
    for _ in range(4):
        x = torch.randn(5, 8, dtype=F64)
        for fn, opt in zip((rt, control), opts, strict=True):
            opt.zero_grad(set_to_none=True)
            fn(x).pow(2).sum().backward()
            opt.step()
    for p, pc in zip(graphed.parameters(), control.parameters(), strict=True):
        assert torch.equal(p, pc)


@pytest.mark.parametrize("grad_before", ["none", "zeros"])
def test_two_backward_passes_accumulate_like_eager(grad_before, relocations):
    graphed, control = linear_pair()
    rt = fake(graphed, torch.randn(5, 8, dtype=F64))
    if grad_before == "zeros":  # zero_grad(set_to_none=False) after an earlier step
        for p in list(graphed.parameters()) + list(control.parameters()):
            p.grad = torch.zeros_like(p)
    backward_twice(rt, control)
    for p, pc in zip(graphed.parameters(), control.parameters(), strict=True):
        assert torch.equal(p.grad, pc.grad)
    # Only a .grad that adopted the first pass's gradient moves, once per parameter; an
    # existing .grad accumulates in place and nothing is copied.
    assert len(relocations) == (2 if grad_before == "none" else 0)


def test_without_the_guard_accumulation_is_wrong(monkeypatch):
    # The failure the guard exists for (PyTorch issue 181723), reproduced on the CPU.
    monkeypatch.setattr(GradBuffers, "settle", lambda self, handed, leaves: None)
    graphed, control = linear_pair()
    rt = fake(graphed, torch.randn(5, 8, dtype=F64))
    backward_twice(rt, control)
    assert not torch.equal(graphed.weight.grad, control.weight.grad)


def test_usual_loop_copies_nothing(relocations):
    graphed, _ = linear_pair()
    h = torch.nn.Linear(4, 4).to(F64)
    first, second = fake_group([(graphed, (torch.randn(5, 8, dtype=F64),), {}),
                                (h, (torch.randn(5, 4, dtype=F64, requires_grad=True),), {})])
    opt = torch.optim.SGD(list(graphed.parameters()) + list(h.parameters()), lr=0.01)
    for _ in range(3):
        opt.zero_grad(set_to_none=True)
        second(first(torch.randn(5, 8, dtype=F64))).sum().backward()
        opt.step()
    # The gradient the second callable hands the first is alive during the first's backward:
    # the guard must know the first's backward graph cannot overwrite it.
    assert relocations == []


def test_kept_autograd_grad_results_keep_their_values(relocations):
    graphed, control = linear_pair()
    rt = fake(graphed, torch.randn(5, 8, dtype=F64))
    kept = []
    for seed in (1, 2):
        torch.manual_seed(seed)
        x = torch.randn(5, 8, dtype=F64)
        kept.append(torch.autograd.grad(rt(x).sum(), list(graphed.parameters())))
        expected = torch.autograd.grad(control(x).sum(), list(control.parameters()))
        assert all(torch.equal(a, b) for a, b in zip(kept[-1], expected, strict=True))
    torch.manual_seed(1)
    expected = torch.autograd.grad(control(torch.randn(5, 8, dtype=F64)).sum(),
                                   list(control.parameters()))
    assert all(torch.equal(a, b) for a, b in zip(kept[0], expected, strict=True))
    assert len(relocations) == 2


def test_leaf_argument_gradients_accumulate(relocations):
    add = fake(torch.add, torch.randn(3, dtype=F64, requires_grad=True),
               torch.randn(3, dtype=F64, requires_grad=True))
    a, b = (torch.randn(3, dtype=F64, requires_grad=True) for _ in range(2))
    weights = torch.randn(3, dtype=F64)
    (add(a, b) * weights).sum().backward()  # both gradients are the one static grad buffer
    (add(a, b) * 2 * weights).sum().backward()
    assert torch.equal(a.grad, 3 * weights) and torch.equal(b.grad, 3 * weights)
    assert len(relocations) == 2


def test_a_view_kept_by_a_hook_warns_and_switches_to_copies():
    graphed, _ = linear_pair()
    rt = fake(graphed, torch.randn(5, 8, dtype=F64, requires_grad=True))
    kept = []
    x = torch.randn(5, 8, dtype=F64, requires_grad=True)
    y = x * 1
    y.register_hook(lambda g: kept.append(g.view(-1)))
    rt(y).sum().backward()
    with pytest.warns(UserWarning, match="args\\[0\\] is still referenced.*returned as copies"):
        rt(torch.randn(5, 8, dtype=F64, requires_grad=True)).sum().backward()
    assert rt._back.grads.copy[0] and not rt._back.grads.copy[1]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        rt(torch.randn(5, 8, dtype=F64, requires_grad=True)).sum().backward()


def test_without_storage_counts_every_gradient_is_copied(monkeypatch):
    monkeypatch.setattr(_autograd_guard, "_use_count", None)
    graphed, control = linear_pair()
    rt = fake(graphed, torch.randn(5, 8, dtype=F64))
    assert all(rt._back.grads.copy)
    backward_twice(rt, control)
    assert torch.equal(graphed.weight.grad, control.weight.grad)


def test_backward_after_a_newer_forward_is_refused():
    graphed, _ = linear_pair()
    rt = fake(graphed, torch.randn(5, 8, dtype=F64))
    first = rt(torch.randn(5, 8, dtype=F64)).sum()
    rt(torch.randn(5, 8, dtype=F64))
    with pytest.raises(ReplayError, match="call #1, but its forward graph has been replayed "
                                          "since \\(got call #2"):
        first.backward()


def test_outputs_without_grad_are_not_differentiable():
    def stats(x):
        return {"y": x * 2, "idx": x.argmax(dim=1), "scale": 0.5}

    rt = fake(stats, torch.randn(4, 3, dtype=F64, requires_grad=True))
    x = torch.randn(4, 3, dtype=F64, requires_grad=True)
    out = rt(x)
    assert out["y"].requires_grad and not out["idx"].requires_grad and out["scale"] == 0.5
    assert torch.equal(out["idx"], x.argmax(dim=1))
    out["y"].sum().backward()
    assert torch.equal(x.grad, torch.full_like(x, 2.0))


def test_unused_output_gets_a_zero_gradient():
    def two(x):
        return x * 3, x * 5

    rt = fake(two, torch.randn(3, dtype=F64, requires_grad=True))
    x = torch.randn(3, dtype=F64, requires_grad=True)
    rt(x)[1].sum().backward()
    assert torch.equal(x.grad, torch.full_like(x, 5.0))


def test_sample_args_without_grad_give_no_gradient():
    rt = fake(lambda x: x * 2, torch.randn(3, dtype=F64))  # captured without grad
    x = torch.randn(3, dtype=F64, requires_grad=True)
    out = rt(x)
    assert not out.requires_grad and torch.equal(out, x.detach() * 2)


def test_create_graph_gives_first_order_gradients_only():
    rt = fake(lambda x: x.pow(2), torch.randn(3, dtype=F64, requires_grad=True))
    x = torch.randn(3, dtype=F64, requires_grad=True)
    (gx,) = torch.autograd.grad(rt(x).pow(2).sum(), x, create_graph=True)
    assert torch.allclose(gx, 4 * x.detach() ** 3)
    with pytest.raises(RuntimeError, match="differentiate twice"):
        gx.sum().backward()


def test_no_grad_calls_skip_autograd():
    graphed, control = linear_pair()
    rt = fake(graphed, torch.randn(5, 8, dtype=F64))
    x = torch.randn(5, 8, dtype=F64)
    with torch.no_grad():
        out = rt(x)
    assert out.grad_fn is None and torch.equal(out, control(x).detach())
    assert rt.static_inputs[0] is not x and torch.equal(rt.static_inputs[0], x)


def test_module_forward_follows_training_mode():
    graphed, control = linear_pair()
    rt = fake(graphed, torch.randn(5, 8, dtype=F64))
    calls = []
    original = graphed.forward
    graphed.forward = graphed_forward(rt, graphed, lambda *a: calls.append(1) or original(*a))
    x = torch.randn(5, 8, dtype=F64)
    assert torch.equal(graphed(x), control(x)) and calls == []
    graphed.eval()
    assert torch.equal(graphed(x), control(x)) and calls == [1]
    assert graphed.forward.graphed is rt
    assert copy.deepcopy(rt) is rt


def test_kwargs_and_nested_call_path():
    def fn(batch, *, scale, mode):
        y = batch["x"] @ batch["w"][0] * scale
        return {"y": y, "parts": [y.sum(), mode]}

    x = torch.randn(3, 4, dtype=F64)
    w = torch.randn(4, 2, dtype=F64, requires_grad=True)
    s = torch.tensor(2.0, dtype=F64)
    rt = fake(fn, {"x": x, "w": [w]}, scale=s, mode="train")
    nx, nw = torch.randn(3, 4, dtype=F64), torch.randn(4, 2, dtype=F64, requires_grad=True)
    out = rt({"x": nx, "w": [nw]}, mode="train", scale=torch.tensor(3.0, dtype=F64))
    expected = nx @ nw * 3.0
    assert torch.allclose(out["y"], expected) and out["parts"][1] == "train"
    out["parts"][0].backward()
    assert torch.allclose(nw.grad, nx.t() @ torch.full((3, 2), 3.0, dtype=F64))
    with pytest.raises(ReplayError, match=r"kwargs\['mode'\].*differs"):
        rt({"x": nx, "w": [nw]}, mode="eval", scale=s)


def test_foreign_tensors_are_found_and_non_leaf_inputs_end_the_walk():
    from cugraphrt_torch.autograd.autograd import _check_foreign

    weight = torch.nn.Parameter(torch.randn(3, 3))
    x = torch.randn(2, 3, requires_grad=True)
    h = x * 2  # a non-leaf sample argument: its history is not the callable's business
    _check_foreign([h @ h.t()], [(h, "args[0]")], "f")
    with pytest.raises(OptionsError, match=r"shape \(3, 3\).*gradients would be lost"):
        _check_foreign([h @ weight], [(h, "args[0]")], "f")
    _check_foreign([h @ weight, weight], [(h, "args[0]"), (weight, "parameter 'w'")], "f")


def test_load_converts_floating_dtypes_like_torch_unless_strict():
    static = torch.randn(3, 5)
    converting = ArgPlan((static,), {}, "f", convert_dtypes=True)
    half = torch.randn(3, 5, dtype=torch.float64).to(torch.float16)
    converting.load((half,))
    assert static.dtype == torch.float32
    assert torch.equal(static, half.to(torch.float32))  # float16 -> float32 is exact
    wide = torch.randn(3, 5, dtype=torch.float64)
    converting.load((wide,))
    assert torch.equal(static, wide.to(torch.float32))
    # integers are never converted into a floating static, nor shapes bent
    with pytest.raises(ReplayError, match=r"torch\.int64"):
        converting.load((torch.ones(3, 5, dtype=torch.int64),))
    with pytest.raises(ReplayError, match=r"shape \(5, 3\)"):
        converting.load((torch.randn(5, 3, dtype=torch.float16),))
    strict = ArgPlan((static,), {}, "f")
    with pytest.raises(ReplayError, match=r"torch\.float16.*strict_dtypes=True"):
        strict.load((half,))


def test_a_dropped_callable_pins_no_buffer_and_its_kept_gradients_still_move():
    """The pool's pending list holds a watch of the gradient buffers, not the buffers: once the
    graphed callable is gone, its buffers go (the pool and its guard are not kept alive for
    good), and a gradient it handed out that the user kept is still moved to a copy before a
    replay that could overwrite it."""
    guard = AliasGuard()
    buffer = torch.randn(6, dtype=F64)
    key = buffer.untyped_storage()._cdata
    param = torch.nn.Parameter(torch.zeros(6, dtype=F64))
    grads = GradBuffers([(1, buffer, param, "parameter 'w'")], [buffer], "fn")
    result: list = [None, None]
    handed = grads.hand_out(result)
    kept = result[1]
    assert kept.untyped_storage()._cdata == key  # an alias of the static buffer
    values = kept.clone()
    guard.record(0, grads.watch, handed, ())
    dropped = weakref.ref(buffer)
    del grads, buffer, result
    assert dropped() is None, "the pending list kept the buffer alive"
    guard.settle(0)  # before a replay of the pool's first graph
    assert kept.untyped_storage()._cdata != key and torch.equal(kept, values)
    assert guard.pending == [] and guard.max_seq == -1


def test_a_graphed_module_and_its_callable_go_without_a_garbage_collection():
    """Nothing the module's new forward, the callable or its autograd Function holds refers
    back to them: dropping the module frees the callable (and its graphs) by reference
    counting alone, after a backward as before one."""
    import gc

    graphed, control = linear_pair()
    rt = fake(graphed, torch.randn(5, 8, dtype=F64))
    graphed.forward = graphed_forward(rt, graphed, graphed.forward)
    x = torch.randn(5, 8, dtype=F64)
    graphed(x).pow(2).sum().backward()
    graphed.eval()
    assert torch.equal(graphed(x), control(x))  # the original forward, reached weakly
    watch = weakref.ref(rt), weakref.ref(graphed)
    gc.disable()
    try:
        del rt, graphed
        assert watch[0]() is None and watch[1]() is None
    finally:
        gc.enable()


def test_a_callables_gradient_targets_are_read_once_after_its_first_call(monkeypatch):
    # Warm-ups and both captures ask for the targets: one walk of the module's parameters
    # serves them all (a ResNet's walk per call was build time on the host), and it happens
    # after the first call, so that a lazy module's parameters exist.
    from cugraphrt_torch.autograd.autograd import _Work

    module = torch.nn.LazyLinear(3).to(F64)
    x = torch.randn(5, 4, dtype=F64, requires_grad=True)
    walks = []
    original = torch.nn.Module.named_parameters

    def counting(self, *args, **kwargs):
        walks.append(self)
        return original(self, *args, **kwargs)

    monkeypatch.setattr(torch.nn.Module, "named_parameters", counting)
    work = _Work(module, (x,), {}, strict_dtypes=False)
    work.call()
    first = work.targets()
    assert work.targets() is first and work.targets() is first
    assert walks == [module]
    assert [label for _, label in first] == ["args[0]", "parameter 'weight'",
                                            "parameter 'bias'"]
    assert first[1][0] is module.weight and first[1][0].shape == (3, 4)


def test_gradient_buffer_baselines_read_each_held_storage_once(monkeypatch):
    # One gradient buffer per parameter, each counted against the callable's held tensors:
    # grouped by storage in one pass (a pass per buffer was quadratic in a ResNet's
    # parameters), with the counts it found before: a view of a buffer adds its base.
    buffers = [torch.randn(4, dtype=F64) for _ in range(12)]
    others = [torch.randn(3, dtype=F64) for _ in range(30)]
    view = buffers[5][1:]
    held = others + buffers + [view]
    reads = []
    original = _autograd_guard._storage_id

    def counting(tensor):
        reads.append(tensor)
        return original(tensor)

    monkeypatch.setattr(_autograd_guard, "_storage_id", counting)
    slots = [(1 + j, b, None, f"args[{j}]") for j, b in enumerate(buffers)]
    grads = GradBuffers(slots, held, "fn")
    assert len(reads) <= len(held) + 2 * len(buffers)  # a pass per buffer read 500 or more
    assert grads.copy == [False] * len(buffers)
    baselines = {key: baseline for key, baseline, _ in grads.storages}
    for j, buffer in enumerate(buffers):
        # Held tensors over it (itself; the view and its base for buffer 5) + the storage
        # object _storage_id made.
        assert baselines[original(buffer)] == (2 if j == 5 else 1) + 1
