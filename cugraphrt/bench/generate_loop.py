"""The generate workload's reference for host cost: a Generator's own step in torch's graphs,
replayed by a host loop written by hand.

What the Generator saves is host work: one launch and one host check per chunk of up to 32
decode steps. :class:`TorchLoop` does what a user would write instead with torch alone: the
same program (the same prefill, the same decode step, compiled or not: its kernels and its
tokens are the Generator's), each captured with ``torch.cuda.graph`` after a warm-up on a
side stream (the PyTorch docs' recipe), then a host loop that replays the one-step graph of
the current cache bucket as many times as the host can tell are needed and reads the state
once per chunk, as the Generator does. Without EOS ids (the workload's case) the host knows
every step is needed; with them it would run steps past a finished batch, which the
Generator's device loop does not.
"""

from __future__ import annotations

from typing import Any

__all__ = ["TorchLoop"]


class TorchLoop:
    """Generation of ``rows`` sequences with torch graphs of ``generator``'s program.

    Parameters
    ----------
    torch : module
    generator : cugraphrt_torch.Generator
        Whose program (prefill and decode step), state and buckets are used; its own graphs
        are not.
    rows : int
        The batch bucket.
    prompt : int
        The prompt length served.
    new : int
        New tokens per generation.
    """

    def __init__(self, torch, generator: Any, rows: int, prompt: int, new: int) -> None:
        self.torch, self.generator, self.rows = torch, generator, rows
        program = generator._program
        prompt_bucket = next(b for b in generator.prompt_buckets if b >= prompt)
        first = generator._cache_bucket(prompt_bucket)
        self.prefill = self._capture(lambda: program.prefill(rows, prompt_bucket, first),
                                     prompt_bucket)
        self.steps = {length: self._capture(lambda length=length: program.decode(rows, length),
                                            1)
                      for length in generator._cache_lengths(prompt, new)}

    def _capture(self, body, prompt: int):
        """``body`` in a ``torch.cuda.graph`` of its own, after a warm-up on a side stream
        from a staged dummy prompt (as the Generator warms up its own)."""
        torch, generator = self.torch, self.generator
        dummy = torch.zeros(self.rows, min(prompt, generator.max_length - 1), dtype=torch.int64,
                            device=generator.device)
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            generator.state.stage(dummy, torch.ones_like(dummy), self.rows, 1, 0, [])
            torch._foreach_zero_(generator._program.counters)
            body()
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            body()
        return graph

    def generate(self, prompt_ids, new: int) -> Any:
        """The tokens of one greedy generation of ``new`` tokens after ``prompt_ids`` (at most
        the ``new`` the loop was built for)."""
        generator, state = self.generator, self.generator.state
        batch, prompt = prompt_ids.shape
        state.stage(prompt_ids, prompt_ids.new_ones(prompt_ids.shape), self.rows, new, 0, [])
        self.prefill.replay()
        length, running = state.read()
        limit, chunk = prompt + new, generator.chunk
        while running:
            bucket = generator._cache_bucket(length)
            replay = self.steps[bucket].replay
            for _ in range(min(chunk, bucket - length + 1, limit - length)):
                replay()
            length, running = state.read()
        return state.ids[:batch, :length].clone()

    def release(self) -> None:
        """Reset every graph now. A graph that holds NCCL collectives (a tensor-parallel
        program's) must go before its process group: NCCL waits for it otherwise."""
        for graph in (self.prefill, *self.steps.values()):
            graph.reset()
        self.steps = {}
