"""This machine's CPU fingerprint: the architecture and the SIMD features ONNX Runtime's kernels dispatch on; and
the machine a benchmark's figures were taken on."""
from __future__ import annotations

import functools
import os
import platform
from pathlib import Path
from typing import Any

from mha_runtime.attention.optimized_records import Fingerprint

CPUINFO = Path("/proc/cpuinfo")
# The SIMD levels MLAS selects kernels by (x86: SSE4.1 ... AVX-512, VNNI, AMX; Arm: NEON dot/fp16/i8mm/bf16, SVE).
# Flags outside these (virtualisation, security mitigations, cache hints) vary between hosts of one type, so they
# are left out: they would make the fingerprint differ where the kernels do not.
X86_FLAGS = frozenset({"sse3", "pni", "ssse3", "sse4_1", "sse4_2", "avx", "avx2", "fma", "f16c", "avx_vnni",
                       "avx_vnni_int8", "avx_ne_convert"})
X86_PREFIXES = ("avx512", "amx")
ARM_FLAGS = frozenset({"asimd", "asimddp", "asimdhp", "fphp", "i8mm", "bf16", "sve", "sve2", "sme"})


def relevant_flags(words: list[str]) -> tuple[str, ...]:
    """The fingerprint's subset of a cpuinfo flags line, sorted and without repeats."""
    keep = {w for w in words if w in X86_FLAGS or w in ARM_FLAGS or w.startswith(X86_PREFIXES)}
    return tuple(sorted(keep))


def parse_cpuinfo(text: str) -> tuple[str, ...] | None:
    """The relevant flags of the first processor in /proc/cpuinfo's text (x86 `flags`, Arm `Features`), or None."""
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("flags", "Features"):
            return relevant_flags(value.split())
    return None


@functools.cache
def cpu_fingerprint() -> Fingerprint:
    """Read once per process; flags None where /proc/cpuinfo is absent or says nothing (not Linux)."""
    try:
        flags = parse_cpuinfo(CPUINFO.read_text())
    except OSError:
        flags = None
    return Fingerprint(machine=platform.machine(), cpu_flags=flags)


def machine() -> dict[str, Any]:
    """The CPU model and its SIMD flags, core count, system and Python version: what a benchmark's figures were
    taken on (two hosts both named "AMD EPYC" ran the same forms at different ratios: one had AVX-512, one AVX2)."""
    cpu = platform.processor() or platform.machine()
    try:
        text = CPUINFO.read_text()
    except OSError:
        text = ""
    cpu = next((line.split(":", 1)[1].strip() for line in text.splitlines() if line.startswith("model name")), cpu)
    flags = parse_cpuinfo(text)  # the same flags cpu_fingerprint keeps, from the one read
    return {"cpu": cpu, "cpu_flags": None if flags is None else list(flags), "cores": os.cpu_count(),
            "system": platform.platform(), "python": platform.python_version()}


def load_average() -> float | None:
    """The 1-minute load average, where the system has one: how busy the machine was around a benchmark."""
    try:
        return os.getloadavg()[0]
    except (OSError, AttributeError):
        return None
