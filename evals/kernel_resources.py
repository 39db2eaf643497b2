"""Every Triton kernel of tts compiled for a GPU on any machine, with what each build uses.

`python -m evals.kernel_resources` compiles the attention kernels
(executor/attention/triton_attention.py) and the fused layer ops (models/fused_ops.py) for
sm_90 at the shapes and launch configurations tts picks: the seed models' head sizes and
widths, each dtype. It needs no GPU or driver, because the triton wheel bundles ptxas. It
prints one row per build: registers per thread, stack bytes (register spills), shared memory
and SASS instructions, read with the bundled cuobjdump. A kernel that does not compile ends
the command with its error.

The interpreter (TRITON_INTERPRET=1, how the CPU tests run the kernels) accepts code that the
compiler rejects, and it cannot show spills. Run this after changing a kernel. The tests
run it too (tests/executor/attention/test_triton_attention.py, tests/executor/test_gpu_path.py).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import re
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator

# Decided when triton is first imported: this module needs the compiler, not the interpreter.
if os.environ.get("TRITON_INTERPRET"):
    sys.exit("error: TRITON_INTERPRET is set; the kernels are compiled, not interpreted: unset it")

import torch  # noqa: E402
import triton  # noqa: E402
from triton import knobs  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

import tts_runtime.executor.attention.triton_attention as attention  # noqa: E402
import tts_runtime.models.fused_ops as fused  # noqa: E402
from tts_runtime.models.triton_options import LAUNCH_OPTIONS  # noqa: E402

GROUPS = ("attention", "fused")
_TYPES = {torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16"}
# Attention: (dtype, head_dim, query heads per KV head, sliding window, softcap, decode splits).
ATTENTION_SHAPES = ((torch.bfloat16, 256, 4, True, False, 4), (torch.float16, 128, 4, False, True, 1),
                    (torch.bfloat16, 64, 3, True, True, 1), (torch.float32, 64, 4, True, True, 2))
# Fused ops: (hidden or head size, Gemma-style norm); (intermediate size, activation);
# (query heads, KV heads, head_dim). The seed models' and the demo models' shapes.
NORM_SHAPES = ((2048, False), (4096, False), (576, False), (640, True), (256, True), (64, False))
MLP_SHAPES = ((8192, 0), (14336, 0), (1536, 0), (2048, 1))
ROTARY_SHAPES = ((32, 8, 64), (32, 8, 128), (9, 3, 64), (4, 1, 256))


@dataclasses.dataclass(frozen=True)
class Build:
    kernel: str
    config: str
    num_warps: int
    cubin: bytes


@dataclasses.dataclass(frozen=True)
class Resources:
    registers: int
    stack_bytes: int
    shared_bytes: int
    sass_instructions: int


def _compile(fn: triton.runtime.JITFunction, arg_type: Callable[[str], str], constants: dict,
             num_warps: int, config: str, arch: int) -> Build:
    signature = {arg: "constexpr" if arg in constants else arg_type(arg) for arg in fn.arg_names}
    kernel = triton.compile(ASTSource(fn, signature, constexprs=constants), target=GPUTarget("cuda", arch, 32),
                            options=dict(num_warps=num_warps, **LAUNCH_OPTIONS))
    return Build(fn.__name__, config, num_warps, kernel.asm["cubin"])


_ATTENTION_POINTERS = {"block_tables": "*i32", "context_lens": "*i32", "tiles": "*i32", "slot_mapping": "*i64",
                       "part_acc": "*fp32", "part_m": "*fp32", "part_l": "*fp32", "tables": "*i32",
                       "items": "*i32", "rows": "*i32", "parts_ptr": "*i32", "parts": "*i32"}
_ATTENTION_DATA = ("query", "key", "value", "k_cache", "v_cache", "out")


def attention_builds(arch: int = 90) -> Iterator[Build]:
    """Each attention kernel at each of ATTENTION_SHAPES, with TritonAttention's tile sizes."""
    for dtype, head_dim, group, window, softcap, splits in ATTENTION_SHAPES:
        def arg_type(arg: str) -> str:
            if arg in _ATTENTION_POINTERS:
                return _ATTENTION_POINTERS[arg]
            if arg in _ATTENTION_DATA:
                return "*" + _TYPES[dtype]
            return "fp32" if arg in ("scale", "softcap") else "i32"  # strides, window

        block_m, block_n, warps = attention.TritonAttention().tile_sizes(head_dim, dtype)
        config = (f"{_TYPES[dtype]} d={head_dim} group={group}" + (" window" if window else "")
                  + (" softcap" if softcap else ""))
        common = dict(GROUP=group, HEAD_DIM=head_dim, BLOCK_SIZE=16, USE_WINDOW=window, USE_SOFTCAP=softcap,
                      BLOCK_N=block_n, BLOCK_D=head_dim, F32_DOT=False,
                      PRECISION="ieee" if dtype == torch.float32 else None)
        block_g = triton.next_power_of_2(group)
        yield _compile(attention.decode_kernel, arg_type, dict(common, NUM_SPLITS=splits, BLOCK_G=16), warps,
                       f"{config} splits={splits}", arch)
        yield _compile(attention.prefill_kernel, arg_type, dict(common, BLOCK_M=block_m), warps, config, arch)
        if splits > 1:
            yield _compile(attention.decode_reduce_kernel, arg_type,
                           dict(NUM_HEADS=group, HEAD_DIM=head_dim, NUM_SPLITS=splits, BLOCK_S=splits,
                                BLOCK_D=head_dim), 4, f"{config} splits={splits}", arch)
        yield _compile(attention.cascade_kernel, arg_type,
                       dict(common, NUM_HEADS=group, BLOCK_R=max(1, 64 // block_g), BLOCK_G=block_g), warps,
                       config, arch)
        yield _compile(attention.cascade_merge_kernel, arg_type,
                       dict(NUM_HEADS=group, HEAD_DIM=head_dim, BLOCK_D=head_dim), 4, config, arch)
        yield _compile(attention.store_kv_kernel, arg_type,
                       dict(NUM_KV_HEADS=2, HEAD_DIM=head_dim, BLOCK_SIZE=16, BLOCK_H=2, BLOCK_D=head_dim), 4,
                       config, arch)


_FUSED_POINTERS = {"x", "weight", "out", "gate_up", "q", "k", "cos", "sin"}


def fused_builds(arch: int = 90) -> Iterator[Build]:
    """Each fused layer op at the shapes above, with fused_ops' launch configurations."""
    for ty in ("bf16", "fp32"):
        def arg_type(arg: str) -> str:
            return "*" + ty if arg in _FUSED_POINTERS else "fp32" if arg == "eps" else "i32"

        for dim, gemma in NORM_SHAPES:
            block = triton.next_power_of_2(dim)
            yield _compile(fused.rms_norm_kernel, arg_type, dict(DIM=dim, GEMMA=gemma, BLOCK=block),
                           fused.warps_for(block), f"{ty} dim={dim}" + (" gemma" if gemma else ""), arch)
        for intermediate, activation in MLP_SHAPES:
            block = min(1024, triton.next_power_of_2(intermediate))
            yield _compile(fused.act_and_mul_kernel, arg_type,
                           dict(INTERMEDIATE=intermediate, ACTIVATION=activation, BLOCK=block), 4,
                           f"{ty} intermediate={intermediate} activation={activation}", arch)
        for heads, kv_heads, head_dim in ROTARY_SHAPES:
            half = head_dim // 2
            yield _compile(fused.rotary_kernel, arg_type,
                           dict(NUM_Q_HEADS=heads, NUM_K_HEADS=kv_heads, HALF=half,
                                BLOCK_HQ=triton.next_power_of_2(heads), BLOCK_HK=triton.next_power_of_2(kv_heads),
                                BLOCK_HALF=triton.next_power_of_2(half)), 4,
                           f"{ty} heads={heads}/{kv_heads} d={head_dim}", arch)


def resources(cubin: bytes) -> Resources | None:
    """What the build uses, from the bundled cuobjdump; None where the wheel has none."""
    tool = knobs.nvidia.cuobjdump.path
    if not tool or not os.path.exists(tool):
        return None
    with tempfile.NamedTemporaryFile(suffix=".cubin") as file:
        file.write(cubin)
        file.flush()
        usage = subprocess.run([tool, "-res-usage", file.name], capture_output=True, text=True, check=True).stdout
        sass = subprocess.run([tool, "-sass", file.name], capture_output=True, text=True, check=True).stdout
    fields = dict(re.findall(r"(REG|STACK|SHARED):(\d+)", usage))
    instructions = sum(1 for line in sass.splitlines() if re.match(r"\s+/\*[0-9a-f]{4,}\*/", line))
    return Resources(int(fields["REG"]), int(fields["STACK"]), int(fields["SHARED"]), instructions)


def _markdown_row(build: Build, used: Resources | None) -> str:
    cells = ("?",) * 4 if used is None else (used.registers, used.stack_bytes, used.shared_bytes,
                                             used.sass_instructions)
    return f"| {build.kernel} | {build.config} | {build.num_warps} | " + " | ".join(map(str, cells)) + " |"


def _json_row(build: Build, used: Resources | None) -> str:
    """One build as a JSON line; the resources are null where the wheel has no cuobjdump."""
    return json.dumps(dict(kernel=build.kernel, config=build.config, num_warps=build.num_warps,
                           **(dataclasses.asdict(used) if used is not None
                              else dict.fromkeys(f.name for f in dataclasses.fields(Resources)))))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", choices=GROUPS, help="only the attention kernels or only the fused ops")
    parser.add_argument("--arch", type=int, default=90, help="CUDA compute capability, e.g. 90 (H100/H200), 80")
    parser.add_argument("--json", action="store_true",
                        help="one JSON object per build and line, for scripts (default: a markdown table)")
    args = parser.parse_args(argv)
    groups = {"attention": attention_builds, "fused": fused_builds}
    if not args.json:
        print("| kernel | config | warps | registers | stack (spills), bytes | shared, bytes | SASS instructions |\n"
              "|---|---|---|---|---|---|---|")
    row = _json_row if args.json else _markdown_row
    for group in ([args.only] if args.only else GROUPS):
        for build in groups[group](args.arch):
            print(row(build, resources(build.cubin)), flush=True)
    if not args.json:
        print(f"compiled every kernel for sm_{args.arch}")


if __name__ == "__main__":
    main()
