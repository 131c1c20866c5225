"""Device-side control flow workloads: cg_tolerance (CuPy) and decode_until_eos (torch).

Both run a loop whose trip count only the device knows: conjugate gradient until the
residual is small, greedy decoding until every sequence emitted end-of-sequence. The systems
differ in who decides when to stop: the host after every iteration (a synchronization each
time), the host every 10 iterations (fewer synchronizations, up to 9 wasted iterations), a
graph of a fixed iteration count (known in advance only in a benchmark), and one graph launch
whose WHILE node decides on the device (:func:`cugraphrt.while_loop`). Each graph's result is
checked against eager's before it is timed, iteration counts (tokens) included.
"""

from __future__ import annotations

from collections.abc import Callable
from time import perf_counter

import cupy
import numpy as np

import cugraphrt

from .poisson import LAPLACIAN
from .spec import Context, RowBuilder, SystemUnavailable, Target, Workload, check_close, keep
from .timing import device_sync, host_batch, single

__all__ = ["CG_TOLERANCE", "DECODE_UNTIL_EOS"]

MS, US = 1e3, 1e6

# -- cg_tolerance ----------------------------------------------------------------------------

CG_SYSTEMS = ("eager_check_1", "eager_check_10", "graph_fixed", "while_loop")
CG_GRID = 512  # unknowns: CG_GRID**2, the 5-point Laplacian with zero boundary values
CG_TOL = 1e-3  # relative residual ||r|| / ||b||: about 700 iterations for this problem



class ConjugateGradient:
    """Matrix-free CG for the 2-D Poisson problem; every scalar lives on the device.

    All state is preallocated, so one object serves eager runs and graphs alike (a graph
    reads and writes these arrays on every replay).
    """

    def __init__(self, grid: int, seed: int, tol: float) -> None:
        size = grid * grid
        self.grid = np.int32(grid)
        rng = np.random.default_rng(seed)
        self.b = cupy.asarray(rng.standard_normal(size))
        self.x, self.r, self.p, self.ap = (cupy.zeros(size) for _ in range(4))
        self.rr = cupy.zeros(())
        self.limit = (tol * tol) * cupy.sum(self.b * self.b)  # compare squared norms

    def start(self) -> None:
        """x = 0, r = p = b."""
        self.x.fill(0)
        self.r[...] = self.b
        self.p[...] = self.b
        self.rr[...] = cupy.sum(self.r * self.r)

    def step(self) -> None:
        """One CG iteration as a CuPy user writes it: 14 kernels, two of them reductions."""
        LAPLACIAN(self.p, self.grid, self.ap)
        alpha = self.rr / cupy.sum(self.p * self.ap)
        self.x += alpha * self.p
        self.r -= alpha * self.ap
        rr_new = cupy.sum(self.r * self.r)
        self.p *= rr_new / self.rr
        self.p += self.r
        self.rr[...] = rr_new

    def going(self) -> cupy.ndarray:
        """Whether the residual is still above the tolerance (a 0-d device bool)."""
        return self.rr > self.limit

    def solve_eager(self, check_every: int) -> int:
        """Solve with the host reading the residual every ``check_every`` iterations."""
        self.start()
        count = 0
        while count % check_every or bool(self.going()):
            self.step()
            count += 1
        return count

    def solve_while_loop(self) -> cupy.ndarray:
        """Solve with the loop decided on the device; returns the iteration count (0-d)."""
        self.start()
        return cugraphrt.while_loop(self.going, self.step)

    def solve_fixed(self, iterations: int) -> None:
        """Run exactly ``iterations`` iterations (the count must be known in advance)."""
        self.start()
        for _ in range(iterations):
            self.step()


def run_cg_tolerance(ctx: Context) -> None:
    """Wall time of one CG solve to a residual tolerance, per way of stopping the loop."""
    repeats = ctx.repeats(full=10, quick=4)
    stream = cupy.cuda.Stream(non_blocking=True)
    solve = RowBuilder("solve", "ms", CG_SYSTEMS, "eager_check_10", "while_loop")
    counts = RowBuilder("iterations", "iters", CG_SYSTEMS, "eager_check_1", "while_loop")
    with stream:
        cg = ConjugateGradient(CG_GRID, seed=7, tol=CG_TOL)
        ctx.step("eager reference")
        expected_count = cg.solve_eager(1)
        expected_x = cupy.asnumpy(cg.x)
        counts.set("eager_check_1", single(expected_count))
        counts.set("eager_check_10", single(cg.solve_eager(10)))
    batches: dict[str, Callable[[], float] | None] = {
        f"eager_check_{k}": keep(_cg_batch, lambda k=k: cg.solve_eager(k), stream, cg)
        for k in (1, 10)}
    ctx.step("capture")
    for system, capture in (("while_loop", cg.solve_while_loop),
                            ("graph_fixed", lambda: cg.solve_fixed(expected_count))):
        built = solve.setup(system, lambda capture=capture: _cg_graph(cg, stream, capture))
        if built is None:
            continue
        graph, count = built
        got = expected_count if count is None else int(count)
        counts.set(system, single(got))
        if got != expected_count:
            solve.fail(system, RuntimeError(f"{got} iterations, eager ran {expected_count}"))
            continue
        check_close(cupy.asnumpy(cg.x), expected_x, f"{system} solution", tol=1e-10)
        batches[system] = keep(_cg_batch, graph.replay, stream, cg, graph)
    ctx.step("measure")
    solve.measure(batches, repeats, scale=MS, warmup=1)
    ctx.emit(solve.build())
    ctx.emit(counts.build())


def _cg_graph(cg: ConjugateGradient, stream, capture):
    graph = cugraphrt.Graph()
    with cugraphrt.graph(graph, stream=stream):
        count = capture()
    graph.replay(stream)
    stream.synchronize()
    return graph, count


def _cg_batch(solve, stream, *kept) -> float:
    with stream:
        return host_batch(solve, 1, include_sync=True)


CG_TOLERANCE = Workload(
    "cg_tolerance", f"CuPy conjugate gradient, 2-D Poisson {CG_GRID}x{CG_GRID}, float64, to "
    f"relative residual {CG_TOL:g}: the host checking the residual every iteration or every "
    f"10, a graph of the known iteration count, one launch with cugraphrt.while_loop",
    CG_SYSTEMS, "eager_check_10",
    (Target("while_loop", "eager_check_10", 1 / 1.5, metric="solve"),
     Target("while_loop", "eager_check_1", 0.25, metric="solve")),
    run_cg_tolerance, own=("graph_fixed", "while_loop"))

# -- decode_until_eos ------------------------------------------------------------------------

# The reference is torch's own graph of the same compiled step, replayed by the same host
# loop; ``per_token_replays`` (the same loop over a cugraphrt graph) is information.
DECODE_SYSTEMS = ("eager", "torch_graph_replays", "per_token_replays", "one_launch")
DECODE_BATCH, PROMPT_LEN, MAX_NEW = 4, 16, 128
# Model sizes (layers, hidden). What one launch saves per token is the host round trip (a
# launch and a read of the done flag, about 20 us on an H100), so its share shrinks as the
# step grows: the target holds for draft-model sizes, the first here; the second, the model
# of earlier runs, is reported without one (docs/control-flow.md has the sweep).
DECODE_MODELS = ((1, 256), (2, 512))
# Inductor with eager's rounding: the graphs' tokens stay equal to the eager step's.
DECODE_COMPILE_OPTIONS = {"emulate_precision_casts": True}


def decode_label(layers: int, hidden: int) -> str:
    return f"{layers} layer{'s' if layers > 1 else ''}, hidden {hidden}"


class _Decoder:
    """Greedy decoding of a batch until every sequence emitted EOS (or MAX_NEW tokens).

    Static state (the current tokens, the cache position, the step, the done flags, whether
    any sequence is still running, and the output buffer) is updated in place by
    :meth:`step`, so the same step serves eager runs, a one-step graph and the body of a
    device-side loop.
    """

    def __init__(self, torch, layers: int, hidden: int) -> None:
        from .real_models import llama

        self.torch = torch
        length = PROMPT_LEN + MAX_NEW + 8
        _, self.model, self.prompt, self.cache = llama(torch, DECODE_BATCH, PROMPT_LEN, length,
                                                       layers=layers, hidden=hidden)
        cuda = dict(device="cuda")
        self.positions = torch.arange(PROMPT_LEN, **cuda)
        self.token = torch.zeros(DECODE_BATCH, 1, dtype=torch.int64, **cuda)
        self.position = torch.zeros(1, dtype=torch.int64, **cuda)
        self.count = torch.zeros((), dtype=torch.int64, **cuda)
        self.done = torch.zeros(DECODE_BATCH, dtype=torch.bool, **cuda)
        self.running = torch.ones((), dtype=torch.bool, **cuda)
        self.tokens = torch.zeros(DECODE_BATCH, MAX_NEW, dtype=torch.int64, **cuda)
        self.eos = torch.full((), -1, dtype=torch.int64, **cuda)  # chosen by choose_eos

    def prefill(self) -> None:
        """Reset the cache, run the prompt, and set the loop state to its start."""
        self.cache.reset()
        logits = self.model(input_ids=self.prompt, past_key_values=self.cache,
                            cache_position=self.positions, use_cache=True).logits
        self.token.copy_(logits[:, -1].argmax(-1, keepdim=True))
        self.position.fill_(PROMPT_LEN)
        self.count.zero_()
        self.done.zero_()
        self.running.fill_(True)
        self.tokens.fill_(0)

    def step(self) -> None:
        torch = self.torch
        logits = self.model(input_ids=self.token, past_key_values=self.cache,
                            cache_position=self.position, use_cache=True).logits
        chosen = torch.where(self.done, self.eos, logits[:, -1].argmax(-1))
        self.tokens.index_copy_(1, self.count.view(1), chosen[:, None])
        self.done.logical_or_(chosen == self.eos)
        # The loop's predicate, computed by the step itself: the host loop reads it, the
        # WHILE node's condition kernel reads it, and neither launches a kernel for it.
        torch.logical_not(self.done.all(), out=self.running)
        self.token.copy_(chosen[:, None])
        self.position.add_(1)
        self.count.add_(1)

    def going(self):
        return self.running

    def run_eager(self, step: Callable[[], None]) -> int:
        """The host loop: one step (eager or a replay), then a read of the running flag."""
        for generated in range(1, MAX_NEW + 1):
            step()
            if not bool(self.running):
                return generated
        return MAX_NEW

    def choose_eos(self) -> int:
        """An EOS id every sequence emits early in a greedy run without one (random weights
        have no EOS of their own): the token whose latest first appearance is earliest."""
        self.prefill()
        self.run_eager(self.step)
        rows = self.tokens.cpu().numpy()
        first = {}
        for token in set(rows[0].tolist()):
            hits = [np.flatnonzero(row == token) for row in rows]
            if all(len(h) for h in hits):
                first[token] = max(int(h[0]) for h in hits)
        eos = min(first, key=lambda t: first[t]) if first else int(rows[0][MAX_NEW // 2])
        self.eos.fill_(eos)
        return eos


def run_decode_until_eos(ctx: Context) -> None:
    """Per-token wall time of greedy decoding until every sequence emitted EOS."""
    rows = [(model, RowBuilder(f"per token ({decode_label(*model)})", "us", DECODE_SYSTEMS,
                               "torch_graph_replays", "one_launch"),
             RowBuilder(f"tokens ({decode_label(*model)})", "steps", DECODE_SYSTEMS, "eager",
                        "one_launch")) for model in DECODE_MODELS]
    missing = _missing()
    if not missing and not ctx.quick:
        from .torch_common import adapter_module, torch_module

        try:
            torch, adapter = torch_module(), adapter_module()
        except SystemUnavailable as exc:
            missing = str(exc)
    if ctx.quick or missing:
        for _, per_token, tokens in rows:
            for row in (per_token, tokens):
                row.unavailable_all(missing or "skipped in --quick (run --only decode_until_eos)")
                ctx.emit(row.build())
        return
    for (layers, hidden), per_token, tokens in rows:
        ctx.step(f"model {decode_label(layers, hidden)}")
        with torch.no_grad():
            _decode_model(ctx, torch, adapter, _Decoder(torch, layers, hidden), per_token,
                          tokens)
        ctx.emit(per_token.build())
        ctx.emit(tokens.build())


def _decode_model(ctx: Context, torch, adapter, decoder: _Decoder, per_token: RowBuilder,
                  tokens: RowBuilder) -> None:
    decoder.choose_eos()
    decoder.prefill()
    expected_steps = decoder.run_eager(decoder.step)
    expected = decoder.tokens.clone()
    tokens.set("eager", single(expected_steps))
    batches: dict[str, Callable[[], float] | None] = {
        "eager": keep(_decode_batch, decoder, lambda: decoder.run_eager(decoder.step))}
    # Both graphs hold the compiled step (compiled on its first call, in the warm-up).
    step = torch.compile(decoder.step, options=DECODE_COMPILE_OPTIONS)
    ctx.step("capture")
    for system, body in (("torch_graph_replays", step), ("per_token_replays", step),
                         ("one_launch", lambda: adapter.while_loop(
                             decoder.going, step, max_iters=MAX_NEW))):
        run = per_token.setup(system, lambda system=system, body=body: _decode_graph(
            decoder, system, step, body, adapter, torch))
        if run is None:
            continue
        decoder.prefill()
        steps = run()
        tokens.set(system, single(steps))
        if steps != expected_steps or not torch.equal(decoder.tokens, expected):
            per_token.fail(system, RuntimeError(
                f"{steps} tokens differing from eager's {expected_steps}"))
            continue
        batches[system] = keep(_decode_batch, decoder, run)
    ctx.step("measure")
    per_token.measure(batches, ctx.repeats(full=5, quick=2), scale=US, warmup=1)


def _decode_graph(decoder: _Decoder, system: str, step, body, adapter, torch):
    """Capture after a prefill; returns a callable that generates and returns the steps.

    ``torch_graph_replays`` is torch's own: a warm-up on a side stream, then
    ``torch.cuda.graph`` (the PyTorch docs' recipe), replayed on the current stream."""
    decoder.prefill()
    if system == "torch_graph_replays":
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            step()  # warm up on the side stream, as torch requires
        torch.cuda.current_stream().wait_stream(side)
        decoder.prefill()
        hand = torch.cuda.CUDAGraph()
        with torch.cuda.graph(hand):
            body()
        return lambda: decoder.run_eager(hand.replay)
    step()  # warm up: compilation, kernels, cuBLAS workspaces of this stream
    decoder.prefill()
    graph = cugraphrt.Graph()
    with adapter.graph(graph):
        body()
    if system == "per_token_replays":
        return lambda: decoder.run_eager(graph.replay)

    def one_launch() -> int:
        graph.replay()
        return int(decoder.count)

    return one_launch


def _decode_batch(decoder: _Decoder, run, *kept) -> float:
    decoder.prefill()
    device_sync()
    start = perf_counter()
    steps = run()
    device_sync()
    return (perf_counter() - start) / steps


def _missing() -> str | None:
    import importlib.util

    for name in ("torch", "transformers"):
        if importlib.util.find_spec(name) is None:
            return f"{name} not installed"
    return None


DECODE_UNTIL_EOS = Workload(
    "decode_until_eos", "LlamaForCausalLM from a config (bf16, random weights, StaticCache): "
    f"greedy decode of {DECODE_BATCH} sequences until every one emitted EOS (at most "
    f"{MAX_NEW} tokens): eager, a host loop of per-token replays of torch's graph and of "
    "cugraphrt's, one launch with cugraphrt_torch.while_loop; every graph holds the "
    "torch.compile'd step; tokens checked against eager", DECODE_SYSTEMS,
    "torch_graph_replays", (Target("one_launch", "torch_graph_replays", 1 / 1.2,
                                   metric=f"per token ({decode_label(*DECODE_MODELS[0])})"),),
    run_decode_until_eos, own=("per_token_replays", "one_launch"))
