"""The ``generate_tp`` rows of ``cugraphrt bench --distributed``: greedy generation by a
tensor-parallel transformers Llama, one rank per GPU (run by :mod:`.distributed_child`).

The model: :func:`.generate_models.causal_lm` Llama with 12 layers of width 1024 (16 heads,
8 key-value heads: they split over 2, 4 or 8 ranks), bf16, random weights, split over the
ranks by its own plan (:func:`.generate_models.tensor_parallel`: an all-reduce after
attention and one after the MLP of each layer); prompts of 16 tokens, 128 new, no EOS;
batch 1 and 8; and the same at batch 1 with a short step (1 layer of :func:`short_hidden`:
256 on 2 ranks), where the host's read per token is a visible share of the step. Systems,
every rank running each in the same shuffled order:

* ``hf_eager``: the TP model's ``generate(do_sample=False)``: one host round trip and the
  collectives' launches per token, as transformers' TP generation runs;
* ``torch_per_token`` and ``torch_loop``: the Generator's own program (prefill and one decode
  step, the all-reduces in it) in ``torch.cuda.graph`` s, replayed by a host loop written by
  hand (:class:`.generate_loop.TorchLoop`): reading the state after every token, and after
  every 32 back-to-back steps (new tokens x the graphed TP step);
* ``per_token``: :class:`cugraphrt_torch.Generator` with ``chunk=1`` (information: a graphed
  step per launch, the host reading the state after each);
* ``cugraphrt``: the Generator's defaults, chunks of 32 decode steps per launch, the
  all-reduces inside the device loop;
* ``cugraphrt_watched``: the same with the hang watchdog on (information: what it costs).

``hf_static`` (``cache_implementation="static"``, compiled) is not run: a compilation that
fails on one rank and not on another would leave the other rank's collectives unpaired, and
the whole distributed run would hang to its deadline. A round times, per system, a
one-token generation and a whole one (time per token after the first, as ``generate``).
Tokens: each generator's must equal ``hf_eager``'s (the leading equal tokens, the fewest of
the batch's rows, are reported).
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from typing import Any

from .generate_loop import TorchLoop

__all__ = ["GENERATE_TP_SYSTEMS", "OWN", "BATCHES", "NEW", "LAYERS", "SHORT_LAYERS",
           "SHORT_LABEL", "short_hidden", "generate_tp", "per_token_metric", "same_metric"]

GENERATE_TP_SYSTEMS = ("hf_eager", "torch_per_token", "torch_loop", "per_token", "cugraphrt",
                       "cugraphrt_watched")
#: The systems cugraphrt builds (their rows carry no verdict against each other).
OWN = ("per_token", "cugraphrt", "cugraphrt_watched")
BATCHES, PROMPT, NEW, LAYERS, HIDDEN = (1, 8), 16, 128, 12, 1024
#: The short-step model's layers (batch 1 only; its width: :func:`short_hidden`). Its step
#: (171 us on two H200s) is about the shortest a TP model with two all-reduces a layer
#: gives, so the 17-28 us the host loses per token reading the state shows; in the 12x1024
#: step (1.7 ms, bound by the count of an eager-numerics Llama's kernels) they are under 2%.
SHORT_LAYERS = 1
SHORT_LABEL = "short step"


def short_hidden(world: int) -> int:
    """The short-step model's width on ``world`` ranks: 256, or 128 a rank beyond 2, so
    that its key-value heads (one per 128: heads of 64, half as many for keys and values)
    split over the ranks."""
    return max(256, 128 * world)

_GENERATORS = ("per_token", "cugraphrt", "cugraphrt_watched")
_WATCHDOG_S = 120.0


def per_token_metric(batch: int, label: str = "") -> str:
    return f"per token, batch {batch}" + (f", {label}" if label else "")


def same_metric(batch: int, label: str = "") -> str:
    return f"same as eager, batch {batch}" + (f", {label}" if label else "")


def generate_tp(torch: Any, world: int, device: Any, rounds: int, new: int = NEW,
                layers: int = LAYERS, hidden: int = HIDDEN,
                batches: tuple[int, ...] = BATCHES,
                label: str = "") -> dict[str, dict[str, list[float]]]:
    """Samples per metric and system: seconds per token (``per token, batch b``) and the
    leading new tokens equal to ``hf_eager``'s (``same as eager, batch b``, one value);
    ``label`` ends the metrics' names (the short-step model's)."""
    from cugraphrt_torch import Generator
    from torch.distributed.device_mesh import init_device_mesh

    from .generate_models import causal_lm, tensor_parallel

    model = causal_lm("llama", layers=layers, hidden=hidden, vocab=32000,
                      positions=2 * (PROMPT + new)).to(device, torch.bfloat16)
    model.generation_config.eos_token_id = None  # every system generates all new tokens
    model = tensor_parallel(model, init_device_mesh("cuda", (world,)))
    length = PROMPT + new
    generators = {"per_token": Generator(model, max_length=length, chunk=1),
                  "cugraphrt": Generator(model, max_length=length),
                  "cugraphrt_watched": Generator(model, max_length=length)}
    results: dict[str, dict[str, list[float]]] = {}
    with torch.no_grad():
        for batch in batches:
            _batch(torch, model, generators, batch, rounds, new, results,
                   (per_token_metric(batch, label), same_metric(batch, label)))
    return results


def _batch(torch: Any, model: Any, generators: dict, batch: int, rounds: int, new: int,
           results: dict[str, dict[str, list[float]]], metrics: tuple[str, str]) -> None:
    from cugraphrt.distributed.watchdog import set_collective_timeout

    from .timing import MIN_WARMUP, round_order

    # The same prompt on every rank (a seeded device generator): the ranks split the model,
    # not the batch.
    prompt = torch.randint(1, 32000, (batch, PROMPT), device=model.device,
                           generator=torch.Generator(model.device).manual_seed(batch))

    def hf(count: int) -> Callable[[], Any]:
        return lambda: model.generate(prompt, attention_mask=torch.ones_like(prompt),
                                      max_new_tokens=count, do_sample=False, pad_token_id=0)

    def ours(name: str, count: int) -> Callable[[], Any]:
        generator = generators[name]
        return lambda: generator.generate(prompt, max_new_tokens=count, eos_token_id=[])

    calls = {"hf_eager": (hf(new), hf(1)),
             **{name: (ours(name, new), ours(name, 1)) for name in _GENERATORS}}
    for name, (whole, one) in calls.items():  # compilation, captures, NCCL's first calls
        set_collective_timeout(_WATCHDOG_S if name == "cugraphrt_watched" else None)
        whole(), one()
    set_collective_timeout(None)
    # torch's graphs of the generators' programs, after their captures: the Generator's
    # graphs and these never run at once, and read and write the same state.
    loops = {"torch_per_token": TorchLoop(torch, generators["per_token"], batch, PROMPT, new),
             "torch_loop": TorchLoop(torch, generators["cugraphrt"], batch, PROMPT, new)}
    for name, loop in loops.items():
        calls[name] = (functools.partial(loop.generate, prompt, new),
                       functools.partial(loop.generate, prompt, 1))
    per_token: dict[str, list[float]] = {name: [] for name in GENERATE_TP_SYSTEMS}
    tokens: dict[str, Any] = {}
    for index in range(MIN_WARMUP + rounds):
        for name in round_order(list(GENERATE_TP_SYSTEMS), index):
            whole, one = calls[name]
            set_collective_timeout(_WATCHDOG_S if name == "cugraphrt_watched" else None)
            first = _wall(torch, one)[0]
            total, tokens[name] = _wall(torch, whole)
            if index >= MIN_WARMUP:
                per_token[name].append((total - first) / (new - 1))
    set_collective_timeout(None)
    for loop in loops.values():  # torch's graphs hold NCCL: they go before the group does
        loop.release()
    results[metrics[0]] = per_token
    want = tokens["hf_eager"][:, PROMPT:]
    results[metrics[1]] = {
        name: [float((tokens[name][:, PROMPT:] == want).int().cumprod(1).sum(1).min())]
        for name in calls}


def _wall(torch: Any, call: Callable[[], Any]) -> tuple[float, Any]:
    torch.cuda.synchronize()
    begin = time.perf_counter()
    result = call()
    torch.cuda.synchronize()
    return time.perf_counter() - begin, result
