"""Greedy generation by a tensor-parallel transformers model, many tokens per launch on
every rank.

Run with one process per GPU:

    torchrun --standalone --nproc-per-node 2 examples/generate_tp.py

Every rank builds the same Llama (random weights from a config) and splits it by the model's
own tensor-parallel plan (column-parallel q/k/v/gate/up, row-parallel o/down, an all-reduce
after attention and after the MLP of each layer). The Generator captures the prefill and
the decode chunks on each rank, the all-reduces inside the decode loop: a chunk of 32
tokens is one launch per rank. The tokens are checked against the same TP model's eager
generate. See docs/distributed.md, "Generating with a tensor-parallel transformers model".
"""

from __future__ import annotations

import os

import torch
import torch.distributed as dist
from cugraphrt_torch import Generator
from cugraphrt_torch.distributed import check_capture
from torch.distributed.device_mesh import init_device_mesh

from cugraphrt.bench.generate_models import causal_lm, tensor_parallel


def main() -> None:
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    torch.cuda.set_device(local_rank)
    device = torch.device("cuda", local_rank)
    dist.init_process_group("nccl", device_id=device)
    check_capture()
    world = dist.get_world_size()
    model = causal_lm("llama", layers=4, hidden=512, vocab=32000).to(device, torch.bfloat16)
    model = tensor_parallel(model, init_device_mesh("cuda", (world,)))
    model.generation_config.eos_token_id = None  # random weights: generate every new token
    generator = Generator(model, max_length=128)
    # The same prompts on every rank: tensor parallelism splits the model, not the batch.
    prompt = torch.randint(1, 32000, (2, 12), device=device,
                           generator=torch.Generator(device).manual_seed(0))
    tokens = generator.generate(prompt, max_new_tokens=64, eos_token_id=[])
    with torch.no_grad():
        want = model.generate(prompt, attention_mask=torch.ones_like(prompt),
                              max_new_tokens=64, do_sample=False, pad_token_id=0)
    assert torch.equal(tokens, want), "tokens differ from eager TP generate"
    stats = generator.stats()
    if dist.get_rank() == 0:
        print(f"{world} ranks: 64 tokens for 2 prompts equal to eager tensor parallelism; "
              f"{len(stats.decode_graphs)} decode graphs, captured in {stats.capture_s:.1f} s")
    del generator  # its graphs hold NCCL: they go before the process group
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
