"""cugraphrt_torch.Generator on the GPU: tokens equal to Hugging Face's eager greedy generate.

Architectures from configs with random weights (Llama; Qwen2 with grouped KV heads; the
sliding-window ones of :mod:`cugraphrt.bench.generate_models`),
prompts of mixed lengths left-padded as ``generate`` expects, batch sizes 1 to 8 (3 runs in
bucket 4), EOS in the middle of a batch, the per-chunk callback, the graphed program against
the same program run eagerly, and the step compiled with eager's numerics.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from cugraphrt_torch import Generator  # noqa: E402

from ._generation_prompts import prompts  # noqa: E402

pytestmark = pytest.mark.gpu

NEW = 96


def _model(arch: str):
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    common = dict(vocab_size=32000, hidden_size=512, intermediate_size=1408,
                  num_hidden_layers=6, num_attention_heads=8, max_position_embeddings=512)
    if arch == "llama":
        model = LlamaForCausalLM(LlamaConfig(num_key_value_heads=8, **common))
    else:
        model = Qwen2ForCausalLM(Qwen2Config(num_key_value_heads=2, **common))
    return model.to("cuda", torch.bfloat16).eval()


def _prompts(lengths: list[int], seed: int = 1):
    return prompts(torch, lengths, 32000, seed, device="cuda")


@pytest.fixture(scope="module", params=["llama", "qwen2"])
def setup(request):
    model = _model(request.param)
    return model, Generator(model, max_length=256)


def _reference(model, ids, mask, **kwargs):
    with torch.no_grad():
        return model.generate(ids, attention_mask=mask, do_sample=False, pad_token_id=0,
                              **kwargs)


@pytest.mark.parametrize("lengths", [[17], [5, 9, 17, 3, 12, 17, 8, 1], [30, 2, 11]],
                         ids=["b1", "b8-mixed", "b3-in-bucket-4"])
def test_tokens_equal_hf_eager_generate(setup, lengths):
    model, generator = setup
    ids, mask = _prompts(lengths)
    expected = _reference(model, ids, mask, max_new_tokens=NEW)
    got = generator.generate(ids, mask, max_new_tokens=NEW, pad_token_id=0)
    assert got.shape == expected.shape == (len(lengths), max(lengths) + NEW)
    assert torch.equal(got, expected), [
        int((got[r] != expected[r]).nonzero()[0]) for r in range(len(lengths))
        if not torch.equal(got[r], expected[r])]


def test_compiled_step_keeps_eager_tokens(setup):
    # compile_step=True: Inductor under eager_numerics="exact" (Qwen2's q/k/v biases too).
    # One cache bucket (prompts + 40 tokens <= 64 positions): one compilation per model.
    model, _ = setup
    generator = Generator(model, max_length=128, batch_buckets=(8,), compile_step=True)
    ids, mask = _prompts([5, 9, 17, 3, 12, 17, 8, 1], seed=3)
    expected = _reference(model, ids, mask, max_new_tokens=40)
    got = generator.generate(ids, mask, max_new_tokens=40, pad_token_id=0)
    assert torch.equal(got, expected)
    assert generator.stats().decode_graphs == ((8, 64),)


def test_eos_in_the_middle_of_a_batch(setup):
    model, generator = setup
    lengths = [5, 9, 17, 3]
    ids, mask = _prompts(lengths, seed=2)
    free = _reference(model, ids, mask, max_new_tokens=NEW)
    width = max(lengths)
    # An EOS that row 0 emits early: the others run on (or stop at it later), padded after.
    eos = int(free[0, width + 6])
    expected = _reference(model, ids, mask, max_new_tokens=NEW, eos_token_id=eos)
    got = generator.generate(ids, mask, max_new_tokens=NEW, eos_token_id=eos, pad_token_id=0)
    assert torch.equal(got, expected)
    new = got[:, width:]
    stops = [int((row == eos).nonzero()[0]) if bool((row == eos).any()) else None
             for row in new]
    assert stops[0] is not None and stops[0] <= 6
    assert stops[0] < new.shape[1] - 1  # row 0 stopped while another still ran
    assert bool((new[0, stops[0] + 1:] == 0).all())  # padded after its EOS


def test_callback_sees_every_token_once_and_can_stop(setup):
    model, _ = setup
    generator = Generator(model, max_length=256, chunk=16)
    ids, mask = _prompts([7, 12])
    seen: list = []
    got = generator.generate(ids, mask, max_new_tokens=50, eos_token_id=[],
                             callback=lambda tokens: seen.append(tokens))
    assert [t.shape[1] for t in seen][0] == 1  # the prefill's token first
    assert all(t.shape[1] <= 16 for t in seen)
    assert torch.equal(torch.cat(seen, 1), got[:, 12:]) and got.shape[1] == 12 + 50
    stopped: list = []
    cut = generator.generate(ids, mask, max_new_tokens=50, eos_token_id=[],
                             callback=lambda tokens: stopped.append(tokens) or len(stopped) == 2)
    assert cut.shape[1] == 12 + sum(t.shape[1] for t in stopped) < got.shape[1]
    assert torch.equal(cut, got[:, :cut.shape[1]])


def test_graphed_equals_the_same_program_run_eagerly(setup):
    model, generator = setup
    eager = Generator(model, max_length=256, graphed=False)
    ids, mask = _prompts([4, 21, 9])
    assert torch.equal(generator.generate(ids, mask, max_new_tokens=40, pad_token_id=0),
                       eager.generate(ids, mask, max_new_tokens=40, pad_token_id=0))


def test_graphs_share_one_pool_and_report_it(setup):
    model, _ = setup
    generator = Generator(model, max_length=256, batch_buckets=(1, 4))
    for lengths in ([9], [3, 20, 6]):
        ids, mask = _prompts(lengths)
        generator.generate(ids, mask, max_new_tokens=70)
    stats = generator.stats()
    assert stats.prefill_graphs == ((1, 16), (4, 32))
    # 9 + 70 and 20 + 70 tokens: decode steps over cache buckets 64 and 128.
    assert stats.decode_graphs == ((1, 64), (1, 128), (4, 64), (4, 128))
    assert stats.pool_reserved_bytes > 0
    assert stats.pool_reserved_bytes == generator.pool.stats().reserved_bytes
    assert stats.state_bytes > 0 and stats.capture_s > 0


def test_a_generators_graphs_share_one_cublas_workspace():
    """Its graphs never run at once: the first capture's workspace serves them all (each
    decode graph's loop body held one of its own before, 32 MiB or more on an H200)."""
    model = _model("llama")
    generator = Generator(model, max_length=256, batch_buckets=(8,))
    generator.capture(8, 200)  # one prefill graph and one decode graph (cache bucket 256)
    first = generator.stats()
    generator.capture(8, 16)  # one more prefill graph, three more decode graphs
    second = generator.stats()
    added = len(second.prefill_graphs + second.decode_graphs) \
        - len(first.prefill_graphs + first.decode_graphs)
    assert added == 4, (first, second)
    growth = second.pool_reserved_bytes - first.pool_reserved_bytes
    assert growth < added * (16 << 20), (growth >> 20, added)
    ids, mask = _prompts([5, 9, 17, 3, 12, 17, 8, 1], seed=9)
    expected = _reference(model, ids, mask, max_new_tokens=NEW)
    assert torch.equal(generator.generate(ids, mask, max_new_tokens=NEW, pad_token_id=0),
                       expected)


# -- sampling (sampling=True) -------------------------------------------------------------

SAMPLED = dict(do_sample=True, temperature=0.9, top_k=40, top_p=0.95, repetition_penalty=1.1)


@pytest.mark.parametrize("compile_step", [False, True], ids=["eager-step", "compiled-step"])
def test_sampled_tokens_equal_the_same_program_run_eagerly(setup, compile_step):
    """Graphed (device loop, noise drawn on the device) against graphed=False (one launch
    per operation) with the same seeds: the same tokens; and the draws are fresh at every
    step and every call."""
    model, _ = setup
    # One batch bucket: a row's logits are the same whatever other rows share its bucket,
    # while another bucket's matmuls may round them otherwise (as for greedy tokens).
    options = dict(max_length=128, batch_buckets=(4,), sampling=True)
    graphed = Generator(model, compile_step=compile_step, **options)
    eager = Generator(model, graphed=False, **options)
    ids, mask = _prompts([5, 9, 17], seed=6)
    seeds = [101, 202, 303]
    got = graphed.generate(ids, mask, max_new_tokens=40, pad_token_id=0, seed=seeds,
                           **SAMPLED)
    want = eager.generate(ids, mask, max_new_tokens=40, pad_token_id=0, seed=seeds,
                          **SAMPLED)
    assert torch.equal(got, want)
    greedy = _reference(model, ids, mask, max_new_tokens=40, repetition_penalty=1.1)
    assert not torch.equal(got, greedy)  # it sampled
    again = graphed.generate(ids, mask, max_new_tokens=40, pad_token_id=0, seed=seeds,
                             **SAMPLED)
    assert torch.equal(again, got)  # the same seeds, the same tokens
    other = graphed.generate(ids, mask, max_new_tokens=40, pad_token_id=0,
                             seed=[1, 2, 3], **SAMPLED)
    assert all(not torch.equal(other[r], got[r]) for r in range(3))
    # A row alone (the longest prompt: no padding either way) draws what it drew beside
    # the others.
    alone = graphed.generate(ids[2:], mask[2:], max_new_tokens=40, pad_token_id=0,
                             seed=[303], **SAMPLED)
    assert torch.equal(alone[0], got[2])


def test_sampling_generator_keeps_greedy_tokens_and_the_penalty(setup):
    model, _ = setup
    generator = Generator(model, max_length=128, batch_buckets=(4,), sampling=True)
    ids, mask = _prompts([5, 9, 17], seed=7)
    for kwargs in ({}, {"repetition_penalty": 1.3}):
        expected = _reference(model, ids, mask, max_new_tokens=40, **kwargs)
        got = generator.generate(ids, mask, max_new_tokens=40, pad_token_id=0, **kwargs)
        assert torch.equal(got, expected), kwargs


@pytest.mark.parametrize("arch", ["mixtral", "qwen3_moe"])
def test_mixture_of_experts_models_keep_generates_tokens(arch):
    """Decode graphs capture the experts in transformers' batched_mm, which generate's own
    decoding uses on a GPU; the prefill keeps the model's implementation, as generate's."""
    from transformers import MixtralConfig, MixtralForCausalLM, Qwen3MoeConfig, Qwen3MoeForCausalLM

    torch.manual_seed(0)
    common = dict(vocab_size=32000, hidden_size=256, intermediate_size=512,
                  num_hidden_layers=2, num_attention_heads=8, num_key_value_heads=4,
                  max_position_embeddings=512)
    if arch == "mixtral":
        model = MixtralForCausalLM(MixtralConfig(num_local_experts=4, num_experts_per_tok=2,
                                                 **common))
    else:
        model = Qwen3MoeForCausalLM(Qwen3MoeConfig(num_experts=4, num_experts_per_tok=2,
                                                   moe_intermediate_size=256, head_dim=32,
                                                   **common))
    model = model.to("cuda", torch.bfloat16).eval()
    own = model.get_experts_implementation()
    generator = Generator(model, max_length=128, batch_buckets=(4,))
    ids, mask = _prompts([5, 9, 17], seed=8)
    expected = _reference(model, ids, mask, max_new_tokens=40)
    got = generator.generate(ids, mask, max_new_tokens=40, pad_token_id=0)
    assert torch.equal(got, expected)
    assert model.get_experts_implementation() == own
    # The decode warm-ups (outside the captures) checked the projections' shapes at batch
    # bucket 4 (8 token-expert pairs), whichever way each then computes (expert_matmul).
    from cugraphrt_torch.inference import expert_matmul

    (experts,) = {type(m): m for m in model.modules()
                  if type(m).__name__.endswith("Experts")}.values()
    checked = {key[1:] for key in expert_matmul.checked_shapes()}
    for weights in (experts.gate_up_proj, experts.down_proj):
        assert (torch.bfloat16, *weights.shape, 8, False) in checked


@pytest.mark.parametrize("arch", ["mistral", "gemma2", "gemma3", "gpt_oss"])
@pytest.mark.parametrize("compile_step", [False, True], ids=["eager-step", "compiled-step"])
def test_sliding_window_models_keep_generates_tokens(arch, compile_step):
    """Sliding-window layers (every layer, alternating, five of six) with a window of 16:
    prompts of up to 17 tokens and 40 new ones cross its edge inside the prefill and inside
    decode chunks of 32 steps, one launch each, against generate's evicting window cache."""
    from cugraphrt.bench.generate_models import causal_lm

    model = causal_lm(arch, layers=6 if arch == "gemma3" else 2, hidden=256, vocab=32000,
                      window=16).to("cuda", torch.bfloat16)
    generator = Generator(model, max_length=128, batch_buckets=(4,),
                          compile_step=compile_step)
    ids, mask = _prompts([5, 9, 17], seed=8)
    expected = _reference(model, ids, mask, max_new_tokens=40)
    got = generator.generate(ids, mask, max_new_tokens=40, pad_token_id=0)
    assert torch.equal(got, expected)
    assert generator.stats().decode_graphs  # graphed, not run eagerly


@pytest.mark.parametrize("model_kind", ["cycling", "random"])
def test_speculative_decoding_keeps_greedys_tokens_in_few_launches(model_kind):
    """Issue 55: prompt lookup, verification and acceptance inside the decode loop (graphed),
    in float32 (a verify forward of 5 positions rounds as one of 1 there), against eager
    generate. The cycling model keeps most drafts: far fewer verify steps than tokens."""
    from cugraphrt_torch import PromptLookup

    from cugraphrt.bench.generate_models import causal_lm

    from ._generation_models import VOCAB, cycling_model

    old = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    try:
        if model_kind == "cycling":
            model, _ = cycling_model(torch, "cuda")
            vocab = VOCAB
        else:
            model, vocab = causal_lm("llama", hidden=256, vocab=32000).to("cuda"), 32000
            model.generation_config.eos_token_id = None
        generator = Generator(model, max_length=128, batch_buckets=(4,),
                              speculative=PromptLookup(tokens=4))
        ids, mask = prompts(torch, [5, 9, 17], vocab, 8, device="cuda")
        expected = _reference(model, ids, mask, max_new_tokens=60)
        got = generator.generate(ids, mask, max_new_tokens=60, pad_token_id=0)
        assert torch.equal(got, expected)
        stats = generator.stats()
        assert stats.decode_graphs and stats.speculative_tokens == 3 * 59  # 3 rows
        if model_kind == "cycling":
            assert stats.speculative_steps <= 3 * 25, stats
    finally:
        torch.backends.cuda.matmul.allow_tf32 = old


def test_a_draft_model_keeps_greedys_tokens():
    """Issue 55: a draft model (the target's first layer and head) drafting inside the same
    graphs, float32, against eager generate."""
    import copy

    from cugraphrt_torch import DraftModel

    from cugraphrt.bench.generate_models import causal_lm

    old = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    try:
        model = causal_lm("llama", layers=3, hidden=256, vocab=32000).to("cuda")
        model.generation_config.eos_token_id = None
        draft = copy.deepcopy(model)
        draft.model.layers = draft.model.layers[:1]
        draft.config.num_hidden_layers = 1
        generator = Generator(model, max_length=128, batch_buckets=(4,),
                              speculative=DraftModel(draft, tokens=3))
        ids, mask = prompts(torch, [5, 9, 17], 32000, 8, device="cuda")
        expected = _reference(model, ids, mask, max_new_tokens=60)
        assert torch.equal(generator.generate(ids, mask, max_new_tokens=60, pad_token_id=0),
                           expected)
        assert generator.stats().speculative_tokens == 3 * 59  # 3 rows
    finally:
        torch.backends.cuda.matmul.allow_tf32 = old


def test_each_speculative_row_keeps_its_own_count_graphed():
    """Issue 55: rows of a batch keep different numbers of drafts in one verify forward (a
    cache write position per row, masks offset per row), graphed: each row's tokens, steps
    and kept tokens are those of its own run alone, and every run's are eager generate's."""
    from cugraphrt_torch import PromptLookup

    from ._generation_models import one_row_ahead

    old = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    try:
        model, ids, mask = one_row_ahead(torch, "cuda")

        def generator():
            return Generator(model, max_length=128, batch_buckets=(1, 4),
                             speculative=PromptLookup(tokens=4))

        batch = generator()
        together = batch.generate(ids, mask, max_new_tokens=60, pad_token_id=0)
        assert torch.equal(together, _reference(model, ids, mask, max_new_tokens=60))
        steps = tokens = 0
        counts = set()
        for row in range(3):
            real = ids[row][mask[row].bool()][None]
            alone = generator()
            got = alone.generate(real, None, max_new_tokens=60, pad_token_id=0)
            assert torch.equal(got[0, real.shape[1]:], together[row, ids.shape[1]:]), row
            stats = alone.stats()
            steps, tokens = steps + stats.speculative_steps, tokens + stats.speculative_tokens
            counts.add(stats.speculative_steps)
        assert len(counts) > 1, counts  # the rows differ, so moving together would not add up
        stats = batch.stats()
        assert (stats.speculative_steps, stats.speculative_tokens) == (steps, tokens)
        assert tokens == 3 * 59 and stats.decode_graphs
    finally:
        torch.backends.cuda.matmul.allow_tf32 = old
