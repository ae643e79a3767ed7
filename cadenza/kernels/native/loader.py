"""The one loader of the native kernels: builds a library of the table
(:data:`~cadenza.kernels.native.entry_points.LIBRARIES`) once per machine and instruction-set
level, loads it through ``ctypes`` and declares every entry point the table lists.

- :func:`load` gives the library (``None`` when it cannot be built or loaded: logged once,
  never an exception; callers keep their torch path), :func:`function` one declared entry
  point of it, :func:`state` whether it loaded, for which level and ISA, or why not, and
  :func:`report` that for every library of the table (what the engine announces).
- The level (:mod:`~cadenza.kernels.native.isa`): the caller's, else the one
  :func:`select_level` chose, else ``$CADENZA_NATIVE_ISA``, else ``native``. Each level is
  built and cached apart; a process may hold the same library at several levels (tests do).
- A build runs the system's C++ compiler (``$CXX``, else ``c++``, ``g++`` or ``clang++``) at
  ``-O3`` and the level's ``-march`` into ``$XDG_CACHE_HOME/cadenza/native`` (default
  ``~/.cache/cadenza/native``) as ``<library>-<level>-<hash>.so``, the hash over the source
  and the headers beside it, the compiler's version, the flags and (for ``native``) the CPU's
  feature flags: a changed source, compiler or machine builds anew, and processes that start
  together share one build (written to a temporary name, then renamed). Building takes a
  second or a few; loading a cached build, milliseconds.
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
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cadenza.contract.native_kernels import NativeIsa, NativeKernel, NativeKernelStatus
from cadenza.kernels.native import isa
from cadenza.kernels.native.entry_points import LIBRARIES

log = logging.getLogger(__name__)

SOURCES = Path(__file__).parent
FLAGS = ("-O3", "-std=c++17", "-shared", "-fPIC", "-fno-math-errno")
# Tried first, dropped if the compiler refuses them (a clang without OpenMP): the kernels then
# run on the calling thread.
OPTIONAL_FLAGS = ("-fopenmp",)
BUILD_TIMEOUT_S = 300
_COMPILERS = ("c++", "g++", "clang++")
_DETAIL_CHARS = 400  # of a compiler's message, in a reported state (the log has all of it)

_selected_level: str | None = None


def default_level() -> str:
    """The level kernels load for when a caller names none (see the module)."""
    return _selected_level or os.environ.get(isa.LEVEL_ENV) or isa.DEFAULT_LEVEL


def select_level(name: str | None) -> None:
    """Load for ``name`` from now on where callers name no level (``None``: back to
    ``$CADENZA_NATIVE_ISA`` or ``native``). Raises ``ValueError`` for an unknown level. A
    wrapper that keeps a library of its own
    (:func:`~cadenza.kernels.cpu_linear.native_linear_library`) keeps it until cleared."""
    global _selected_level
    if name is not None and name not in isa.LEVELS:
        raise ValueError(f"unknown level {name!r}; levels: {', '.join(isa.LEVELS)}")
    _selected_level = name


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


def source_path(library: str) -> Path:
    """The source of ``library`` (a name in the table). Raises ``KeyError`` for another."""
    return SOURCES / LIBRARIES[library].source


def _source_bytes(source: Path) -> bytes:
    """``source`` and the headers beside it (every kernel includes the shared ones)."""
    headers = sorted(source.parent.glob("*.h"))
    return b"".join(path.read_bytes() for path in (source, *headers))


def source_digest(library: str) -> str:
    """A short hash of ``library``'s source and the kernels' headers."""
    return hashlib.sha256(_source_bytes(source_path(library))).hexdigest()[:16]


@functools.cache
def _compiler_version(compiler: str) -> str:
    return subprocess.run(
        [compiler, "--version"], capture_output=True, text=True, timeout=30, check=False
    ).stdout


def library_path(source: Path, compiler: str, level: str = isa.DEFAULT_LEVEL) -> Path:
    """Where the build of ``source`` by ``compiler`` for ``level`` lives."""
    digest = hashlib.sha256()
    for part in (
        _source_bytes(source),
        _compiler_version(compiler).encode(),
        " ".join(FLAGS + OPTIONAL_FLAGS + isa.LEVELS[level]).encode(),
    ):
        digest.update(part)
    if level == "native":
        digest.update(f"{platform.machine()} {isa.cpu_flags_line()}".encode())
    return cache_dir() / f"{source.stem}-{level}-{digest.hexdigest()[:16]}.so"


def build(source: Path, compiler: str, target: Path, level: str = isa.DEFAULT_LEVEL) -> None:
    """Compile ``source`` for ``level`` to ``target`` (atomically). Raises ``RuntimeError``
    with the compiler's message when it fails."""
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, partial = tempfile.mkstemp(suffix=".so", dir=target.parent)
    os.close(fd)
    flags = (*FLAGS, *isa.LEVELS[level])
    try:
        for attempt in ((*flags, *OPTIONAL_FLAGS), flags):
            result = subprocess.run(
                [compiler, *attempt, str(source), "-o", partial],
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


@dataclass(frozen=True)
class _Loaded:
    library: ctypes.CDLL | None
    state: NativeKernel


def declare(library: ctypes.CDLL, name: str) -> ctypes.CDLL:
    """``library`` (a build of the table's library ``name``, loaded by :func:`load` or by
    hand) with every entry point given its table signature. Raises ``AttributeError`` for one
    the library does not export."""
    for entry in LIBRARIES[name].entry_points:
        function = getattr(library, entry.name)
        function.argtypes = list(entry.argtypes)
        function.restype = entry.restype
    return library


@functools.cache
def _warn_once(message: str) -> None:
    log.warning("%s", message)


def _off(
    library: str, level: str, status: NativeKernelStatus, detail: str, built_isa: NativeIsa = ""
) -> _Loaded:
    """Not loaded, and why (logged: the compiler's whole message; reported: its tail)."""
    if status == "no_compiler":
        _warn_once(f"no C++ compiler found: native kernels stay off ({detail})")
    else:
        log.warning("native %s (%s) unavailable (%s): torch path", library, level, detail)
    short = " ".join(detail.split())[-_DETAIL_CHARS:]
    return _Loaded(None, NativeKernel(library, level, status, built_isa, short))


@functools.cache
def _load(library: str, level: str) -> _Loaded:
    spec = LIBRARIES[library]
    if level not in isa.LEVELS:
        return _off(library, level, "unknown_level", f"levels: {', '.join(isa.LEVELS)}")
    compiler = find_compiler()
    if compiler is None:
        configured = os.environ.get("CXX")
        where = f"$CXX={configured} not found" if configured else "no c++, g++ or clang++ on PATH"
        return _off(library, level, "no_compiler", where)
    try:
        target = isa.probe(compiler, level)
    except (OSError, RuntimeError, subprocess.SubprocessError) as exc:
        return _off(library, level, "build_failed", str(exc))
    if target.missing:
        detail = f"this CPU lacks {', '.join(target.missing)}"
        return _off(library, level, "cpu_lacks", detail, built_isa=target.isa)
    source = SOURCES / spec.source
    try:
        path = library_path(source, compiler, level)
        if not path.exists():
            log.info("building %s for %s (%s) with %s", spec.source, level, target.isa, compiler)
            build(source, compiler, path, level)
    except (OSError, RuntimeError, subprocess.SubprocessError) as exc:
        return _off(library, level, "build_failed", str(exc), built_isa=target.isa)
    try:
        loaded = declare(ctypes.CDLL(str(path)), library)
    except (OSError, AttributeError) as exc:
        return _off(library, level, "load_failed", str(exc), built_isa=target.isa)
    return _Loaded(loaded, NativeKernel(library, level, "loaded", target.isa))


def load(library: str, level: str | None = None) -> ctypes.CDLL | None:
    """``library`` (a name in the table) built for ``level`` (``None``:
    :func:`default_level`), built now if this machine has no such build yet, every entry point
    declared; ``None`` (logged once) when it cannot be built or loaded. Raises ``KeyError``
    for a library not in the table."""
    return _load(library, level or default_level()).library


def state(library: str, level: str | None = None) -> NativeKernel:
    """Whether ``library`` loads for ``level`` (loading it if not yet tried), for which ISA,
    or why not."""
    return _load(library, level or default_level()).state


def report(level: str | None = None) -> tuple[NativeKernel, ...]:
    """:func:`state` of every library of the table, in table order."""
    return tuple(state(name, level) for name in LIBRARIES)


@functools.cache
def _function(library: str, name: str, level: str) -> Any:
    if name not in LIBRARIES[library].names:
        raise KeyError(f"{name} is not an entry point of {library} in the table")
    loaded = _load(library, level).library
    return None if loaded is None else getattr(loaded, name)


def function(library: str, name: str, level: str | None = None) -> Any:
    """The entry point ``name`` of ``library`` for ``level``, declared as the table says;
    ``None`` when the library does not load. Raises ``KeyError`` for a name not in the
    table."""
    return _function(library, name, level or default_level())


def clear_cache() -> None:
    """Forget what was loaded and logged (tests that change the compiler or the cache). The
    libraries stay mapped; a later :func:`load` loads them again."""
    for cached in (_load, _function, _warn_once, _compiler_version, isa.probe):
        cached.cache_clear()
