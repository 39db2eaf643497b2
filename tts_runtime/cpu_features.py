"""What this CPU can run, as tts sees it: every CPU feature check in tts goes through `has`,
and the C++ kernels are built for `march()`.

`TTS_CPU_FEATURES` hides features, to run and test the paths of a smaller CPU on a bigger one:

* `native` (the default): what the CPU has; kernels built with -march=native.
* `avx2`: AVX2 and FMA, no AVX-512 (x86-64-v3, e.g. AMD Zen 1-3, Intel Haswell to Alder
  Lake): AVX-512, AVX512-BF16 and AMX are hidden and the kernels built with -march=x86-64-v3.
* `avx512`: AVX-512 F/BW/CD/DQ/VL without AVX512-BF16 or AMX (x86-64-v4, e.g. Intel Skylake-X).

It hides features from tts only (the dtype `auto` picks, the kernels built and used); torch's
own kernels follow `ATEN_CPU_CAPABILITY=avx2` and oneDNN's `ONEDNN_MAX_CPU_ISA=AVX2`, which
must be set before torch starts (`make test` sets all three for its AVX2 run). A level above
what the CPU has hides nothing and adds nothing; its kernels would not run here.
"""

from __future__ import annotations

import functools
import hashlib
import os
import re

ENV = "TTS_CPU_FEATURES"

# Level -> (-march, the features it keeps).
_AVX2 = frozenset({"avx", "avx2", "fma", "f16c", "bmi1", "bmi2", "movbe"})
_AVX512 = _AVX2 | {"avx512f", "avx512bw", "avx512cd", "avx512dq", "avx512vl"}
LEVELS: dict[str, tuple[str, frozenset[str]]] = {"avx2": ("x86-64-v3", _AVX2), "avx512": ("x86-64-v4", _AVX512)}
# The environment of a process started to run as an AVX2 CPU would: tts's level and torch's
# and oneDNN's own limits (the Makefile's AVX2 test pass sets the same three).
AVX2_ENVIRONMENT = {ENV: "avx2", "ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2"}

# /proc/cpuinfo flags that name instruction sets -march can enable (the cache key's input).
_ISA_FLAG = re.compile(r"^(sse|ssse3|avx|fma|f16c|bmi|amx|adx|popcnt|movbe|abm|lzcnt|aes|pclmul|sha_ni|gfni|"
                       r"vaes|vpclmul|xsave|rdrand|rdseed|clflushopt|clwb|prefetchw|serialize|wbnoinvd)")
# Which features a level hides (the rest of the CPU's flags stay: sse, popcnt ...).
_HIDDEN = re.compile(r"^(avx|fma|f16c|bmi|amx|movbe)")


class CpuFeaturesError(ValueError):
    """TTS_CPU_FEATURES names no level."""


def level() -> str:
    """`native`, or the level TTS_CPU_FEATURES names."""
    value = os.environ.get(ENV, "").strip().lower() or "native"
    if value != "native" and value not in LEVELS:
        raise CpuFeaturesError(f"{ENV}={value!r}: choose native, {', '.join(LEVELS)}")
    return value


@functools.cache
def native_features() -> frozenset[str]:
    """The CPU's feature flags, as /proc/cpuinfo names them (avx2, avx512f, avx512_bf16,
    amx_tile ...); where there is no /proc/cpuinfo, the few torch can tell."""
    try:
        with open("/proc/cpuinfo") as info:
            for line in info:
                if line.startswith("flags"):
                    return frozenset(line.split(":", 1)[1].split())
    except OSError:
        pass
    import torch

    flags: set[str] = set()
    capability = torch.backends.cpu.get_cpu_capability()
    if capability in ("AVX2", "AVX512"):
        flags |= {"avx", "avx2", "fma"}
    if capability == "AVX512":
        flags |= {"avx512f", "avx512bw", "avx512cd", "avx512dq", "avx512vl"}
    if torch.cpu._is_avx512_bf16_supported():
        flags.add("avx512_bf16")
    if getattr(torch.cpu, "_is_amx_tile_supported", lambda: False)():
        flags.add("amx_tile")
    return frozenset(flags)


def features() -> frozenset[str]:
    """The CPU's features less those TTS_CPU_FEATURES hides."""
    native = native_features()
    name = level()
    if name == "native":
        return native
    return frozenset(f for f in native if not _HIDDEN.match(f) or f in LEVELS[name][1])


def has(feature: str) -> bool:
    """Whether tts may use `feature` (a /proc/cpuinfo flag name: avx2, avx512f, avx512_bf16, amx_tile)."""
    return feature in features()


def march() -> str:
    """The -march the C++ kernels are built for: native, or the level's x86-64-vN."""
    name = level()
    return "native" if name == "native" else LEVELS[name][0]


def isa_key(target: str | None = None) -> str:
    """Names the instruction set the kernels are built for (`target`, default `march()`), for
    their cache folder: the -march, and for native a hash of the CPU's instruction-set flags
    (a cache shared by two CPUs must not hand one the other's AVX-512 binary)."""
    name = target or march()
    if name != "native":
        return name
    flags = sorted(f for f in native_features() if _ISA_FLAG.match(f))
    return "native-" + hashlib.sha1(" ".join(flags).encode()).hexdigest()[:8]


def describe() -> str:
    """One line for logs: the level and the features that matter to tts."""
    shown = [f for f in ("avx2", "fma", "avx512f", "avx512_bf16", "amx_tile") if has(f)]
    return f"{level()} (-march={march()}): {' '.join(shown) or 'no AVX2'}"
