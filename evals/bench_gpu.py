"""`tts bench gpu`: the GPU execution path against HF transformers and against rooflines,
on the seed models' shapes with dummy (random) weights, bf16.

(a) decode: Llama-3.2-1B, batch 64 and 256, 128-token prompts, 512 new tokens (T=0.8,
    ignore EOS); output tokens/s of tts vs HF `generate`, plus two ablations of tts
    (CUDA graphs off; fused Triton ops off).
(b) prefill: Llama-3.1-8B score requests of 512-token prompts (one scored position, two
    candidate ids, like a PRM); prompt tokens/s of tts vs an HF forward over the same
    batches, with all logits (how search-and-learn scores) and with the last position's
    only (`logits_to_keep=1`, the leanest HF forward), plus tts with fused ops off.
(c) search: beam search n=4, M=4 with the demo models on the first 50 MATH-500 problems,
    problems/min of tts vs the plain HF baseline, through the search benchmark
    (evals/bench_search.py; its own report goes to docs/benchmarks/gpu-search/).

Rooflines come from the same GPU, measured in the same run:
* HBM bandwidth: a large device-to-device copy (bytes read + written per second);
* bf16 matmul rate: a large square bf16 matmul.
A decode run cannot beat prefill at the matmul rate plus, per decode step, the weights
and every sequence's KV read once at that bandwidth. A prefill token costs 2 FLOPs per
weight of the layers it passes through plus its attention products (the output layer
runs only on scored rows, the embedding is a lookup).
"""

from __future__ import annotations

import argparse
import statistics
import sys
from collections.abc import Callable
from dataclasses import asdict, dataclass

import torch

from evals.bench import BENCH_DIR, SideBySide, write_report
from tts_runtime.config import CacheConfig, ConfigError, EngineConfig, SchedulerConfig, default_block_size
from tts_runtime.executor.device_memory import device_memory_info, gpu_facts
from tts_runtime.executor.kv_cache import KVAllocation, allocate_kv_cache
from tts_runtime.engine.engine import Engine
from tts_runtime.engine.request import SamplingParams, ScoreParams
from tts_runtime.models.arch import ArchConfig
from tts_runtime.models.layers import EAGER_OPS
from tts_runtime.models.loader import LoadedModel, load_model
from tts_runtime.models.registry import BUILTIN_CONFIGS
from tts_runtime.options import option

GiB = 1 << 30
# Random prompt ids stay below Llama 3's special tokens (128000+).
_PROMPT_VOCAB = 128000


@dataclass(frozen=True)
class GpuBenchConfig:
    decode_model: str = "llama-3.2-1b"
    decode_batches: tuple[int, ...] = (1, 64, 256)
    decode_contexts: tuple[int, ...] = (512, 2048)  # prompt tokens before decoding starts
    new_tokens: int = 512
    prefill_model: str = "llama-3.1-8b"
    prefill_prompt_tokens: int = 512
    prefill_requests: int = 256
    # Engine token budget per step, and tokens per HF forward (16 prompts of 512).
    prefill_batch_tokens: int = 8192
    repeats: int = option(3, "Alternating repetitions; medians reported.", at_least=1)
    seed: int = 0
    search_limit: int = option(50, "MATH-500 problems for the search part (0 skips it).", at_least=0)
    workloads: tuple[str, ...] = ("decode", "prefill", "search")
    report_name: str = "gpu"


def require_cuda() -> torch.device:
    if not torch.cuda.is_available():
        raise ConfigError("tts bench gpu needs a CUDA GPU, and torch sees none "
                          "(torch.cuda.is_available() is False); run it on a GPU machine")
    return torch.device("cuda")


# -- rooflines -----------------------------------------------------------------------------

def _median_seconds(fn: Callable[[], object], iters: int, warmup: int = 3) -> float:
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(iters):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1000)
    return statistics.median(times)


def measure_hbm_bandwidth(device: torch.device, nbytes: int = 2 * GiB, iters: int = 20) -> float:
    """Bytes per second of a device-to-device copy, counting the read and the write."""
    src = torch.empty(nbytes, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    seconds = _median_seconds(lambda: dst.copy_(src), iters)
    del src, dst
    torch.cuda.empty_cache()
    return 2 * nbytes / seconds


def measure_bf16_matmul(device: torch.device, n: int = 8192, iters: int = 20) -> float:
    """FLOP/s of an n x n x n bf16 matmul."""
    a = torch.randn(n, n, dtype=torch.bfloat16, device=device)
    b = torch.randn(n, n, dtype=torch.bfloat16, device=device)
    out = torch.empty(n, n, dtype=torch.bfloat16, device=device)
    seconds = _median_seconds(lambda: torch.matmul(a, b, out=out), iters)
    del a, b, out
    torch.cuda.empty_cache()
    return 2 * n ** 3 / seconds


def _layer_params(arch: ArchConfig) -> int:
    embed = arch.vocab_size * arch.hidden_size * (1 if arch.tie_word_embeddings else 2)
    return arch.num_parameters() - embed


def prefill_flops_per_token(arch: ArchConfig, context: int) -> float:
    """Layers' weights x 2, plus QK^T and PV over the causal context (mean context/2)."""
    attention = 4 * arch.num_layers * arch.num_heads * arch.head_dim * (context + 1) / 2
    return 2 * _layer_params(arch) + attention


def decode_roofline_seconds(arch: ArchConfig, batch: int, prompt: int, new: int, bandwidth: float,
                            flops: float, element_bytes: int = 2) -> float:
    """Lower bound of a whole generate run: the prompts' prefill at the matmul rate, then
    new - 1 decode steps each reading every weight the step uses (layers + output layer)
    and each sequence's KV once."""
    weights = (_layer_params(arch) + arch.vocab_size * arch.hidden_size) * element_bytes
    kv_per_token = arch.kv_bytes_per_token(element_bytes)
    prefill = batch * prompt * prefill_flops_per_token(arch, prompt) / flops
    # Step s (1 .. new-1) attends over prompt + s tokens per sequence.
    kv_tokens = batch * sum(prompt + s for s in range(1, new))
    return prefill + ((new - 1) * weights + kv_tokens * kv_per_token) / bandwidth


# -- workloads -----------------------------------------------------------------------------

def random_prompts(count: int, length: int, seed: int) -> list[list[int]]:
    """`count` prompts of `length` random token ids (equal lengths: no padding anywhere)."""
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(0, _PROMPT_VOCAB, (count, length), generator=generator).tolist()


def _hf_model(shape: str, device: torch.device):
    from transformers import AutoModelForCausalLM, LlamaConfig

    with torch.device(device):
        model = AutoModelForCausalLM.from_config(LlamaConfig(**BUILTIN_CONFIGS[shape]), dtype=torch.bfloat16)
    return model.eval()


def _synchronize(device: torch.device) -> None:
    """Wait for queued kernels, so the caller's timer covers them (a no-op off CUDA)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def tts_generate(engine: Engine, prompts: list[list[int]], new_tokens: int) -> dict:
    """The decode workload on tts: `new_tokens` sampled per prompt; {"tokens": generated}."""
    params = SamplingParams(temperature=0.8, max_tokens=new_tokens, ignore_eos=True)
    outputs = engine.generate(prompts, params)  # returns after the last .tolist(): synchronised
    return {"tokens": sum(len(o.completions[0].token_ids) for o in outputs)}


def hf_generate(hf, prompts: list[list[int]], new_tokens: int) -> dict:
    """The decode workload on HF `generate`, sampling like `tts_generate`; {"tokens": generated}."""
    ids = torch.tensor(prompts, device=hf.device)  # equal lengths: no padding
    with torch.inference_mode():
        out = hf.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=new_tokens,
                          min_new_tokens=new_tokens, do_sample=True, temperature=0.8, top_p=1.0, top_k=0,
                          pad_token_id=0)
    _synchronize(hf.device)
    return {"tokens": (out.shape[1] - ids.shape[1]) * ids.shape[0]}


def _decode_kv(loaded: LoadedModel, config: GpuBenchConfig, device: torch.device) -> KVAllocation:
    """One KV allocation for every tts variant: they run one after another, each to the end,
    with prefix caching off, so none reads what another left (three copies of a batch-256,
    2k-context KV would not fit beside HF's prefill on an 80 GB GPU)."""
    batch = max(config.decode_batches)
    per_seq = -(-(max(config.decode_contexts) + config.new_tokens) // CacheConfig.block_size)
    num_blocks = batch * per_seq + batch
    caches = allocate_kv_cache(loaded.arch, num_blocks, CacheConfig.block_size, loaded.dtype, device)
    return KVAllocation(caches, num_blocks, list(range(num_blocks)))


def _decode_engine(loaded: LoadedModel, config: GpuBenchConfig, kv: KVAllocation, **switches: bool) -> Engine:
    engine_config = EngineConfig(
        # Prefix caching off: repeats must not reuse the previous repeat's prompt blocks.
        cache=CacheConfig(num_blocks=kv.num_blocks, enable_prefix_caching=False),
        scheduler=SchedulerConfig(max_num_seqs=max(config.decode_batches),
                                  max_num_batched_tokens=config.prefill_batch_tokens),
        **switches)
    return Engine(loaded.name, engine_config, loaded=loaded, kv=kv)


def bench_decode(config: GpuBenchConfig, device: torch.device) -> dict[tuple[int, int], SideBySide]:
    name = f"dummy:{config.decode_model}"
    loaded = load_model(name, torch.bfloat16, device)
    # Fused ops are a property of the model: the eager-ops ablation gets its own copy
    # (dummy weights are seeded per parameter name, so the copies are identical).
    loaded_eager = load_model(name, torch.bfloat16, device)
    kv = _decode_kv(loaded, config, device)
    engines = {
        "tts": _decode_engine(loaded, config, kv),
        "tts_no_graphs": _decode_engine(loaded, config, kv, cuda_graphs=False),
        "tts_eager_ops": _decode_engine(loaded_eager, config, kv, compile=False),
    }
    hf = _hf_model(config.decode_model, device)
    results = {}
    for context, batch in ((c, b) for c in config.decode_contexts for b in config.decode_batches):
        prompts = random_prompts(batch, context, config.seed + batch)
        variants: dict[str, Callable[[], dict]] = {
            "hf": lambda: hf_generate(hf, prompts, config.new_tokens)}
        for label, engine in engines.items():
            variants[label] = lambda engine=engine: tts_generate(engine, prompts, config.new_tokens)
        for fn in variants.values():  # warm-up: Triton compilation, cuBLAS heuristics
            fn()
        side = SideBySide(f"decode batch {batch} context {context}")
        side.run(variants, config.repeats)
        results[batch, context] = side
    for engine in engines.values():
        engine.shutdown()
    del engines, kv, loaded, loaded_eager, hf
    torch.cuda.empty_cache()
    return results


def tts_score(engine: Engine, prompts: list[list[int]], params: ScoreParams, fused: bool) -> dict:
    """The prefill (PRM score) workload on tts, fused Triton ops or eager; {"tokens": prompt tokens}."""
    # The ablation shares the executor: set its ops for this run (prefill runs eagerly, no
    # CUDA graph has baked any op in).
    if fused:
        from tts_runtime.models.fused_ops import FUSED_OPS

        engine.executor.ops = FUSED_OPS
    else:
        engine.executor.ops = EAGER_OPS
    outputs = engine.score(prompts, params)
    return {"tokens": sum(len(o.prompt_token_ids) for o in outputs)}


def hf_score(hf, prompts: list[list[int]], per_forward: int, last_only: bool) -> dict:
    """The prefill workload on HF, `per_forward` prompts a forward, all logits or the last
    position's only; {"tokens": prompt tokens}."""
    with torch.inference_mode():
        for start in range(0, len(prompts), per_forward):
            ids = torch.tensor(prompts[start: start + per_forward], device=hf.device)
            if last_only:
                hf(input_ids=ids, logits_to_keep=1)
            else:
                hf(input_ids=ids)
    _synchronize(hf.device)
    return {"tokens": sum(len(p) for p in prompts)}


def bench_prefill(config: GpuBenchConfig, device: torch.device) -> SideBySide:
    loaded = load_model(f"dummy:{config.prefill_model}", torch.bfloat16, device)
    engine = Engine(loaded.name, EngineConfig(
        cache=CacheConfig(num_blocks=2 * config.prefill_batch_tokens // default_block_size("cuda") + 64,
                          enable_prefix_caching=False),
        scheduler=SchedulerConfig(max_num_batched_tokens=config.prefill_batch_tokens),
        cuda_graphs=False,  # score requests never decode
    ), loaded=loaded)
    hf = _hf_model(config.prefill_model, device)
    length = config.prefill_prompt_tokens
    prompts = random_prompts(config.prefill_requests, length, config.seed)
    params = ScoreParams(positions=[length - 1], candidate_token_ids=[10, 20])
    per_forward = max(1, config.prefill_batch_tokens // length)
    variants = {
        "hf": lambda: hf_score(hf, prompts, per_forward, last_only=False),
        "hf_last_logits": lambda: hf_score(hf, prompts, per_forward, last_only=True),
        "tts": lambda: tts_score(engine, prompts, params, fused=True),
        "tts_eager_ops": lambda: tts_score(engine, prompts, params, fused=False),
    }
    for fn in variants.values():
        fn()
    side = SideBySide("prefill")
    side.run(variants, config.repeats)
    engine.shutdown()
    del engine, loaded, hf
    torch.cuda.empty_cache()
    return side


# -- report --------------------------------------------------------------------------------

def _rates(side: SideBySide) -> dict[str, float]:
    return {label: side.median(label, "tokens") / side.median(label, "seconds") for label in side.runs}


def run_gpu_bench(config: GpuBenchConfig | None = None, command: str = "tts bench gpu") -> str:
    """Run every GPU benchmark; write docs/benchmarks/gpu.{json,md}; return the .md path."""
    config = config or GpuBenchConfig()
    device = require_cuda()
    torch.cuda.reset_peak_memory_stats(device)
    bandwidth = measure_hbm_bandwidth(device)
    matmul = measure_bf16_matmul(device)
    decode = bench_decode(config, device) if "decode" in config.workloads else {}
    prefill = bench_prefill(config, device) if "prefill" in config.workloads else None
    search = bench_search_on_gpu(config.search_limit) \
        if config.search_limit and "search" in config.workloads else None

    rows, summary = [], {"config": asdict(config), "hbm_bytes_per_s": bandwidth, "bf16_flops": matmul,
                         "decode": {}, "prefill": {}}
    decode_arch = shape_arch(config.decode_model)
    for (batch, context), side in decode.items():
        rates = _rates(side)
        roof = batch * config.new_tokens / decode_roofline_seconds(
            decode_arch, batch, context, config.new_tokens, bandwidth, matmul)
        summary["decode"][f"batch {batch} context {context}"] = {
            "tokens_per_s": rates, "roofline_tokens_per_s": roof, "vs_hf": rates["tts"] / rates["hf"],
            "roofline_fraction": rates["tts"] / roof, "raw": side.runs}
        rows.append(_row(f"decode {config.decode_model} batch {batch}, {context}+{config.new_tokens} "
                         "tokens (output tok/s)", rates, "hf", roof, ">= 3x HF; >= 50% roofline at 256"))
    if prefill is not None:
        _prefill_rows(config, prefill, matmul, summary, rows)
    if search is not None:
        summary["search"] = search
        rows.append(_search_row(search, config.search_limit))
    memory = device_memory_info(device)
    import triton  # for its version; the kernels imported it already

    facts = {**gpu_facts(device), "triton": triton.__version__}
    summary["memory"] = asdict(memory)
    summary["gpu"] = facts
    notes = [
        "GPU: " + ", ".join(f"{k} {v}" for k, v in facts.items()) + ".",
        f"Medians of {config.repeats} alternating repetitions per workload (variants interleaved), one process, "
        "bf16 weights and KV, dummy random weights of the seed shapes (models/registry.py).",
        f"Rooflines measured in this run: HBM {bandwidth / 1e12:.2f} TB/s (2 GiB device-to-device copy, "
        f"read + write), bf16 matmul {matmul / 1e12:.0f} TFLOP/s (8192^3).",
        "Decode roofline: the prompts' prefill at the matmul rate plus, per decode step, all layer and "
        "output-layer weights and every sequence's KV read once at HBM bandwidth. Prefill roofline: "
        "2 FLOPs per layer weight per token plus causal attention products, at the matmul rate "
        "(stricter than 2 x all parameters, which would count the embedding and output layer).",
        "tts: CUDA graphs for decode and fused Triton RMSNorm/rotary/activation (defaults); "
        "tts_no_graphs: EngineConfig(cuda_graphs=False); tts_eager_ops: EngineConfig(compile=False). "
        "Prefix caching off so repeats recompute everything.",
        "HF: transformers from_config(LlamaConfig(...)) with random weights, bf16, default attention; "
        "decode with generate (sampling T=0.8, min_new_tokens = max_new_tokens), prefill with one "
        f"forward per {max(1, config.prefill_batch_tokens // config.prefill_prompt_tokens)} prompts.",
        f"Peak torch memory {memory.allocator.peak_allocated / GiB:.1f} GiB allocated, "
        f"{memory.allocator.peak_reserved / GiB:.1f} GiB reserved.",
    ]
    if search is not None:
        notes.append("Search: evals/bench_search.py with its defaults (demo models, beam search n=4, M=4, "
                     "tts with problems in flight vs the plain HF baseline one problem at a time); its full "
                     f"report is docs/benchmarks/gpu-search/search.md ({search['problems']} problems).")
    title = "GPU benchmark: tts vs HF transformers and rooflines"
    return str(write_report(config.report_name, title, command, summary, rows, notes))


def _prefill_rows(config: GpuBenchConfig, prefill: SideBySide, matmul: float, summary: dict,
                  rows: list[dict]) -> None:
    rates = _rates(prefill)
    roof = matmul / prefill_flops_per_token(shape_arch(config.prefill_model), config.prefill_prompt_tokens)
    summary["prefill"] = {"tokens_per_s": rates, "roofline_tokens_per_s": roof,
                          "vs_hf": rates["tts"] / rates["hf"],
                          "vs_hf_last_logits": rates["tts"] / rates["hf_last_logits"],
                          "roofline_fraction": rates["tts"] / roof, "raw": prefill.runs}
    rows.append(_row(f"prefill {config.prefill_model} score, {config.prefill_requests} x "
                     f"{config.prefill_prompt_tokens} tokens (prompt tok/s)", rates, "hf", roof,
                     ">= 3x HF; >= 50% roofline"))
    rows.append(_row("  same, vs HF with logits_to_keep=1", rates, "hf_last_logits", roof, "(context)"))


def bench_search_on_gpu(limit: int) -> dict:
    """(c) through the search benchmark; returns its medians and ratios."""
    # Imported here: the search stack (runtime, baselines, datasets) is only needed for (c).
    from evals.bench_search import SearchBench, bench_search

    bench = SearchBench(limit=limit, out_dir=BENCH_DIR / "gpu-search")
    data = bench_search(bench, command=["tts", "bench", "search", "--limit", str(limit)]).data
    torch.cuda.empty_cache()
    return {"problems": data["problems"], "median": data["median"], "ratio": data.get("ratio")}


def _search_row(search: dict, limit: int) -> dict:
    tts = search["median"]["tts"]["problems_per_min"]
    baseline = search["median"].get("baseline", {}).get("problems_per_min")
    return {"workload": f"beam search n=4 M=4, demo models, {limit} MATH-500 problems (problems/min)",
            "hf": f"{baseline:.2f}" if baseline else "-", "tts": f"{tts:.2f}",
            "tts / hf": f"{tts / baseline:.2f}x" if baseline else "-", "roofline": "-", "% roofline": "-",
            "gain over ablation": "-", "target": "(report)"}


def shape_arch(shape: str) -> ArchConfig:
    """The architecture of one of the built-in model shapes (BUILTIN_CONFIGS), for the rooflines."""
    from tts_runtime.models.arch import arch_from_hf

    return arch_from_hf(BUILTIN_CONFIGS[shape])


def _row(workload: str, rates: dict[str, float], baseline: str, roofline: float, target: str) -> dict:
    tts = rates["tts"]
    ablations = ", ".join(f"{k.removeprefix('tts_')} {tts / v:.2f}x" for k, v in rates.items()
                          if k.startswith("tts_"))
    return {"workload": workload, "hf": f"{rates[baseline]:,.0f}", "tts": f"{tts:,.0f}",
            "tts / hf": f"{tts / rates[baseline]:.2f}x", "roofline": f"{roofline:,.0f}",
            "% roofline": f"{100 * tts / roofline:.0f}%", "gain over ablation": ablations or "-",
            "target": target}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=GpuBenchConfig.repeats)
    parser.add_argument("--decode-batches", type=int, nargs="+", default=list(GpuBenchConfig.decode_batches))
    parser.add_argument("--decode-contexts", type=int, nargs="+", default=list(GpuBenchConfig.decode_contexts),
                        help="prompt tokens before decoding starts")
    parser.add_argument("--new-tokens", type=int, default=GpuBenchConfig.new_tokens)
    parser.add_argument("--prefill-requests", type=int, default=GpuBenchConfig.prefill_requests)
    parser.add_argument("--search-limit", type=int, default=GpuBenchConfig.search_limit,
                        help="MATH-500 problems for the search benchmark; 0 skips it")
    parser.add_argument("--workloads", nargs="+", choices=GpuBenchConfig.workloads,
                        default=list(GpuBenchConfig.workloads))
    parser.add_argument("--report-name", default=GpuBenchConfig.report_name,
                        help="docs/benchmarks/<name>.{md,json}")
    args = parser.parse_args(argv)
    config = GpuBenchConfig(decode_batches=tuple(args.decode_batches), decode_contexts=tuple(args.decode_contexts),
                            new_tokens=args.new_tokens, prefill_requests=args.prefill_requests,
                            repeats=args.repeats, search_limit=args.search_limit,
                            workloads=tuple(args.workloads), report_name=args.report_name)
    command = "python -m evals.bench_gpu " + " ".join(argv if argv is not None else sys.argv[1:])
    try:
        print(run_gpu_bench(config, command.strip()))
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
