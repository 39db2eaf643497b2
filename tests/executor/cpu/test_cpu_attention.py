"""The CPU paged-attention kernel (executor/cpu/cpu_attention.py) against the torch backend.

Kernel cases are random paged batches whose block tables share leading blocks the way
forks and beams do; error = max |kernel - torch| / max |torch| (fp32 1e-5, bf16 2e-2).
Engine cases run the real demo models with each switch off and on and compare greedy
tokens."""

from __future__ import annotations

import json

import pytest
import torch

from tts_runtime import CacheConfig, ConfigError, Engine, EngineConfig, SamplingParams, SchedulerConfig, ScoreParams
from tts_runtime import cpu_features
from tts_runtime.executor.attention.backends import TorchAttention, select_backend
from tts_runtime.executor.attention.attention_plan import batch_sequences, prefix_tree
from tts_runtime.executor.cpu.cpu_attention import CpuPagedAttention, load_kernel
from tts_runtime.executor.cpu.cpu_extensions import KernelUnavailable

from tests.executor.attention_cases import BEAMS, CASES, Case, Seq, build

REL_TOL = {torch.float32: 1e-5, torch.bfloat16: 2e-2}


@pytest.fixture(scope="module", params=[None, "x86-64-v3"], ids=["default-build", "x86-64-v3-build"])
def kernel_march(request) -> str:
    """The -march of the build under test: this run's (native, or what TTS_CPU_FEATURES names),
    and the AVX2 build (x86-64-v3), which any x86-64-v3 CPU runs, this one included."""
    if request.param is not None and request.param == cpu_features.march():
        pytest.skip(f"the default build is already -march={request.param} ({cpu_features.ENV}={cpu_features.level()})")
    return request.param or cpu_features.march()


@pytest.fixture(scope="module")
def kernel(kernel_march):
    try:
        return load_kernel(kernel_march)
    except KernelUnavailable as exc:
        pytest.fail(f"the CPU kernel must build where the tests run: {exc}")


def check(kernel, case: Case, cascade: bool = True, bf16_dot: bool = True, few_lanes: bool = True,
          prefetch_next_item: bool = True) -> CpuPagedAttention:
    query, k_cache, v_cache, meta = build(case)
    scale = case.head_dim ** -0.5
    ref = TorchAttention().attend(query, k_cache, v_cache, meta, scale, case.window, case.softcap)
    backend = CpuPagedAttention(kernel, cascade=cascade, bf16_dot=bf16_dot, few_lanes=few_lanes,
                                prefetch_next_item=prefetch_next_item)
    out = backend.attend(query, k_cache, v_cache, meta, scale, case.window, case.softcap)
    assert out.dtype == query.dtype and out.shape == query.shape and torch.isfinite(out).all()
    err = ((out.float() - ref.float()).abs().max() / ref.float().abs().max()).item()
    assert err <= REL_TOL[case.dtype], f"rel err {err:.2e}"
    return backend


@pytest.mark.parametrize("name", list(CASES))
@pytest.mark.parametrize("cascade", [True, False], ids=["cascade", "flat"])
def test_kernel_matches_torch(kernel, name: str, cascade: bool) -> None:
    check(kernel, CASES[name], cascade)


@pytest.mark.parametrize("name", [n for n, c in CASES.items() if c.dtype == torch.bfloat16])
def test_bf16_cases_match_torch_with_the_dot_products_off(kernel, name: str) -> None:
    check(kernel, CASES[name], bf16_dot=False)


def check_switch(kernel, case: Case, **switch: bool) -> torch.Tensor:
    """The kernel's output with `switch`, after checking it against torch."""
    query, k_cache, v_cache, meta = build(case)
    return check(kernel, case, **switch).attend(query, k_cache, v_cache, meta, case.head_dim ** -0.5, case.window,
                                                case.softcap)


# GQA groups of 1 to 4 query heads: a decode row is a lane group of that many lanes, and the
# 4 forks' shared item leaves a remainder of 12, 8 or 4 lanes on an 8- or 16-lane build.
FEW_LANE_CASES = {f"gqa{g}-{str(dtype).removeprefix('torch.')}": Case(BEAMS + [Seq(90)], dtype=dtype,
                                                                      num_heads=2 * g, num_kv_heads=2, window=200)
                  for g in (1, 2, 3, 4) for dtype in (torch.float32, torch.bfloat16)}
# head_dim 80: 10 or 5 vector chunks, which the value loop's groups of 4 or 2 do not divide.
FEW_LANE_CASES["gqa3-head-dim-80-float32"] = Case(BEAMS, num_heads=6, num_kv_heads=2, head_dim=80)
FEW_LANE_CASES["gqa4-head-dim-80-float32"] = Case(BEAMS, num_heads=8, num_kv_heads=2, head_dim=80)


@pytest.mark.parametrize("name", list(FEW_LANE_CASES))
def test_few_lanes_match_torch_and_are_what_the_switch_turns_on(kernel, name: str) -> None:
    """The few-lane loops and the lane loops both match torch, and in fp32 they differ in the
    last bits (their sums run in another order; a bf16 output rounds that away): the switch
    reaches the kernel. Prefetching the next item's keys changes no bit."""
    case = FEW_LANE_CASES[name]
    on = check_switch(kernel, case, few_lanes=True, bf16_dot=False)
    off = check_switch(kernel, case, few_lanes=False, bf16_dot=False)
    assert case.dtype != torch.float32 or not torch.equal(on, off)
    assert torch.equal(check_switch(kernel, case, few_lanes=True, bf16_dot=False, prefetch_next_item=False), on)


def test_bf16_dot_products_are_built_where_the_cpu_has_them(kernel, kernel_march) -> None:
    # x86-64-v3 and -v4 have no AVX512-BF16; native has it where the CPU (as tts sees it) does.
    assert kernel.bf16_dot_available() == (kernel_march == "native" and cpu_features.has("avx512_bf16"))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("pool", ["per-layer", "block-major"])
def test_store_kv_writes_what_torch_writes(kernel, dtype: torch.dtype, pool: str) -> None:
    """The kernel's store of new K/V puts each token's heads at its slot, as torch's
    index_copy_ does, in a per-layer pool and in the elastic pool's block-major views, from
    K/V whose rows are slices of a fused projection's output."""
    from tts_runtime.executor.attention.attention import store_kv
    from tts_runtime.executor.kv_cache import shared_kv_views
    from tts_runtime.models.arch import arch_from_hf

    gen = torch.Generator().manual_seed(0)
    tokens, heads, dim, blocks, block_size = 37, 3, 64, 12, 16
    qkv = torch.randn(tokens, (3 + 2) * heads * dim, generator=gen).to(dtype)
    key = qkv[:, 3 * heads * dim: 4 * heads * dim].view(tokens, heads, dim)
    value = qkv[:, 4 * heads * dim:].view(tokens, heads, dim)
    slots = torch.randperm(blocks * block_size, generator=gen)[:tokens]

    def pools() -> tuple[torch.Tensor, torch.Tensor]:
        if pool == "per-layer":
            return (torch.zeros(blocks, block_size, heads, dim, dtype=dtype),
                    torch.zeros(blocks, block_size, heads, dim, dtype=dtype))
        arch = arch_from_hf({"model_type": "llama", "num_hidden_layers": 2, "num_attention_heads": heads,
                             "num_key_value_heads": heads, "hidden_size": heads * dim, "head_dim": dim,
                             "intermediate_size": 8, "vocab_size": 8})
        size = torch.empty((), dtype=dtype).element_size()
        stride = 2 * 2 * block_size * heads * dim * size + 64
        views = shared_kv_views(torch.zeros(blocks * stride, dtype=torch.uint8), arch, blocks, block_size, stride, dtype)
        return views[1]

    want_k, want_v = pools()
    store_kv(key, value, want_k, want_v, slots)
    got_k, got_v = pools()
    CpuPagedAttention(kernel).store_kv(key, value, got_k, got_v, slots)
    assert torch.equal(got_k, want_k) and torch.equal(got_v, want_v)
    assert int((want_k != 0).any(-1).any(-1).sum()) == tokens  # every token landed in a slot of its own
    with pytest.raises(RuntimeError, match="outside the pool"):
        kernel.store_kv(key, value, got_k, got_v, slots + blocks * block_size)


def test_prefix_tree_groups_by_block_ids() -> None:
    case = CASES["beams-diverging-at-different-blocks"]
    meta = build(case)[3]
    nodes = {(tuple(sorted(m)), a, b) for m, a, b in prefix_tree(batch_sequences(meta), 16)}
    # 0..3 share block 0-1 with 4; 0, 1, 2 share 2-9; 0 and 1 share 10-28; 3 shares 2's 10-19.
    assert ((0, 1, 2, 3, 4), 0, 2) in nodes
    assert ((0, 1, 2, 3), 2, 10) in nodes
    assert ((0, 1), 10, 29) in nodes
    assert ((2, 3), 10, 20) in nodes
    assert ((4,), 2, 6) in nodes


# -- the engine on the real demo models ----------------------------------------------------

BACKENDS = {"torch": dict(attention_backend="torch"), "cpu-flat": dict(attention_backend="cpu", cascade_attention=False),
            "cpu-cascade": dict(attention_backend="cpu", cascade_attention=True)}
SMALL_POOL = CacheConfig(num_blocks=320)  # these prompts need < 200 blocks of 8; the default pool is 1 GiB


@pytest.fixture(scope="module")
def problem(math500_path) -> str:
    return json.loads(math500_path.read_text().splitlines()[0])["problem"]


def beam_prompts(tokenizer, problem: str) -> list[list[int]]:
    """A MATH-500 problem with diverging earlier steps, as beam search sends them (the PRM
    stand-in is a base model without a chat template: plain text)."""
    if tokenizer.chat_template is None:
        head = tokenizer.encode(problem + "\n\n")
    else:
        head = tokenizer.apply_chat_template([{"role": "user", "content": problem}], tokenize=True,
                                             add_generation_prompt=True, return_dict=False)
    steps = ["## Step 1: Convert to polar form.\n\n", "## Step 1: Find r first.\n\nr = sqrt(0 + 9) = 3.\n\n",
             "## Step 1: The point lies on the positive y-axis, so the angle is pi/2.\n\n"]
    return [head] + [head + tokenizer.encode(s, add_special_tokens=False) for s in steps]


def test_greedy_tokens_match_torch_on_beams_sharing_a_prefix(generator_model, problem):
    prompts = beam_prompts(generator_model.tokenizer, problem)
    # A small token budget splits the prompts into chunks that extend cached prefixes and
    # share steps with the decodes of the prompts already running.
    scheduler = SchedulerConfig(max_num_batched_tokens=48)
    params = [SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)] * len(prompts)
    params[0] = SamplingParams(temperature=0, n=3, max_tokens=12, ignore_eos=True)  # forks of one prompt
    outputs = {}
    for name, switches in BACKENDS.items():
        engine = Engine(generator_model.name, EngineConfig(cache=SMALL_POOL, scheduler=scheduler, **switches), loaded=generator_model)
        assert engine.executor.backend.name == switches["attention_backend"]
        outputs[name] = [[c.token_ids for c in o.completions] for o in engine.generate(prompts, params)]
    for name in ("cpu-flat", "cpu-cascade"):
        assert outputs[name] == outputs["torch"], name


def test_prm_scores_match_torch_with_sliding_window_layers(prm_model, problem):
    # Gemma 3: sliding-window and global layers, 1 KV head, head_dim 256.
    prompts = beam_prompts(prm_model.tokenizer, problem)
    candidates = prm_model.tokenizer.encode(" yes no", add_special_tokens=False)
    params = [ScoreParams(positions=tuple(range(len(p) - 12, len(p))), candidate_token_ids=candidates,
                          return_logits=True) for p in prompts]
    scores = {}
    for name, switches in BACKENDS.items():
        engine = Engine(prm_model.name, EngineConfig(cache=SMALL_POOL, **switches), loaded=prm_model)
        engine.score(prompts[:1], params[:1])  # the rest extend a cached prefix
        scores[name] = torch.tensor([o.scores for o in engine.score(prompts, params)])
    for name in ("cpu-flat", "cpu-cascade"):
        torch.testing.assert_close(scores[name], scores["torch"], rtol=1e-4, atol=1e-4)


def test_preemption_keeps_greedy_tokens(generator_model, problem):
    prompts = beam_prompts(generator_model.tokenizer, problem)[1:]
    greedy = SamplingParams(temperature=0, max_tokens=32, ignore_eos=True)
    roomy = Engine(generator_model.name, EngineConfig(cache=SMALL_POOL, attention_backend="torch"), loaded=generator_model)
    expected = [o.completions[0].token_ids for o in roomy.generate(prompts, greedy)]
    need = -(-(max(len(p) for p in prompts) + 32) // 16)
    tight = Engine(generator_model.name,
                   EngineConfig(cache=CacheConfig(num_blocks=need + 4, block_size=16), attention_backend="cpu"),
                   loaded=generator_model)
    got = [o.completions[0].token_ids for o in tight.generate(prompts, greedy)]
    assert tight.scheduler.num_preemptions > 0
    assert got == expected


def test_auto_picks_the_kernel_on_cpu_and_unknown_backend_is_a_config_error():
    assert select_backend("auto", torch.device("cpu")).name == "cpu"
    with pytest.raises(ConfigError, match="unknown attention backend"):
        select_backend("flash", torch.device("cpu"))


def test_cli_rejects_an_unknown_attention_backend_in_one_line():
    from typer.testing import CliRunner

    from tts_runtime.cli import app

    result = CliRunner().invoke(app, ["beam", "--limit", "1", "--attention-backend", "flash"])
    assert result.exit_code == 2
    assert "error: unknown attention backend 'flash'" in result.output


@pytest.mark.parametrize("head_dim", [72, 288], ids=["not-a-multiple-of-16", "over-256"])
def test_head_sizes_the_kernel_does_not_take_go_to_the_fallback(kernel, head_dim: int) -> None:
    case = Case(CASES["forks-of-one-prompt"].seqs, head_dim=head_dim)
    query, k_cache, v_cache, meta = build(case)
    scale = head_dim ** -0.5
    ref = TorchAttention().attend(query, k_cache, v_cache, meta, scale, None, None)
    out = CpuPagedAttention(kernel, fallback=TorchAttention()).attend(query, k_cache, v_cache, meta, scale, None, None)
    assert torch.equal(out, ref)
    with pytest.raises(RuntimeError, match="head_dim must be a multiple of 16 and at most 256"):
        CpuPagedAttention(kernel).attend(query, k_cache, v_cache, meta, scale, None, None)


def test_beam_bench_runs_each_switch_at_its_dtypes(math500_path):
    """The beam-shaped benchmark at a tiny size: every variant generates its tokens, and the
    bf16-only switches run at bf16 alone."""
    from evals.bench_beam import BeamBenchConfig, bench_beam

    config = BeamBenchConfig(prompts=1, n=2, prompt_tokens=40, new_tokens=3, repeats=1, hf=False, avx2=False,
                             dtypes=(torch.float32, torch.bfloat16))
    side, labels = bench_beam(config)
    expected = ["tts_torch", "tts_kernel", "tts_cascade", "tts_onednn", "tts_prepacked",
                "tts_onednn_bf16", "tts_prepacked_bf16", "tts_streamed_bf16", "tts_no_bf16_dot_bf16",
                "tts_eager_ops_bf16"]
    assert [k for k in side.runs if not k.startswith("vllm")] == expected
    assert all(side.median(k, "tokens") == 6 for k in expected)


@pytest.mark.skipif(not (cpu_features.has("avx2") and cpu_features.has("fma")) or cpu_features.march() != "native",
                    reason="the AVX2 side needs a CPU with AVX2 and FMA that this run does not hold to them already")
def test_beam_bench_runs_the_avx2_build_in_a_worker(math500_path):
    """The beam benchmark's AVX2 rows come from a worker process that runs as an AVX2 CPU,
    alternating with this process's rows."""
    from evals.bench_beam import AVX2_VARIANTS, BeamBenchConfig, bench_beam

    config = BeamBenchConfig(prompts=1, n=2, prompt_tokens=40, new_tokens=3, repeats=2, hf=False,
                             dtypes=(torch.float32,))
    side, labels = bench_beam(config)
    avx2 = [name + "_avx2" for name in AVX2_VARIANTS]
    assert [k for k in side.runs if k.endswith("_avx2")] == avx2
    for label in avx2:
        assert [run["tokens"] for run in side.runs[label]] == [6, 6]
        assert all(run["cpu_features"].startswith("avx2 (-march=x86-64-v3)") for run in side.runs[label])
        assert "AVX2 build" in labels[label]
