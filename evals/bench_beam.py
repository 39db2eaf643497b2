"""`tts bench engine --workload beam`: decoding in beam search's shape, side by side in one run.

4 prompts of ~1.5k tokens (a MATH-500 problem followed by earlier reasoning steps), each
forked n=4, 256 new tokens each, T=0.8, ignore EOS: 16 sequences whose contexts are almost
all shared by the 4 beams of their prompt. Output tokens/s of tts with the switches off and
on one at a time (the torch attention backend that copies the context out of the paged cache;
the in-place CPU kernel without and with cascade attention; the projections on torch's
F.linear or on oneDNN), HF `generate` with
num_return_sequences=4, and vLLM (n=4, prefix caching) when it is installed in this Python.

The earlier steps are the statements of the following MATH-500 problems, one per step:
real math text of the right length without minutes of generation before the benchmark
starts (attention cost depends on the lengths, not the words).
"""

from __future__ import annotations

import importlib.util
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, fields
from pathlib import Path

import torch

from evals.bench import SideBySide, write_report
import tts_runtime.cpu_features as cpu_features
from tts_runtime.config import CacheConfig, EngineConfig, default_block_size
from tts_runtime.engine.engine import Engine
from tts_runtime.engine.request import SamplingParams
from tts_runtime.models.loader import LoadedModel, load_model
from tts_runtime.runs.datasets import DatasetConfig, load_problems
from tts_runtime.models.registry import DEFAULT_GENERATOR
from tts_runtime.options import option

# The tts variants: (label, what it measures, engine switches, the dtypes it runs at: "first"
# (the first of --dtypes only), "all", or "bfloat16").
TTS_VARIANTS = (
    ("tts_torch", "torch attention backend (gathers each context per layer and step), torch linear and "
     "eager elementwise ops (before)",
     dict(attention_backend="torch", linear_backend="torch", cpu_fused_ops=False), "first"),
    ("tts_kernel", "CPU kernel in place, cascade off, torch linear",
     dict(attention_backend="cpu", cascade_attention=False, linear_backend="torch"), "first"),
    ("tts_cascade", "CPU kernel in place, cascade on, torch linear",
     dict(attention_backend="cpu", cascade_attention=True, linear_backend="torch"), "first"),
    ("tts_onednn", "CPU kernel, cascade on, projections and output layer on oneDNN (the default)",
     dict(attention_backend="cpu", cascade_attention=True, linear_backend="onednn"), "all"),
    ("tts_prepacked", "as tts_onednn, on weights prepacked into oneDNN's blocked layout (--linear-backend prepacked)",
     dict(attention_backend="cpu", cascade_attention=True, linear_backend="prepacked"), "all"),
    ("tts_streamed", "as tts_prepacked, the bf16 projections and output layer on tts's kernel over weights "
     "packed into one sequential stream (--linear-backend streamed)",
     dict(attention_backend="cpu", cascade_attention=True, linear_backend="streamed"), "bfloat16"),
    ("tts_no_bf16_dot", "as tts_streamed, bf16 dot products off (--no-attention-bf16-dot)",
     dict(attention_backend="cpu", cascade_attention=True, linear_backend="streamed", attention_bf16_dot=False),
     "bfloat16"),
    ("tts_eager_ops", "as tts_streamed, torch's eager elementwise ops (--no-cpu-fused-ops)",
     dict(attention_backend="cpu", cascade_attention=True, linear_backend="streamed", cpu_fused_ops=False),
     "bfloat16"),
)


@dataclass(frozen=True)
class BeamBenchConfig:
    generator: str = DEFAULT_GENERATOR
    prompts: int = 4
    n: int = 4
    prompt_tokens: int = 1500
    new_tokens: int = option(256, "Beam workload: new tokens per fork.", flag="beam_new_tokens", at_least=1)
    repeats: int = 3
    hf: bool = option(True, "Beam workload: include HF generate.", flag="beam_hf")
    avx2: bool = option(True, "Beam workload: also run tts as a CPU without AVX-512 does (kernels built for "
                        "x86-64-v3, torch and oneDNN held to AVX2), in a worker process alternating with the "
                        "others (where this CPU has AVX2 and FMA).", flag="beam_avx2")
    # The first dtype runs every tts variant; each further one runs the two oneDNN tts
    # variants, HF and vLLM again, so each side is also measured at its best dtype.
    dtypes: tuple[torch.dtype, ...] = (torch.float32,)


def beam_prompts(loaded: LoadedModel, count: int, target: int) -> list[list[int]]:
    """`count` chat prompts: a problem, then the following problems as the assistant's earlier
    steps until the prompt holds about `target` tokens."""
    problems = load_problems(DatasetConfig(limit=count + 60))
    steps = [p.question.strip() + "\n\n" for p in problems[count:]]
    tok = loaded.tokenizer
    prompts = []
    for i in range(count):
        head = tok.apply_chat_template([{"role": "user", "content": problems[i].question}], tokenize=True,
                                       add_generation_prompt=True, return_dict=False)
        ids, k = list(head), i * 7
        while len(ids) < target:
            ids += tok.encode(steps[k % len(steps)], add_special_tokens=False)
            k += 1
        prompts.append(ids[:target])
    return prompts


def _blocks_needed(config: BeamBenchConfig) -> int:
    """The workload's KV blocks and a quarter more: three engines and HF and vLLM share a
    24 GiB machine, and the default 1 GiB pool per engine is several times what this needs."""
    block = default_block_size("cpu")
    per_prompt = -(-config.prompt_tokens // block) + config.n * (-(-config.new_tokens // block) + 1)
    return int(config.prompts * per_prompt * 1.25)


def _tts(engine: Engine, prompts: list[list[int]], config: BeamBenchConfig) -> dict:
    params = SamplingParams(temperature=0.8, n=config.n, max_tokens=config.new_tokens, ignore_eos=True)
    outputs = engine.generate(prompts, params)
    return {"tokens": sum(len(c.token_ids) for o in outputs for c in o.completions)}


def tts_variant(loaded: LoadedModel, prompts: list[list[int]], config: BeamBenchConfig,
                switches: dict) -> Callable[[], dict]:
    """One repetition of the workload on an engine with `switches`, warmed up."""
    # Prefix caching off: every repetition prefills its prompts like the first (the forks of a
    # prompt still share its blocks).
    cache = CacheConfig(enable_prefix_caching=False, num_blocks=_blocks_needed(config))
    engine = Engine(config.generator, EngineConfig(device="cpu", cache=cache, **switches), loaded=loaded)
    _tts(engine, [p[:64] for p in prompts], BeamBenchConfig(new_tokens=2))  # warm-up
    return lambda: _tts(engine, prompts, config)


def _hf(hf, tokenizer, prompts: list[list[int]], config: BeamBenchConfig) -> dict:
    width = max(len(p) for p in prompts)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    with torch.inference_mode():
        out = hf.generate(input_ids=ids, attention_mask=mask, max_new_tokens=config.new_tokens,
                          min_new_tokens=config.new_tokens, do_sample=True, temperature=0.8, top_p=1.0, top_k=0,
                          num_return_sequences=config.n, pad_token_id=pad)
    return {"tokens": (out.shape[1] - width) * out.shape[0]}


def _vllm_runner(loaded: LoadedModel, config: BeamBenchConfig):
    """vLLM on the same weights, configured as the vLLM backend (evals/bench_vllm.py), or
    None when vLLM is not installed here."""
    if importlib.util.find_spec("vllm") is None:
        return None
    from evals.bench_vllm import vllm_engine

    dtype = loaded.dtype
    engine = vllm_engine(loaded, dtype, config.prompts * (config.prompt_tokens + config.n * config.new_tokens))
    engine.generate([p[:64] for p in beam_prompts(loaded, 1, 64)], SamplingParams(max_tokens=2))  # warm-up
    params = SamplingParams(temperature=0.8, n=config.n, max_tokens=config.new_tokens, ignore_eos=True)

    def run(prompts: list[list[int]]) -> dict:
        engine.reset_prefix_cache()  # as tts: every repetition prefills its prompts
        outputs = engine.generate(prompts, params)
        return {"tokens": sum(len(c.token_ids) for o in outputs for c in o.completions)}

    return run


def _dtype_name(dtype: torch.dtype) -> str:
    return {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}[dtype]


def _runs_at(dtypes: str, dtype: torch.dtype, first: bool) -> bool:
    """Whether a variant marked `dtypes` runs at `dtype` (`first`: the first of --dtypes)."""
    if dtypes == "bfloat16":
        return dtype == torch.bfloat16
    return dtypes == "all" or first


def _sides(config: BeamBenchConfig, dtype: torch.dtype, all_tts: bool, suffix: str,
           variants: dict, labels: dict) -> None:
    """Adds this dtype's variants: the tts variants that run at it (all of them at the first
    dtype), HF, vLLM."""
    loaded = load_model(config.generator, dtype, torch.device("cpu"))
    prompts = beam_prompts(loaded, config.prompts, config.prompt_tokens)
    for label, meaning, switches, dtypes in TTS_VARIANTS:
        if not _runs_at(dtypes, dtype, all_tts):
            continue
        variants[label + suffix] = tts_variant(loaded, prompts, config, switches)
        labels[label + suffix] = meaning
    if config.hf:
        from transformers import AutoModelForCausalLM

        hf = AutoModelForCausalLM.from_pretrained(loaded.folder, dtype=dtype).eval()
        variants["hf" + suffix] = lambda m=hf, p=prompts: _hf(m, loaded.tokenizer, p, config)
        labels["hf" + suffix] = f"HF generate, num_return_sequences={config.n}"
    vllm = _vllm_runner(loaded, config)
    if vllm is not None:
        variants["vllm" + suffix] = lambda run=vllm, p=prompts: run(p)
        labels["vllm" + suffix] = f"vLLM, n={config.n}, prefix caching on"


# The tts variants the AVX2 worker runs: the default, and the faster fp32 projections an AVX2
# CPU has (linear_avx2.md).
AVX2_VARIANTS = ("tts_onednn", "tts_prepacked")


class Avx2Worker:
    """The tts variants as an AVX2 CPU runs them, in a worker process (evals/bench_beam_avx2.py):
    torch picks its kernels and oneDNN its instruction set when torch starts, so that cannot
    happen in this process. One repetition per `run`, timed in the worker, so that the
    benchmark alternates them with its own variants."""

    def __init__(self, config: BeamBenchConfig, runs: list[tuple[str, str, torch.dtype]]) -> None:
        """`runs`: (label, TTS_VARIANTS name, dtype) for each variant the worker builds."""
        settings = {f.name: getattr(config, f.name) for f in fields(config) if f.name != "dtypes"}
        self.process = subprocess.Popen([sys.executable, "-m", "evals.bench_beam_avx2"],
                                        cwd=Path(__file__).resolve().parents[1],
                                        env=os.environ | cpu_features.AVX2_ENVIRONMENT,
                                        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        self._send(json.dumps({"config": settings, "runs": [(label, name, str(dtype).removeprefix("torch."))
                                                            for label, name, dtype in runs]}))
        self._answer()  # its engines are built and warmed up

    def run(self, label: str) -> dict:
        """One repetition: tokens, seconds and the worker's cpu_features.describe()."""
        self._send(label)
        return self._answer()

    def close(self) -> None:
        self.process.stdin.close()
        self.process.wait()

    def _send(self, line: str) -> None:
        self.process.stdin.write(line + "\n")
        self.process.stdin.flush()

    def _answer(self) -> dict:
        line = self.process.stdout.readline()
        if not line:
            raise RuntimeError(f"the AVX2 benchmark worker ended with exit code {self.process.wait()} "
                               "(its error is above)")
        return json.loads(line)


def avx2_runs_here(config: BeamBenchConfig) -> bool:
    """Whether the AVX2 side runs: asked for, and this CPU has AVX2 and FMA and is not already
    held to them."""
    return config.avx2 and cpu_features.has("avx2") and cpu_features.has("fma") and cpu_features.march() == "native"


def _avx2_side(config: BeamBenchConfig, variants: dict, labels: dict) -> Avx2Worker:
    runs = [(name + ("" if i == 0 else "_" + _dtype_name(dtype)) + "_avx2", name, dtype)
            for i, dtype in enumerate(config.dtypes) for name in AVX2_VARIANTS]
    worker = Avx2Worker(config, runs)
    meanings = {label: meaning for label, meaning, _, _ in TTS_VARIANTS}
    for label, name, _ in runs:
        variants[label] = lambda label=label: worker.run(label)
        labels[label] = f"{meanings[name]}; AVX2 build (x86-64-v3), torch and oneDNN held to AVX2"
    return worker


def bench_beam(config: BeamBenchConfig) -> tuple[SideBySide, dict[str, str]]:
    """The workload's sides, alternating; the AVX2 worker's runs also name the CPU features
    they ran with ("cpu_features")."""
    variants, labels = {}, {}
    for i, dtype in enumerate(config.dtypes):
        _sides(config, dtype, i == 0, "" if i == 0 else "_" + _dtype_name(dtype), variants, labels)
    worker = _avx2_side(config, variants, labels) if avx2_runs_here(config) else None
    side = SideBySide("beam")
    try:
        side.run(variants, config.repeats)
    finally:
        if worker is not None:
            worker.close()
    return side, labels


def _avx2_notes(side: SideBySide, rates: dict[str, float]) -> list[str]:
    """The AVX2 rows against the same variants on this CPU's own build."""
    avx2 = [k for k in side.runs if k.endswith("_avx2")]
    if not avx2:
        return ["No AVX2 rows: --no-beam-avx2, or this CPU lacks AVX2 and FMA or is held to them already."]
    return [f"Rows ending _avx2: the variant in a worker process started with "
            f"{' '.join(f'{k}={v}' for k, v in cpu_features.AVX2_ENVIRONMENT.items())} (tts's CPU features "
            f"there: {side.runs[avx2[0]][0]['cpu_features']}; here: {cpu_features.describe()}), alternating "
            "with the other rows; its time is taken in the worker. AVX2 build / this CPU's build: "
            + ", ".join(f"{k} {rates[k] / rates[k.removesuffix('_avx2')]:.2f}x" for k in avx2) + "."]


def run_beam_bench(config: BeamBenchConfig, command: str) -> str:
    side, labels = bench_beam(config)
    rates = {k: side.median(k, "tokens") / side.median(k, "seconds") for k in side.runs}
    before = rates["tts_torch"]
    rows = [{"variant": k, "what": labels[k], "tokens/s": f"{rates[k]:.1f}",
             "vs tts_torch": f"{rates[k] / before:.2f}x"} for k in side.runs]
    if "vllm" not in side.runs:
        rows.append({"variant": "vllm", "what": "not installed in this Python (pip install vllm)",
                     "tokens/s": "-", "vs tts_torch": "-"})
    summary = {"tokens_per_s": rates, "speedup_vs_torch_backend": {k: r / before for k, r in rates.items()},
               "raw": side.runs}
    native = {k: r for k, r in rates.items() if not k.endswith("_avx2")}
    best = {peer: max((r, k) for k, r in native.items() if k.startswith(peer))
            for peer in ("tts_onednn", "tts_prepacked", "tts_streamed", "hf", "vllm")
            if any(k.startswith(peer) for k in native)}
    dtypes = ", ".join(str(d).removeprefix("torch.") for d in config.dtypes)
    notes = [f"{config.prompts} prompts of {config.prompt_tokens} tokens, n={config.n}, {config.new_tokens} new "
             f"tokens each, T=0.8, ignore EOS; dtype {dtypes} (unsuffixed rows: the first; a suffix names the "
             f"dtype of the others); medians of {config.repeats} alternating repetitions "
             f"({', '.join(side.runs)}, ...) in one process.",
             "Every tts repetition re-prefills its prompts (prefill is part of the time, as for HF); "
             "the prompt blocks are shared by the 4 forks of each prompt.",
             "Prompts: a MATH-500 problem, then the statements of the following problems as earlier steps.",
             "Each side at its best dtype: " + ", ".join(f"{peer} {r:.1f} tok/s ({k})" for peer, (r, k) in best.items())
             + "".join(f"; {ours} / {peer} {best[ours][0] / best[peer][0]:.2f}x"
                       for ours in ("tts_onednn", "tts_prepacked", "tts_streamed") if ours in best
                       for peer in ("hf", "vllm") if peer in best) + ".",
             *_avx2_notes(side, rates),
             "The profile that motivated the CPU kernel: `py-spy record -o beam.svg -- .venv/bin/tts beam "
             "--dataset math500 --limit 1 --num-iterations 4 --no-sort-completed --attention-backend torch` "
             "(drop the last option for the kernel); issue 15 measured `gather_kv` at 26% and the attention "
             "over its copies at 21% of such a run."]
    path = write_report("beam_decode", "Beam-shaped decode: tts attention switches vs HF (and vLLM)", command,
                        summary, rows, notes)
    return str(path)


# -- attention alone ---------------------------------------------------------------------

@dataclass(frozen=True)
class LayerShape:
    name: str
    heads: int
    kv_heads: int
    head_dim: int
    dtype: torch.dtype = torch.float32
    window: int | None = None


def _beam_batch(shape: LayerShape, prompt: int, suffixes: list[int], groups: int, chunk: int = 1):
    """`groups` prompts of `prompt` tokens with one fork per suffix (fork 0 owns the prompt's
    blocks, the others share its full blocks), random K/V in a shuffled paged pool. chunk > 1:
    each sequence is a prefill chunk of that many tokens instead of a decode."""
    from tts_runtime.executor.batch import AttentionMetadata

    bs, gen = 16, torch.Generator().manual_seed(0)
    tables: list[list[int]] = []
    ids = iter(torch.randperm(groups * (prompt + max(suffixes)) // bs * len(suffixes) + 64, generator=gen).tolist())
    for _ in range(groups):
        first = len(tables)
        for i, suffix in enumerate(suffixes):
            shared = tables[first][: prompt // bs] if i else []
            tables.append(shared + [next(ids) for _ in range(-(-(prompt + suffix) // bs) - len(shared))])
    lens = [prompt + s for _ in range(groups) for s in suffixes]
    width = max(len(t) for t in tables)
    table = torch.tensor([t + [0] * (width - len(t)) for t in tables], dtype=torch.int32)
    num_blocks = int(table.max()) + 1
    k = torch.randn(num_blocks, bs, shape.kv_heads, shape.head_dim, generator=gen).to(shape.dtype)
    v = torch.randn(num_blocks, bs, shape.kv_heads, shape.head_dim, generator=gen).to(shape.dtype)
    empty = torch.zeros(1, width, dtype=torch.int32)
    if chunk == 1:
        meta = AttentionMetadata(torch.zeros(0, dtype=torch.long), len(lens), table,
                                 torch.tensor(lens, dtype=torch.int32), [], [], [], empty, bs)
    else:
        meta = AttentionMetadata(torch.zeros(0, dtype=torch.long), 0, empty, torch.zeros(0, dtype=torch.int32),
                                 [i * chunk for i in range(len(lens))], [chunk] * len(lens), lens, table, bs)
    query = torch.randn(len(lens) * chunk, shape.heads, shape.head_dim, generator=gen).to(shape.dtype)
    return query, k, v, meta


def bench_attention(repeats: int) -> tuple[list[dict], dict]:
    """One layer's attention at beam search's shapes, the three CPU paths alternating; the
    kernel takes bf16 dot products unless a row turns them off."""
    from tts_runtime.executor.attention.attention import TorchAttention
    from tts_runtime.executor.cpu.cpu_attention import CpuPagedAttention, load_kernel

    smollm, gemma = LayerShape("SmolLM2-135M layer", 9, 3, 64), LayerShape("Gemma-3-270M global layer", 4, 1, 256)
    smollm_bf16 = LayerShape("SmolLM2-135M layer", 9, 3, 64, torch.bfloat16)
    workloads = [
        ("decode: 4 prompts x 4 beams, 1500 shared + 120-150 own tokens", smollm, dict(chunk=1)),
        ("decode, few-lane loops off", smollm, dict(chunk=1, few_lanes=False)),
        ("decode, next-item prefetch off", smollm, dict(chunk=1, prefetch_next_item=False)),
        ("decode at the search's shape: 16 prompts x 4 beams, 200 shared + 150-250 own tokens", smollm,
         dict(chunk=1, groups=16, prompt=200, suffixes=[150, 200, 250, 180])),
        ("search's shape, few-lane loops off", smollm,
         dict(chunk=1, groups=16, prompt=200, suffixes=[150, 200, 250, 180], few_lanes=False)),
        ("search's shape, next-item prefetch off", smollm,
         dict(chunk=1, groups=16, prompt=200, suffixes=[150, 200, 250, 180], prefetch_next_item=False)),
        ("decode, bf16 cache", smollm_bf16, dict(chunk=1)),
        ("decode, bf16 cache, bf16 dot products off", smollm_bf16, dict(chunk=1, bf16_dot=False)),
        ("PRM score: 4 beams x 64-token chunks over a shared 1500", gemma, dict(chunk=64, groups=1)),
        ("prefill: one 1500-token prompt, nothing cached", smollm_bf16,
         dict(chunk=1500, groups=1, prompt=0, suffixes=[1500])),
    ]
    kernel = load_kernel()
    # The AVX2 build (-march=x86-64-v3, what a CPU without AVX-512 runs) beside this one's.
    avx2 = None
    if cpu_features.has("avx2") and cpu_features.has("fma") and cpu_features.march() != "x86-64-v3":
        avx2 = load_kernel("x86-64-v3")
    rows, raw = [], {}
    for label, shape, extra in workloads:
        query, k, v, meta = _beam_batch(shape, extra.get("prompt", 1500), extra.get("suffixes", [130, 140, 120, 150]),
                                        extra.get("groups", 4), extra["chunk"])
        # Each call reads the next of 30 copies, as the 30 layers of a forward do: K/V come from
        # memory, not from the cache the previous call left them in.
        pools = [(k.clone(), v.clone()) for _ in range(30)]
        switches = {name: extra.get(name, True) for name in ("bf16_dot", "few_lanes", "prefetch_next_item")}
        backends = {"torch": TorchAttention(), "kernel": CpuPagedAttention(kernel, cascade=False, **switches),
                    "cascade": CpuPagedAttention(kernel, cascade=True, **switches)}
        if avx2 is not None:
            backends["avx2"] = CpuPagedAttention(avx2, cascade=True, **switches)
        times: dict[str, list[float]] = {name: [] for name in backends}
        calls = 0
        for _ in range(repeats):
            for name, backend in backends.items():
                k, v = pools[calls % len(pools)]
                calls += 1
                if isinstance(backend, CpuPagedAttention):  # an engine plans once per forward, for all layers
                    backend._plan_for = None
                    backend.plan(meta, query.shape[0])
                start = time.perf_counter()
                backend.attend(query, k, v, meta, shape.head_dim ** -0.5, shape.window, None)
                times[name].append(time.perf_counter() - start)
        med = {name: statistics.median(t) * 1e3 for name, t in times.items()}
        raw[label] = times
        rows.append({"workload": f"{label} ({shape.name}, {str(shape.dtype).removeprefix('torch.')})",
                     "torch (gather + SDPA)": f"{med['torch']:.2f} ms",
                     "kernel, cascade off": f"{med['kernel']:.2f} ms ({med['torch'] / med['kernel']:.2f}x)",
                     "kernel, cascade on": f"{med['cascade']:.2f} ms ({med['torch'] / med['cascade']:.2f}x)"})
        if avx2 is not None:
            rows[-1]["AVX2 build (x86-64-v3), cascade on"] = (f"{med['avx2']:.2f} ms "
                                                            f"({med['torch'] / med['avx2']:.2f}x)")
    return rows, raw


def run_attention_bench(repeats: int, command: str) -> str:
    rows, raw = bench_attention(repeats)
    notes = [f"One attention call per backend in turn (torch, kernel, kernel with cascade, and where this CPU "
             f"has AVX2 the kernel built for -march=x86-64-v3 as a CPU without AVX-512 builds it, cascade on; "
             f"tts's CPU features here: {cpu_features.describe()}), {repeats} rounds, "
             "medians; the kernel's plan is built before each call and not timed (an engine builds it once per "
             "forward and shares it among the layers).",
             "Random K/V in a shuffled paged pool; the 4 forks of a prompt share its 93 full blocks. Each "
             "call reads the next of 30 copies of the pool (as the 30 layers of a forward do), so K/V come "
             "from memory; bf16 dot products, few-lane loops and next-item prefetches on (the engine's defaults) "
             "unless the row says otherwise."]
    path = write_report("beam_attention", "Beam-shaped attention, one layer: torch backend vs the CPU kernel",
                        command, {"raw_seconds": raw}, rows, notes)
    return str(path)
