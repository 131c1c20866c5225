"""The real models the bench times: torchvision ResNets and a Hugging Face Llama decode step.

Shared by the torch.compile workloads (:mod:`~cugraphrt.bench.workloads_compile`, one process
per system) and the real-model workloads (:mod:`~cugraphrt.bench.workloads_real`, every
system in one process), so that both time the same models. torch, torchvision and
transformers are imported inside the functions: without them the bench imports and their
cells read ``n/a (... not installed)``.
"""

from __future__ import annotations

import importlib.util
import time

__all__ = ["missing_package", "resnet", "llama", "LlamaDecoder", "equal_steps", "LLAMA_LAYERS"]

LLAMA_LAYERS = 12


def missing_package(*packages: str) -> str | None:
    """``"<name> not installed"`` for the first of ``packages`` that is missing, else None."""
    for name in packages:
        if importlib.util.find_spec(name) is None:
            return f"{name} not installed"
    return None


def resnet(torch, name: str):
    """torchvision's ``name`` (``resnet18``, ``resnet50``) with random weights from seed 0,
    on the GPU, in training mode (call ``.eval()`` for inference)."""
    import torchvision

    torch.manual_seed(0)
    return getattr(torchvision.models, name)(weights=None).cuda()


def llama(torch, batch: int, prompt_len: int, max_cache_len: int, *,
          layers: int = LLAMA_LAYERS, hidden: int = 1024, device: str = "cuda"):
    """A LlamaForCausalLM from a config (bf16, random weights from seed 0, 64-wide heads),
    random prompts of shape ``(batch, prompt_len)`` and a StaticCache of ``max_cache_len``
    positions. Returns ``(config, model, prompt, cache)``."""
    from transformers import LlamaConfig, LlamaForCausalLM, StaticCache

    torch.manual_seed(0)
    heads = hidden // 64
    config = LlamaConfig(vocab_size=32000, hidden_size=hidden,
                         intermediate_size=hidden * 11 // 4, num_hidden_layers=layers,
                         num_attention_heads=heads, num_key_value_heads=heads,
                         max_position_embeddings=512)
    model = LlamaForCausalLM(config).to(device, torch.bfloat16).eval()
    prompt = torch.randint(0, config.vocab_size, (batch, prompt_len), device=device)
    cache = StaticCache(config=config, max_cache_len=max_cache_len)
    return config, model, prompt, cache


class LlamaDecoder:
    """A ``LlamaForCausalLM`` from a config (random weights, bf16) with a ``StaticCache``,
    a 16-token prompt and a greedy decode step.

    The step takes the last token ``(1, 1)`` and its position ``(1,)`` and returns the next
    token ``(1, 1)``; with the StaticCache every tensor it touches keeps its address, so it
    can be captured and replayed. :meth:`generate` prefills eagerly, then runs the step.

    Parameters
    ----------
    torch : module
    decode_steps : int
        Steps :meth:`generate` runs; the cache holds the prompt, these steps and 8 more.
    layers : int
        Decoder layers.
    device : str
        Where the model runs (the bench: ``cuda``).
    """

    def __init__(self, torch, decode_steps: int, *, layers: int = LLAMA_LAYERS,
                 device: str = "cuda") -> None:
        self.torch = torch
        self.decode_steps = decode_steps
        length = 16 + decode_steps + 8
        self.config, self.model, self.prompt, self.cache = llama(
            torch, 1, 16, length, layers=layers, device=device)
        self.positions = torch.arange(length, device=device)

    def synchronize(self) -> None:
        """Wait for the model's device."""
        if self.positions.is_cuda:
            self.torch.cuda.synchronize()

    def step(self, token, position):
        """One greedy decode step: the next token after ``token`` at ``position``."""
        logits = self.model(input_ids=token, past_key_values=self.cache,
                            cache_position=position, use_cache=True).logits
        return logits[:, -1].argmax(-1, keepdim=True)

    def step_args(self, offset: int = 0) -> tuple:
        """Arguments of a step ``offset`` tokens past the prompt: (token, position)."""
        start = self.prompt.shape[1] + offset
        token = self.prompt[:, -1:].clone()
        return token, self.positions[start:start + 1].clone()

    def generate(self, run) -> tuple[list[int], float]:
        """Greedy decoding with ``run`` as the step, from a reset cache.

        Returns
        -------
        tokens : list of int
            The prefill's token, then one per step.
        seconds : float
            Wall seconds per step from step 8 on (the first ones warm clocks up).
        """
        torch = self.torch
        self.cache.reset()
        start = self.prompt.shape[1]
        token = self.model(input_ids=self.prompt, past_key_values=self.cache,
                           cache_position=self.positions[:start],
                           use_cache=True).logits[:, -1].argmax(-1, keepdim=True)
        tokens = [token]
        warm = min(8, self.decode_steps - 1)
        begin = 0.0
        for i in range(self.decode_steps):
            if i == warm:
                self.synchronize()
                begin = time.perf_counter()
            # A copy: graph outputs are overwritten by the next step, which reads this token.
            token = run(token, self.positions[start + i:start + i + 1]).clone()
            tokens.append(token)
        self.synchronize()
        seconds = (time.perf_counter() - begin) / (self.decode_steps - warm)
        return torch.cat(tokens, 1)[0].tolist(), seconds


def equal_steps(tokens: list[int], reference: list[int]) -> int:
    """Decode steps whose token equals ``reference``'s, up to the first difference (the
    first token of both comes from the eager prefill and is not counted)."""
    same = 0
    for a, b in zip(tokens, reference, strict=True):
        if a != b:
            break
        same += 1
    return max(same - 1, 0)
