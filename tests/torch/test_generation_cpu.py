"""cugraphrt_torch.Generator without a GPU: its options and, where transformers is installed,
its program run eagerly on the CPU (``graphed=False``) against transformers' own greedy
``generate``: the same tokens for mixed prompt lengths, EOS in the middle of a batch, batch
buckets, prompt and cache buckets, and chunks that stop at cache-bucket boundaries."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from cugraphrt_torch import Generator  # noqa: E402

from cugraphrt.adapter import doubling, stepping  # noqa: E402
from cugraphrt.errors import OptionsError  # noqa: E402

from ._generation_prompts import prompts  # noqa: E402


class _Tiny(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.zeros(2))


@pytest.mark.parametrize("kwargs, field", [
    (dict(max_length=1), "max_length"),
    (dict(max_length=0), "max_length"),
    (dict(max_length=64, chunk=0), "chunk"),
    (dict(max_length=64, batch_buckets=()), "batch_buckets"),
    (dict(max_length=64, batch_buckets=(1, 0)), "batch_buckets"),
    # The one rule for bucket lists (cugraphrt.adapter.checked_sizes, as make_graphed's):
    # an unsorted or repeated list is refused, never sorted behind the caller's back.
    (dict(max_length=64, batch_buckets=(4, 2, 1)), "batch_buckets"),
    (dict(max_length=64, prompt_buckets=(16, 16)), "prompt_buckets"),
    (dict(max_length=64, cache_buckets=(64, 32)), "cache_buckets"),
    (dict(max_length=64, prompt_buckets=(16, 128)), "prompt_buckets"),
    (dict(max_length=64, cache_buckets=(8,), prompt_buckets=(16,)), "cache_buckets"),
    (dict(max_length=64, graphed="yes"), "graphed"),
    (dict(max_length=64, compile_step=1), "compile_step"),
    (dict(max_length=64, compile_step="fastest"), "compile_step"),
    (dict(max_length=64), "model"),  # graphed=True needs a model on a CUDA device
])
def test_bad_options_are_refused(kwargs, field):
    with pytest.raises(OptionsError) as info:
        Generator(_Tiny(), **kwargs)
    assert info.value.field == field


def test_default_buckets():
    assert doubling(16, 300) == (16, 32, 64, 128, 256, 300)
    assert doubling(16, 16) == (16,)
    assert stepping(64, 272) == (64, 128, 192, 256, 272)
    assert stepping(64, 64) == (64,)


# -- the program, eagerly, against transformers ------------------------------------------------

def _model(arch: str):
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    common = dict(vocab_size=512, hidden_size=64, intermediate_size=176, num_hidden_layers=2,
                  num_attention_heads=4, max_position_embeddings=256)
    if arch == "llama":
        model = transformers.LlamaForCausalLM(
            transformers.LlamaConfig(num_key_value_heads=4, **common))
    else:
        model = transformers.Qwen2ForCausalLM(
            transformers.Qwen2Config(num_key_value_heads=2, **common))
    return model.eval()


def _prompts(lengths: list[int], seed: int = 1):
    return prompts(torch, lengths, 512, seed)


def _reference(model, ids, mask, **kwargs):
    with torch.no_grad():
        return model.generate(ids, attention_mask=mask, do_sample=False, pad_token_id=0,
                              **kwargs)


@pytest.fixture(scope="module", params=["llama", "qwen2"])
def eager(request):
    model = _model(request.param)
    return model, Generator(model, max_length=64, graphed=False, chunk=5,
                            batch_buckets=(1, 2, 4), prompt_buckets=(8, 20),
                            cache_buckets=(16, 24, 40, 64))


@pytest.mark.parametrize("lengths", [[17], [5, 9, 17, 3], [12, 2, 7]])
def test_eager_program_equals_transformers_generate(eager, lengths):
    model, generator = eager
    ids, mask = _prompts(lengths)
    expected = _reference(model, ids, mask, max_new_tokens=30)
    got = generator.generate(ids, mask, max_new_tokens=30, pad_token_id=0)
    assert got.shape == expected.shape == (len(lengths), max(lengths) + 30)
    assert torch.equal(got, expected)


def test_eos_mid_batch_and_the_callback(eager):
    model, generator = eager
    ids, mask = _prompts([5, 9, 17, 3], seed=3)
    free = _reference(model, ids, mask, max_new_tokens=30)
    eos = int(free[1, 17 + 4])  # row 1 emits it 5 tokens in
    expected = _reference(model, ids, mask, max_new_tokens=30, eos_token_id=eos)
    pieces: list = []
    got = generator.generate(ids, mask, max_new_tokens=30, pad_token_id=0, eos_token_id=eos,
                             callback=pieces.append)
    assert torch.equal(got, expected)
    assert bool((got[1, 17 + 5:] == 0).all()) and int(got[1, 17 + 4]) == eos
    # The prefill's token, then chunks of at most 5 that also stop at the cache buckets.
    sizes = [p.shape[1] for p in pieces]
    assert sizes[0] == 1 and max(sizes) <= 5 and sum(sizes) == got.shape[1] - 17
    assert torch.equal(torch.cat(pieces, 1), got[:, 17:])


def test_no_prompt_mask_and_max_new_tokens_one(eager):
    model, generator = eager
    ids, _ = _prompts([6])
    assert torch.equal(generator.generate(ids, max_new_tokens=1),
                       _reference(model, ids, torch.ones_like(ids), max_new_tokens=1))


def test_bad_calls_are_refused(eager):
    _, generator = eager
    ids, mask = _prompts([5, 9])
    for kwargs, field in [(dict(max_new_tokens=0), "max_new_tokens"),
                          (dict(max_new_tokens=60), "max_new_tokens"),  # 9 + 60 > 64
                          (dict(max_new_tokens=4, eos_token_id=-3), "eos_token_id"),
                          (dict(max_new_tokens=4, pad_token_id=-1), "pad_token_id")]:
        with pytest.raises(OptionsError) as info:
            generator.generate(ids, mask, **kwargs)
        assert info.value.field == field
    with pytest.raises(OptionsError) as info:
        generator.generate(ids[0], max_new_tokens=4)
    assert info.value.field == "input_ids"
    with pytest.raises(OptionsError) as info:
        generator.generate(ids, mask[:, :3], max_new_tokens=4)
    assert info.value.field == "attention_mask"
    with pytest.raises(OptionsError) as info:
        generator.generate(torch.zeros(5, 3, dtype=torch.int64), max_new_tokens=4)
    assert info.value.field == "batch size"


@pytest.mark.parametrize("compile_step", [True, "fast"])
def test_a_compiled_step_may_compile_once_per_decode_graph(compile_step):
    # One compilation per (batch bucket, cache bucket): 3 x 4 = 12 here, past dynamo's
    # default limit of 8 recompilations of one function, which the program lifts around
    # its calls of the step (warm-ups and captures; replays do not run Python).
    from torch._dynamo import config as dynamo_config

    model = _model("llama")
    generator = Generator(model, max_length=64, graphed=False, compile_step=compile_step,
                          batch_buckets=(1, 2, 4), prompt_buckets=(8, 20),
                          cache_buckets=(16, 24, 40, 64))
    program, limits = generator._program, []
    name = "recompile_limit" if hasattr(dynamo_config, "recompile_limit") else \
        "cache_size_limit"
    before = getattr(dynamo_config, name)

    def step(view, rows):
        limits.append(getattr(dynamo_config, name))
        program._step(view, rows)  # the same program, uncompiled (no C++ build here)

    program.step = step
    ids, mask = _prompts([5, 9])
    expected = _reference(model, ids, mask, max_new_tokens=10)
    assert torch.equal(generator.generate(ids, mask, max_new_tokens=10, pad_token_id=0),
                       expected)
    assert limits and set(limits) == {max(before, 12)}
    assert getattr(dynamo_config, name) == before


def test_each_generator_compiles_its_own_step(monkeypatch):
    # Dynamo keeps compilations per code object and counts them against one recompile
    # limit: were the steps of two generators one function, the second generator's steps
    # past the limit would run uncompiled (no error, only slower). Each program's step has
    # code of its own. The backend here counts and runs the graph as traced (no C++ build).
    from cugraphrt_torch.generation import _generation_program

    compiled: list[int] = []

    def counting(numerics):
        def backend(gm, inputs):
            compiled.append(id(gm))
            return gm.forward
        return backend

    monkeypatch.setattr(_generation_program, "inductor_backend", counting)
    torch._dynamo.reset()
    model = _model("llama")
    ids, mask = _prompts([5, 3])
    expected = [_reference(model, ids[:1], mask[:1, :5], max_new_tokens=40),
                _reference(model, ids, mask, max_new_tokens=40)]
    generators = [Generator(model, max_length=64, graphed=False, compile_step=True,
                            batch_buckets=(1, 2), prompt_buckets=(8,),
                            cache_buckets=(16, 24, 40, 64)) for _ in range(2)]
    for generator in generators:  # 2 batch buckets x 4 cache buckets: 8 graphs each
        assert torch.equal(generator.generate(ids[:1], mask[:1, :5], max_new_tokens=40,
                                              pad_token_id=0), expected[0])
        assert torch.equal(generator.generate(ids, mask, max_new_tokens=40, pad_token_id=0),
                           expected[1])
    assert len(compiled) == 16
    steps = [generator._program.step for generator in generators]
    assert steps[0] is not steps[1]


@pytest.mark.parametrize("arch", ["mixtral", "qwen3_moe"])
def test_mixture_of_experts_models_equal_transformers_generate(arch):
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    common = dict(vocab_size=512, hidden_size=64, intermediate_size=64, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256)
    if arch == "mixtral":
        model = transformers.MixtralForCausalLM(transformers.MixtralConfig(
            num_local_experts=4, num_experts_per_tok=2, **common))
    else:
        model = transformers.Qwen3MoeForCausalLM(transformers.Qwen3MoeConfig(
            num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32, head_dim=16,
            **common))
    model.eval()
    generator = Generator(model, max_length=64, graphed=False, batch_buckets=(2, 4),
                          prompt_buckets=(8, 20), cache_buckets=(16, 24, 40, 64))
    ids, mask = _prompts([5, 12, 9])
    expected = _reference(model, ids, mask, max_new_tokens=24)
    assert torch.equal(generator.generate(ids, mask, max_new_tokens=24, pad_token_id=0),
                       expected)


# -- sliding-window layers -----------------------------------------------------------------------

@pytest.mark.parametrize("arch", ["llama", "qwen3", "gemma3", "mistral", "gemma2", "mixtral",
                                  "qwen3_moe", "gpt_oss"])
def test_bench_architectures_equal_transformers_generate(arch):
    """The architectures of the generate_architectures bench. For those with sliding windows,
    a window of 8 tokens, prompts of up to 19 and 30 new tokens: every sequence crosses the
    window's edge, in the prefill and in chunks of 5 decode steps, against generate with
    transformers' own (evicting) sliding-window cache."""
    pytest.importorskip("transformers")
    from cugraphrt.bench.generate_models import causal_lm

    model = causal_lm(arch, window=8)
    generator = Generator(model, max_length=64, graphed=False, chunk=5, batch_buckets=(1, 4),
                          prompt_buckets=(8, 20), cache_buckets=(16, 24, 40, 64))
    for lengths in ([19], [5, 12, 9]):
        ids, mask = _prompts(lengths, seed=3)
        expected = _reference(model, ids, mask, max_new_tokens=30)
        got = generator.generate(ids, mask, max_new_tokens=30, pad_token_id=0)
        assert torch.equal(got, expected), (arch, lengths)


def test_an_unknown_architecture_is_refused():
    from cugraphrt.bench.generate_models import causal_lm

    with pytest.raises(ValueError, match="unknown architecture 'bert'"):
        causal_lm("bert")


def test_a_model_with_chunked_attention_is_refused_by_kind():
    transformers = pytest.importorskip("transformers")
    config = transformers.Llama4TextConfig(
        num_hidden_layers=4, hidden_size=64, num_attention_heads=4, num_key_value_heads=2,
        vocab_size=512, intermediate_size=64, intermediate_size_mlp=64, head_dim=16)
    model = transformers.Llama4ForCausalLM(config).eval()
    with pytest.raises(OptionsError, match="chunked_attention") as info:
        Generator(model, max_length=64, graphed=False)
    assert info.value.field == "model"


def test_the_benches_calls_generate_the_same_tokens():
    """cugraphrt.bench's generate_calls (every generate workload's systems): transformers'
    eager generate and a generator's, whole and one-token, none stopping at an EOS."""
    pytest.importorskip("transformers")
    from cugraphrt.bench.generate_models import causal_lm
    from cugraphrt.bench.workloads_generate import generate_calls

    model = causal_lm("llama")
    generator = Generator(model, max_length=32, graphed=False, batch_buckets=(2,),
                          prompt_buckets=(8,), cache_buckets=(32,))
    prompt = torch.randint(1, 512, (2, 6), generator=torch.Generator().manual_seed(5))
    calls = generate_calls(model, prompt, {"cugraphrt": generator, "unbuilt": None}, new=12)
    assert set(calls) == {"hf_eager", "hf_static", "cugraphrt"}
    with torch.no_grad():
        whole, one = (call() for call in calls["hf_eager"])
        ours_whole, ours_one = (call() for call in calls["cugraphrt"])
    assert whole.shape == (2, 18) and one.shape == (2, 7)
    assert torch.equal(ours_whole, whole) and torch.equal(ours_one, one)


def test_the_architectures_bench_compiles_each_architecture_afresh(monkeypatch):
    """Every architecture's hf_static compiles one transformers function (the forward
    wrapper). The bench resets dynamo after each architecture: otherwise the compilations of
    the ones before count towards dynamo's recompile limit, and a later one's compiled
    system runs eagerly (Mistral's and Mixtral's hf_static did on the H200)."""
    from cugraphrt.bench import workloads_architectures as bench
    from cugraphrt.bench.spec import Context

    compiled = []

    def backend(gm, example_inputs):
        compiled.append(len(example_inputs))
        return gm.forward

    def wrapper(x):  # one code object, as transformers' wrapper is for every model
        return x * 2 + 1

    step = torch.compile(wrapper, backend=backend, dynamic=False)

    def architecture(ctx, torch_, Generator, name, rows):  # five shapes: five compilations
        for n in range(1, 6):
            assert torch.equal(step(torch.ones(n)), torch.full((n,), 3.0))

    monkeypatch.setenv(bench.ENV, "llama,mistral")
    monkeypatch.setattr(bench, "skipped", lambda ctx, rows, only: False)
    monkeypatch.setattr(bench, "_architecture", architecture)
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: None)
    torch._dynamo.reset()
    bench.run_generate_architectures(Context(selected=True))
    assert len(compiled) == 10  # dynamo's limit is 8: without the reset, 8
