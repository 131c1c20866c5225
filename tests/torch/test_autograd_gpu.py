"""make_graphed_callables on the GPU: ported from PyTorch's test_graph_make_graphed_callables
and its variants, plus accumulation, keyword/nested arguments, argument errors and the
whole-step capture (the training examples run in test_examples_gpu.py). Graphed runs are
compared bitwise with ungraphed controls from the same seed, as PyTorch's tests do (same
kernels on the same data give the same bits)."""

from __future__ import annotations

import copy
import warnings

import pytest

torch = pytest.importorskip("torch")

from tests.conftest import torch_gpu_marks  # noqa: E402

pytestmark = torch_gpu_marks(torch)

import cugraphrt_torch  # noqa: E402
from cugraphrt_torch.autograd._autograd_guard import GradBuffers  # noqa: E402
from cugraphrt_torch.autograd.autograd import make_graphed_callables  # noqa: E402

import cugraphrt  # noqa: E402
from cugraphrt.errors import OptionsError, ReplayError  # noqa: E402

N, D_IN, H, D_OUT = 64, 256, 128, 64  # torch's test uses 640x4096; smaller keeps it fast


def seed(value: int = 5) -> None:
    torch.manual_seed(value)
    torch.cuda.manual_seed(value)


def assert_bitwise(a, b):
    assert torch.equal(a, b), f"max difference {(a.float() - b.float()).abs().max().item()}"


class MLP1(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.net_1 = torch.nn.Sequential(torch.nn.Linear(D_IN, H), torch.nn.Dropout(p=0.1))
        self.net_2 = torch.nn.Sequential(torch.nn.Linear(H, H), torch.nn.Dropout(p=0.2))

    def forward(self, input_dict: dict):
        return self.net_2(self.net_1(input_dict["x"]))


class MLP2(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(H, D_OUT), torch.nn.Dropout(p=0.2))

    def forward(self, x):
        return self.net(x)


def gather_rows(x):
    idx = torch.arange(x.size(0), device=x.device).view(-1, 1).repeat(1, x.size(1))
    return {"output": torch.gather(x, 0, idx)}


class Parameterless(torch.nn.Module):
    def forward(self, x):
        return gather_rows(x)


@pytest.mark.parametrize("with_amp, allow_unused_input, torch_samples",
                         [(False, True, False), (True, True, False), (True, True, True),
                          (False, False, False)])
def test_two_modules_and_two_functions_train_like_eager(exact_math, with_amp,
                                                        allow_unused_input, torch_samples):
    seed()
    models = [torch.nn.Sequential(MLP1(), MLP2(), Parameterless()).cuda() for _ in range(2)]
    graphed_model, control = models
    graphed_model.load_state_dict(control.state_dict())
    opts = [torch.optim.SGD(m.parameters(), lr=0.1) for m in models]
    # torch_samples: float32 intermediate samples, as torch's own test has them. Under
    # autocast each graphed section then receives the previous one's float16 output and
    # converts it on copy-in, like torch does. Otherwise the samples have the dtype real
    # inputs will have (float16 under autocast) and no conversion happens.
    act = torch.float16 if with_amp and not torch_samples else torch.float32
    x = torch.randn(N, D_IN, device="cuda")
    h = torch.randn(N, H, device="cuda", dtype=act, requires_grad=True)
    h2 = torch.randn(N, D_OUT, device="cuda", dtype=act, requires_grad=True)
    unused = torch.randn(N, H, device="cuda", requires_grad=True)
    y_pred = torch.randn(N, D_OUT, device="cuda", dtype=act, requires_grad=True)
    y = torch.randn(N, D_OUT, device="cuda")
    relu, mse = torch.nn.functional.relu, torch.nn.functional.mse_loss
    autocast = torch.autocast("cuda", enabled=with_amp, cache_enabled=False)
    callables = (graphed_model[0], graphed_model[1], graphed_model[2], relu, mse)
    samples = (({"x": x, "unused_input": unused},), (h,), (h2,), (y_pred,), (y_pred, y))
    if not allow_unused_input:
        with pytest.raises(OptionsError, match=r"no gradient path from args\[0\]\['unused_inp"):
            make_graphed_callables(callables, samples, allow_unused_input=False)
        return
    with autocast:
        *sections, relu_g, mse_g = make_graphed_callables(callables, samples,
                                                          allow_unused_input=True)
    assert all(a is b for a, b in zip(sections, graphed_model, strict=False))
    inputs = [torch.rand_like(x) for _ in range(10)]
    targets = [torch.rand_like(y) for _ in range(10)]
    for model, opt, relu_fn, loss_fn in ((graphed_model, opts[0], relu_g, mse_g),
                                         (control, opts[1], relu, mse)):
        seed()  # same RNG state: dropout masks are bitwise the same
        for data, target in zip(inputs, targets, strict=True):
            opt.zero_grad(set_to_none=True)
            with autocast:
                out = model({"x": data, "unused_input": unused})["output"]
                loss = loss_fn(relu_fn(out), target)
            loss.backward()
            opt.step()
    for p, pc in zip(graphed_model.parameters(), control.parameters(), strict=True):
        assert_bitwise(p, pc)
    # Captured in training mode: eval runs the original forward.
    graphed_model.eval()
    control.eval()
    assert_bitwise(graphed_model({"x": inputs[0]})["output"], control({"x": inputs[0]})["output"])


def test_strict_dtypes_refuses_the_conversion():
    lin = torch.nn.Linear(8, 8).cuda()
    graphed = make_graphed_callables(lin, (torch.randn(4, 8, device="cuda", requires_grad=True),),
                                     strict_dtypes=True)
    with pytest.raises(ReplayError, match=r"got a tensor of shape \(4, 8\), torch.float16"):
        graphed(torch.randn(4, 8, device="cuda", dtype=torch.float16))
    with pytest.raises(OptionsError, match="strict_dtypes"):
        make_graphed_callables(lin, (torch.randn(4, 8, device="cuda"),), strict_dtypes="yes")


def test_autocast_weight_cache_is_refused():
    lin = torch.nn.Linear(8, 8).cuda()
    with torch.autocast("cuda", cache_enabled=True), \
            pytest.raises(OptionsError, match="cache_enabled=False"):
        make_graphed_callables(lin, (torch.randn(4, 8, device="cuda"),))


class DictParameterless(torch.nn.Module):
    def forward(self, input_dict: dict):
        return gather_rows(input_dict["x"])


@pytest.mark.parametrize("allow_unused_input", [True, False])
def test_parameterless_nograd_module(allow_unused_input):
    seed()
    model = torch.nn.Sequential(DictParameterless()).cuda()
    control = copy.deepcopy(model)
    x = torch.randn(N, D_IN, device="cuda", requires_grad=False)
    unused = torch.randn(N, H, device="cuda", requires_grad=False)
    make_graphed_callables(model[0], ({"x": x, "unused_input": unused},),
                           allow_unused_input=allow_unused_input)
    assert model[0].forward.graphed.backward_graph is None  # nothing requires grad
    for _ in range(3):
        data = torch.rand_like(x, requires_grad=True)  # requires grad; the sample did not
        out = model({"x": data, "unused_input": unused})["output"]
        assert not out.requires_grad  # no gradient was captured for x
        assert_bitwise(out, control({"x": data})["output"].detach())
    with pytest.raises(ReplayError, match="do not have the structure"):
        model({"x": x})  # training mode: the graph needs the captured structure
    model.eval()  # eval runs the original forward, which takes any dict
    assert_bitwise(model({"x": x})["output"], control({"x": x})["output"])


def test_same_pool_separate_calls(exact_math):
    seed()
    models = [torch.nn.Sequential(torch.nn.Linear(32, 128), torch.nn.ReLU(),
                                  torch.nn.Linear(128, 128)).cuda() for _ in range(3)]
    pool = cugraphrt.graph_pool_handle()
    graphed = [make_graphed_callables(copy.deepcopy(m), (torch.randn(64, 32, device="cuda"),),
                                      pool=pool) for m in models]
    assert len({g.forward.graphed.forward_graph.pool().id for g in graphed}) == 1
    for model, graphed_model in zip(models, graphed, strict=True):
        x = torch.randn(64, 32, device="cuda")
        y, yg = model(x), graphed_model(x)
        loss, loss_g = y.norm(), yg.norm()
        loss.backward()
        loss_g.backward()
        assert_bitwise(y, yg)
        assert_bitwise(loss, loss_g)
        for p, pg in zip(model.parameters(), graphed_model.parameters(), strict=True):
            assert_bitwise(p.grad, pg.grad)
            assert p.data_ptr() != pg.data_ptr() and p.grad.data_ptr() != pg.grad.data_ptr()


def test_accumulation_over_two_passes_equals_eager(exact_math, monkeypatch):
    # PyTorch issue 181723: torch's graphed Linear(32, 32) accumulates wrong gradients here.
    seed()
    control = torch.nn.Linear(32, 32).cuda()
    model = make_graphed_callables(copy.deepcopy(control), (torch.randn(16, 32, device="cuda"),))
    moved = []
    original = GradBuffers._relocate
    monkeypatch.setattr(GradBuffers, "_relocate",
                        staticmethod(lambda key, holders: moved.append(key) or
                                     original(key, holders)))
    for _step in range(3):
        xs = [torch.randn(16, 32, device="cuda") for _ in range(2)]
        for m in (model, control):
            m.zero_grad(set_to_none=True)
            for x in xs:  # two passes before the optimizer would step
                m(x).pow(2).sum().backward()
        for p, pc in zip(model.parameters(), control.parameters(), strict=False):
            assert_bitwise(p.grad, pc.grad)
    assert len(moved) == 3 * 2  # one copy per parameter per accumulation window, no more
    moved.clear()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # an unexplained reference would warn
        for _ in range(3):  # the usual loop: zero_grad(set_to_none=True), one pass
            model.zero_grad(set_to_none=True)
            model(torch.randn(16, 32, device="cuda")).sum().backward()
    assert moved == []


def test_kwargs_and_nested_inputs_and_outputs(exact_math):
    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.enc = torch.nn.Linear(16, 32)
            self.head = torch.nn.Linear(32, 4)

        def forward(self, batch, *, mask, scale=1.0, mode="sum"):
            h = torch.relu(self.enc(batch["x"]) * scale) * mask
            out = self.head(h + batch["extra"][0])
            return {"out": out, "aux": [h.mean(), mode], "count": mask.sum()}

    seed()
    control = Net().cuda()
    model = copy.deepcopy(control)
    batch = {"x": torch.randn(8, 16, device="cuda"), "extra": [torch.randn(8, 32, device="cuda")]}
    mask = torch.ones(8, 1, device="cuda")
    make_graphed_callables(model, (batch,), sample_kwargs={"mask": mask, "scale": 0.5})
    opts = [torch.optim.SGD(m.parameters(), lr=0.05) for m in (model, control)]
    for _ in range(5):
        b = {"x": torch.randn(8, 16, device="cuda"), "extra": [torch.randn(8, 32, device="cuda")]}
        m_ = (torch.rand(8, 1, device="cuda") > 0.3).float()
        for net, opt in zip((model, control), opts, strict=True):
            opt.zero_grad(set_to_none=True)
            out = net(b, scale=0.5, mask=m_)
            assert out["aux"][1] == "sum"
            (out["out"].square().mean() + out["aux"][0]).backward()
            opt.step()
        assert_bitwise(model(b, mask=m_, scale=0.5)["count"], m_.sum())
    for p, pc in zip(model.parameters(), control.parameters(), strict=False):
        assert_bitwise(p, pc)
    good = dict(mask=mask, scale=0.5)
    with pytest.raises(ReplayError, match=r"kwargs\['scale'\].*expected float 0.5, got float 2"):
        model(batch, mask=mask, scale=2.0)
    with pytest.raises(ReplayError, match=r"missing \['mask'\]"):
        model(batch, scale=0.5)
    with pytest.raises(ReplayError, match=r"args\[0\]\['x'\].*shape \(8, 16\).*got .*\(4, 16\)"):
        model({"x": torch.randn(4, 16, device="cuda"), "extra": batch["extra"]}, **good)


def test_wrong_arguments_raise_replay_error_naming_them():
    lin = make_graphed_callables(torch.nn.Linear(8, 8).cuda(), (torch.randn(4, 8, device="cuda"),))
    mse = make_graphed_callables(torch.nn.functional.mse_loss,
                                 (torch.randn(4, 8, device="cuda", requires_grad=True),
                                  torch.randn(4, 8, device="cuda")))
    x = torch.randn(4, 8, device="cuda")
    for bad, got in [(torch.randn(5, 8, device="cuda"), r"\(5, 8\)"),
                     (x.to(torch.int32), "torch.int32"), (x.cpu(), "on cpu")]:
        with pytest.raises(ReplayError, match=f"argument args\\[0\\] of graphed callable "
                                              f"Linear .*got .*{got}"):
            lin(bad)
    # Another floating dtype is converted on copy-in, as torch's make_graphed_callables does.
    converted = lin(x.double()).detach().clone()  # outputs are static: copy before the next call
    assert torch.equal(converted, lin(x))
    with pytest.raises(ReplayError, match=r"captured with 2 positional arguments \(got 1\)"):
        mse(x)
    with pytest.raises(ReplayError, match=r"argument args\[1\] of graphed callable mse_loss"):
        mse(x, x[:2])


def test_function_reading_a_global_parameter_is_refused():
    weight = torch.nn.Parameter(torch.randn(8, 8, device="cuda"))

    def uses_global(x):
        return x @ weight

    with pytest.raises(OptionsError, match=r"gradients\s+would be lost|would be lost"):
        make_graphed_callables(uses_global, (torch.randn(4, 8, device="cuda"),))


class Recorder(torch.nn.Module):
    """BatchNorm that notes the stream of every eager (not captured) forward."""

    def __init__(self):
        super().__init__()
        self.bn = torch.nn.BatchNorm1d(8)
        self.streams = []

    def forward(self, x):
        if not torch.cuda.is_current_stream_capturing():
            self.streams.append(torch.cuda.current_stream())
        return self.bn(x)


def test_warm_up_on_a_side_stream_and_buffers_restored():
    module = Recorder().cuda()
    before = [b.clone() for b in module.buffers()]
    make_graphed_callables(module, (torch.randn(16, 8, device="cuda"),), num_warmup_iters=2)
    streams, module.streams = module.streams, []
    assert len(streams) == 2 and all(s != torch.cuda.default_stream() for s in streams)
    # warm-up is not a training step
    for buffer, value in zip(module.buffers(), before, strict=True):
        assert_bitwise(buffer, value)
    x = torch.randn(16, 8, device="cuda")
    control = copy.deepcopy(module)
    control.forward = Recorder.forward.__get__(control)  # the copy shares the graphs: unbind
    assert_bitwise(module(x), control(x))  # and the captured update runs on replay
    for buffer, expected in zip(module.buffers(), control.buffers(), strict=True):
        assert_bitwise(buffer, expected)


def whole_step_setup(opt_name: str):
    seed(3)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(),
                                torch.nn.Linear(64, 8)).cuda()
    control = copy.deepcopy(model)

    def make(m):
        if opt_name == "adam":
            return torch.optim.Adam(m.parameters(), lr=1e-2, capturable=True)
        return torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9)

    return model, control, make(model), make(control)


@pytest.mark.parametrize("opt_name", ["sgd", "adam"])
def test_whole_step_capture_equals_eager(exact_math, opt_name):
    model, control, opt, opt_c = whole_step_setup(opt_name)
    loss_fn = torch.nn.MSELoss()
    static_x = torch.randn(16, 32, device="cuda")
    static_y = torch.randn(16, 8, device="cuda")

    def step(m, o, x, y):
        o.zero_grad(set_to_none=True)
        loss = loss_fn(m(x), y)
        loss.backward()
        o.step()
        return loss

    side = torch.cuda.Stream()  # warm-up and capture on one stream (per-stream workspaces)
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up steps are real steps: the control takes them too
        for _ in range(3):
            step(model, opt, static_x, static_y)
            step(control, opt_c, static_x, static_y)
    torch.cuda.current_stream().wait_stream(side)
    g = cugraphrt.Graph()
    opt.zero_grad(set_to_none=True)
    with cugraphrt_torch.graph(g, stream=side):
        static_loss = loss_fn(model(static_x), static_y)
        static_loss.backward()
        opt.step()
    for _ in range(10):
        x, y = torch.randn(16, 32, device="cuda"), torch.randn(16, 8, device="cuda")
        static_x.copy_(x)
        static_y.copy_(y)
        g.replay(torch.cuda.current_stream())
        expected = step(control, opt_c, x, y)
        assert_bitwise(static_loss, expected.detach())
    for p, pc in zip(model.parameters(), control.parameters(), strict=True):
        assert_bitwise(p, pc)
