"""Per-request seeds in a device loop: sampling tokens from logits, one Philox stream per row.

A serving loop samples a token per request at every step. Each request has its own seed, and
what it draws must depend on that seed only: not on which other requests share the batch, and
not on whether the loop ran eagerly or as a replayed graph. `cugraphrt.random.RowGenerator`
keeps one seed and one counter position per row in device memory; each draw advances every
row's position on the device, so a `while_loop` captured once draws afresh at every iteration
and every replay. The token is the Gumbel-max draw `argmax(logits + noise)`.

Run: python examples/row_sampling.py
"""

from __future__ import annotations

import cupy
import numpy as np

import cugraphrt
import cugraphrt.random as crandom

VOCAB, STEPS = 16, 8


def sampler(seeds: list[int], logits: cupy.ndarray):
    """A graph that samples STEPS tokens per row into ``tokens``; returns (graph, tokens)."""
    rows = crandom.RowGenerator(len(seeds), seeds)
    noise = cupy.empty((len(seeds), VOCAB), dtype=cupy.float32)
    tokens = cupy.zeros((STEPS, len(seeds)), dtype=cupy.int64)
    step = cupy.zeros((), dtype=cupy.int64)

    def body():
        rows.gumbel(VOCAB, out=noise)
        tokens[step] = cupy.argmax(logits + noise, axis=1)
        step[...] = step + 1

    def run():
        step.fill(0)
        cugraphrt.while_loop(lambda: step < STEPS, body)

    g = cugraphrt.Graph()
    with cugraphrt.graph(g):
        run()
    return g, tokens, step


def main() -> None:
    rng = np.random.default_rng(0)
    logits = cupy.asarray(rng.standard_normal(VOCAB).astype(np.float32) * 2)
    # Four requests; the second and fourth share a seed.
    g, tokens, step = sampler([11, 22, 33, 22], cupy.broadcast_to(logits, (4, VOCAB)))
    step.fill(0)
    g.replay()
    first = cupy.asnumpy(tokens)
    step.fill(0)
    g.replay()
    second = cupy.asnumpy(tokens)
    assert np.array_equal(first[:, 1], first[:, 3]), "same seed, same tokens"
    assert not np.array_equal(first, second), "a replay drew afresh"
    # Request 22 alone, in a batch of its own, draws what it drew beside the others.
    alone, alone_tokens, alone_step = sampler([22], logits[None, :])
    alone_step.fill(0)
    alone.replay()
    assert np.array_equal(cupy.asnumpy(alone_tokens)[:, 0], first[:, 1])
    print(f"tokens per request (steps x requests), first replay:\n{first}")
    print("same seed gives the same tokens, whatever the batch; each replay draws afresh")

    # The draws follow softmax(logits): 4,000 rows drawing 8 tokens each.
    many, many_tokens, many_step = sampler(list(range(4000)),
                                           cupy.broadcast_to(logits, (4000, VOCAB)))
    many_step.fill(0)
    many.replay()
    counts = np.bincount(cupy.asnumpy(many_tokens).ravel(), minlength=VOCAB)
    probs = cupy.asnumpy(cupy.exp(logits) / cupy.exp(logits).sum())
    worst = float(np.abs(counts / counts.sum() - probs).max())
    assert worst < 0.015, worst
    print(f"32,000 draws: frequencies within {worst:.4f} of softmax(logits)")


if __name__ == "__main__":
    main()
