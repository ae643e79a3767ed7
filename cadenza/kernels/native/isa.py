"""Instruction-set levels the native kernels are built for, and what a build for each uses.

A *level* names the ``-march`` the loader compiles a library with; the sources branch on the
compiler's predefined macros (``cpu_vector.h``, ``cpu_product.h``), so each level is another
kernel:

==============  ===================  ============================================================
level           flags                what the kernels compile to
==============  ===================  ============================================================
``native``      ``-march=native``    whatever this CPU has: AVX-512 with BF16 dot products, AMX
                                     tiles, NEON... (the default)
``x86-64-v4``   ``-march=x86-64-v4`` AVX-512 F/BW/DQ/VL: 16 lanes, bf16 weights widened exactly
``x86-64-v3``   ``-march=x86-64-v3`` AVX2 and FMA: 8 lanes, bf16 weights widened exactly
==============  ===================  ============================================================

:func:`probe` asks the compiler which macros a level defines (``c++ -march=x86-64-v3 -dM -E -``)
and names the build's ISA from them (:func:`isa_of`: the widest of AMX, AVX512-BF16, AVX-512,
AVX2, AVX, SSE, NEON), and which of the instructions it would use this CPU lacks (from
``/proc/cpuinfo``): a library built for such a level is not loaded, it would stop at its first
such instruction.
"""

from __future__ import annotations

import functools
import platform
import subprocess
from dataclasses import dataclass

from cadenza.contract.native_kernels import NativeIsa

LEVEL_ENV = "CADENZA_NATIVE_ISA"  # the level kernels are loaded for when no caller names one
DEFAULT_LEVEL = "native"
LEVELS: dict[str, tuple[str, ...]] = {
    "native": ("-march=native",),
    "x86-64-v4": ("-march=x86-64-v4",),
    "x86-64-v3": ("-march=x86-64-v3",),
}
_X86_LEVELS = ("x86-64-v4", "x86-64-v3")
_X86_MACHINES = ("x86_64", "amd64")

# Predefined macro -> the /proc/cpuinfo flag of the same instructions (x86-64; what the
# levels above enable).
_CPU_FLAG_OF_MACRO = {
    "__SSE4_2__": "sse4_2",
    "__AVX__": "avx",
    "__AVX2__": "avx2",
    "__FMA__": "fma",
    "__F16C__": "f16c",
    "__BMI__": "bmi1",
    "__BMI2__": "bmi2",
    "__LZCNT__": "abm",
    "__MOVBE__": "movbe",
    "__AVX512F__": "avx512f",
    "__AVX512BW__": "avx512bw",
    "__AVX512CD__": "avx512cd",
    "__AVX512DQ__": "avx512dq",
    "__AVX512VL__": "avx512vl",
    "__AVX512BF16__": "avx512_bf16",
    "__AMX_TILE__": "amx_tile",
    "__AMX_BF16__": "amx_bf16",
}
# The x86 instruction sets the kernels branch on, widest first (AMX needs two macros).
_X86_WIDEST_FIRST: tuple[tuple[str, NativeIsa], ...] = (
    ("__AVX512BF16__", "avx512bf16"),
    ("__AVX512F__", "avx512f"),
    ("__AVX2__", "avx2"),
    ("__AVX__", "avx"),
)


@dataclass(frozen=True)
class Build:
    """What a build for ``level`` uses: ``isa`` (:func:`isa_of`) and ``missing``, the CPU
    features it would use that this CPU lacks (empty: this CPU runs it, or cannot tell)."""

    level: str
    isa: NativeIsa
    missing: tuple[str, ...] = ()


def cpu_flags_line() -> str:
    """The CPU's feature flags as ``/proc/cpuinfo`` lists them (``""`` where it does not)."""
    try:
        with open("/proc/cpuinfo") as cpuinfo:
            for line in cpuinfo:
                if line.startswith(("flags", "Features")):
                    return line
    except OSError:
        pass
    return ""


def cpu_flags() -> frozenset[str] | None:
    """The CPU's feature flags; ``None`` where this machine does not list them."""
    line = cpu_flags_line()
    return frozenset(line.split(":", 1)[1].split()) if ":" in line else None


def predefined_macros(compiler: str, flags: tuple[str, ...]) -> frozenset[str]:
    """The macros ``compiler`` predefines for C++ under ``flags``. Raises ``RuntimeError``
    (with the compiler's message) when it refuses them."""
    result = subprocess.run(
        [compiler, *flags, "-x", "c++", "-dM", "-E", "-"],
        input="",
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    if result.returncode != 0:
        raise RuntimeError(f"{compiler} {' '.join(flags)} failed: {result.stderr.strip()[-500:]}")
    return frozenset(
        parts[1]
        for parts in (line.split() for line in result.stdout.splitlines())
        if len(parts) >= 2 and parts[0] == "#define"
    )


def isa_of(macros: frozenset[str]) -> NativeIsa:
    """The widest instruction set the kernels branch on that ``macros`` enable."""
    if "__AMX_TILE__" in macros and "__AMX_BF16__" in macros:
        return "amx"
    for macro, name in _X86_WIDEST_FIRST:
        if macro in macros:
            return name
    if "__ARM_NEON" in macros or "__ARM_NEON__" in macros:
        return "neon"
    return "sse" if "__SSE2__" in macros else "generic"


@functools.cache
def probe(compiler: str, level: str) -> Build:
    """What ``compiler``'s build for ``level`` uses on this machine. Raises ``ValueError`` for
    a level not in :data:`LEVELS`, ``RuntimeError`` when the compiler cannot build for it."""
    if level not in LEVELS:
        raise ValueError(f"unknown level {level!r}; levels: {', '.join(LEVELS)}")
    if level in _X86_LEVELS and platform.machine().lower() not in _X86_MACHINES:
        return Build(level, "", (f"x86-64 (this CPU is {platform.machine()})",))
    macros = predefined_macros(compiler, LEVELS[level])
    missing: tuple[str, ...] = ()
    flags = cpu_flags()
    # A native build uses what the compiler found on this CPU: nothing to check.
    if level != "native" and flags is not None:
        used = (flag for macro, flag in _CPU_FLAG_OF_MACRO.items() if macro in macros)
        missing = tuple(sorted(flag for flag in used if flag not in flags))
    return Build(level, isa_of(macros), missing)
