"""Which native CPU kernels an engine runs, as it announces them (``EngineInfo.native_kernels``).

Each library of the kernels' table (:mod:`cadenza.kernels.native.entry_points`) is either
loaded, built for an instruction-set *level* (``native``: whatever this CPU has; ``x86-64-v3``:
AVX2 and FMA, ...) and using an *ISA* (the widest instruction set its build compiled to), or
not, with the reason. The engine fills these from its loader; the edge shows them in
``/readyz`` and ``/metrics`` and never works them out itself. The wording of the one-line
summary (the engine's log, ``/readyz``) lives here, so both say the same thing.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Annotated, Literal

from pydantic import Field

NativeKernelStatus = Literal[
    "loaded",  # built (or found built) and loaded: its entry points are in use
    "no_compiler",  # no C++ compiler on this machine ($CXX, c++, g++, clang++)
    "build_failed",  # the compiler refused the source (or the level's flags)
    "load_failed",  # built, but the library or one of its entry points would not load
    "cpu_lacks",  # the level needs instructions this CPU does not have
    "unknown_level",  # the level asked for ($CADENZA_NATIVE_ISA) is not one the loader knows
]
# The ISA names a build may report, widest first; "" where nothing was built.
NativeIsa = Literal["amx", "avx512bf16", "avx512f", "avx2", "avx", "sse", "neon", "generic", ""]

NO_COMPILER_NOTE = "no C++ compiler: native kernels off, CPU work on torch paths (slower)"


@dataclass(frozen=True)
class NativeKernel:
    """One kernel library. ``library``: its name in the table (``cpu_elu``); ``level``: the
    instruction-set level it was asked for; ``isa``: what its build uses (``""`` when there
    is no build); ``detail``: why it is not loaded (the compiler's message, the missing
    instructions), empty when it is."""

    library: Annotated[str, Field(min_length=1, max_length=64)]
    level: Annotated[str, Field(min_length=1, max_length=64)]
    status: NativeKernelStatus
    isa: NativeIsa = ""
    detail: Annotated[str, Field(max_length=2000)] = ""

    @property
    def loaded(self) -> bool:
        return self.status == "loaded"


def compiler_missing(kernels: Sequence[NativeKernel]) -> bool:
    """Whether every kernel is off for want of a C++ compiler."""
    return bool(kernels) and all(k.status == "no_compiler" for k in kernels)


def summary(kernels: Sequence[NativeKernel]) -> str:
    """One line: how many kernels loaded, for which level and ISA, and why the others did
    not (:data:`NO_COMPILER_NOTE` when there is no compiler at all)."""
    if not kernels:
        return "no native kernels reported"
    if compiler_missing(kernels):
        return NO_COMPILER_NOTE
    loaded = [k for k in kernels if k.loaded]
    builds = sorted({f"{k.level} ({k.isa})" for k in loaded})
    line = f"native kernels: {len(loaded)} of {len(kernels)} loaded"
    if builds:
        line += f" for {', '.join(builds)}"
    failed = [f"{k.library} {k.status}" for k in kernels if not k.loaded]
    if failed:
        line += "; off, on torch paths (slower): " + ", ".join(failed)
    return line
