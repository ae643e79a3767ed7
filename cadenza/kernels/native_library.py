"""Native kernels: a C++ source shipped with cadenza, compiled once per machine and loaded
through ``ctypes``.

The library is built with the system's C++ compiler (``$CXX``, else ``c++``, ``g++`` or
``clang++``) at ``-O3 -march=native`` into ``$XDG_CACHE_HOME/cadenza/native`` (default
``~/.cache/cadenza/native``), named by a hash of the source (and the headers beside it), the
compiler's version, the flags and the CPU's feature flags, so a changed source, compiler or
machine builds anew and processes that start together share one build (written to a
temporary name, then renamed). Building takes a second or two; loading a cached build, milliseconds.

No compiler, a failed build or a library that does not load is not an error: :func:`load`
returns ``None`` and logs why once, and callers keep their torch path.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import logging
import os
import platform
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

FLAGS = ("-O3", "-march=native", "-std=c++17", "-shared", "-fPIC", "-fno-math-errno")
# Tried first, dropped if the compiler refuses them (a clang without OpenMP): the kernels then
# run on the calling thread.
OPTIONAL_FLAGS = ("-fopenmp",)
BUILD_TIMEOUT_S = 300
_COMPILERS = ("c++", "g++", "clang++")


def cache_dir() -> Path:
    root = os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache")
    return Path(root) / "cadenza" / "native"


def find_compiler() -> str | None:
    """``$CXX`` when set, else the first C++ compiler on ``PATH``."""
    configured = os.environ.get("CXX")
    if configured:
        return shutil.which(configured)
    for name in _COMPILERS:
        found = shutil.which(name)
        if found:
            return found
    return None


def _cpu_flags() -> str:
    """The CPU's feature flags (what ``-march=native`` compiles for)."""
    try:
        with open("/proc/cpuinfo") as cpuinfo:
            for line in cpuinfo:
                if line.startswith(("flags", "Features")):
                    return line
    except OSError:
        pass
    return platform.processor()


def _source_bytes(source: Path) -> bytes:
    """``source`` and the headers beside it (every kernel includes the shared ones)."""
    headers = sorted(source.parent.glob("*.h"))
    return b"".join(path.read_bytes() for path in (source, *headers))


def source_digest(source_name: str) -> str:
    """A short hash of ``cadenza/kernels/<source_name>`` and the kernels' headers (what
    calibrations of the code built from them are keyed by)."""
    return hashlib.sha256(_source_bytes(Path(__file__).with_name(source_name))).hexdigest()[:16]


def library_path(source: Path, compiler: str) -> Path:
    """Where the build of ``source`` by ``compiler`` for this machine lives."""
    version = subprocess.run(
        [compiler, "--version"], capture_output=True, text=True, timeout=30, check=False
    ).stdout
    digest = hashlib.sha256()
    for part in (
        _source_bytes(source),
        version.encode(),
        " ".join(FLAGS + OPTIONAL_FLAGS).encode(),
    ):
        digest.update(part)
    digest.update(f"{platform.machine()} {_cpu_flags()}".encode())
    return cache_dir() / f"{source.stem}-{digest.hexdigest()[:16]}.so"


def build(source: Path, compiler: str, target: Path) -> None:
    """Compile ``source`` to ``target`` (atomically). Raises ``RuntimeError`` with the
    compiler's message when it fails."""
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, partial = tempfile.mkstemp(suffix=".so", dir=target.parent)
    os.close(fd)
    try:
        for flags in ((*FLAGS, *OPTIONAL_FLAGS), FLAGS):
            result = subprocess.run(
                [compiler, *flags, str(source), "-o", partial],
                capture_output=True,
                text=True,
                timeout=BUILD_TIMEOUT_S,
                check=False,
            )
            if result.returncode == 0:
                break
        if result.returncode != 0:
            raise RuntimeError(f"{compiler} failed: {result.stderr.strip()[-2000:]}")
        os.replace(partial, target)
    finally:
        if os.path.exists(partial):
            os.unlink(partial)


@functools.cache
def load(source_name: str) -> ctypes.CDLL | None:
    """The library built from ``cadenza/kernels/<source_name>``, built now if this machine
    has no build of it yet; ``None`` (logged once) when it cannot be built or loaded."""
    source = Path(__file__).with_name(source_name)
    compiler = find_compiler()
    if compiler is None:
        log.warning("no C++ compiler found: %s stays on its torch path", source_name)
        return None
    try:
        target = library_path(source, compiler)
        if not target.exists():
            log.info("building %s with %s", source_name, compiler)
            build(source, compiler, target)
        return ctypes.CDLL(str(target))
    except (OSError, RuntimeError, subprocess.SubprocessError) as exc:
        log.warning("native %s unavailable (%s): torch path", source_name, exc)
        return None


def procedure(library: ctypes.CDLL, name: str, argtypes: list[Any]) -> Any:
    """``library``'s function ``name``, declared to take ``argtypes`` and return nothing (what
    every kernel entry point does: it writes its results into buffers it is given)."""
    function = getattr(library, name)
    function.restype = None
    function.argtypes = argtypes
    return function
