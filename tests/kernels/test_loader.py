"""Building and loading the native kernels: once per machine, source and level, atomically; a
state that says what loaded, for which level and ISA, or why not; and a clear ``None`` (never
an exception) when there is no compiler, the build fails or the CPU lacks the level."""

from __future__ import annotations

import ctypes
import logging

import pytest

from cadenza.kernels.native import isa, loader
from cadenza.kernels.native.entry_points import LIBRARIES


@pytest.fixture
def private_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    loader.clear_cache()
    yield tmp_path / "cadenza" / "native"
    loader.clear_cache()


needs_compiler = pytest.mark.skipif(
    loader.find_compiler() is None, reason="no C++ compiler on this machine"
)
LOGGER = "cadenza.kernels.native.loader"


@needs_compiler
def test_a_library_is_built_once_per_level_and_loaded(private_cache):
    # cpu_elu: the quickest to build (the decode layers take seconds).
    library = loader.load("cpu_elu", "native")
    assert isinstance(library, ctypes.CDLL)
    builds = list(private_cache.glob("cpu_elu-native-*.so"))
    assert len(builds) == 1
    stamp = builds[0].stat().st_mtime_ns
    loader.clear_cache()
    assert loader.load("cpu_elu", "native") is not None
    assert builds[0].stat().st_mtime_ns == stamp  # loaded, not rebuilt
    assert not list(private_cache.glob("*.so.*")) and len(list(private_cache.iterdir())) == 1


@needs_compiler
def test_the_state_says_the_level_and_the_isa_the_build_uses(isa_level):
    state = loader.state("cpu_elu")
    compiler = loader.find_compiler()
    assert compiler is not None
    assert state.loaded and state.level == isa_level and state.detail == ""
    assert state.isa == isa.probe(compiler, isa_level).isa != ""
    if isa_level == "x86-64-v3":
        assert state.isa == "avx2"
    assert loader.report() == tuple(loader.state(name) for name in LIBRARIES)


def test_the_default_level_is_the_selected_one_else_the_environment_else_native(monkeypatch):
    monkeypatch.delenv(isa.LEVEL_ENV, raising=False)
    assert loader.default_level() == "native"
    monkeypatch.setenv(isa.LEVEL_ENV, "x86-64-v3")
    assert loader.default_level() == "x86-64-v3"
    loader.select_level("x86-64-v4")
    try:
        assert loader.default_level() == "x86-64-v4"
    finally:
        loader.select_level(None)
    assert loader.default_level() == "x86-64-v3"
    with pytest.raises(ValueError, match="unknown level"):
        loader.select_level("pentium")


def test_an_unknown_level_is_a_state_not_an_exception(caplog):
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        assert loader.load("cpu_elu", "pentium") is None
    state = loader.state("cpu_elu", "pentium")
    assert (state.status, state.isa) == ("unknown_level", "")
    assert "x86-64-v3" in state.detail and "unavailable" in caplog.text


@needs_compiler
def test_a_level_this_cpu_lacks_is_not_loaded(private_cache, monkeypatch):
    monkeypatch.setattr(isa, "cpu_flags", lambda: frozenset({"sse2", "avx"}))
    isa.probe.cache_clear()
    try:
        state = loader.state("cpu_elu", "x86-64-v3")
        assert state.status == "cpu_lacks" and state.isa == "avx2"
        assert "avx2" in state.detail and "fma" in state.detail
        assert loader.load("cpu_elu", "x86-64-v3") is None
        assert not list(private_cache.glob("*.so"))  # nothing was built
    finally:
        isa.probe.cache_clear()


@needs_compiler
def test_each_level_builds_apart(tmp_path):
    compiler = loader.find_compiler()
    assert compiler is not None
    source = tmp_path / "probe.cpp"
    source.write_text('extern "C" int probe() { return 7; }\n')
    paths = {level: loader.library_path(source, compiler, level) for level in isa.LEVELS}
    assert len(set(paths.values())) == len(isa.LEVELS)
    assert all(f"probe-{level}-" in path.name for level, path in paths.items())


@needs_compiler
def test_the_build_is_named_by_source_and_compiler(private_cache, tmp_path):
    compiler = loader.find_compiler()
    assert compiler is not None
    source = tmp_path / "probe.cpp"
    source.write_text('extern "C" int probe() { return 7; }\n')
    first = loader.library_path(source, compiler)
    source.write_text('extern "C" int probe() { return 8; }\n')
    assert loader.library_path(source, compiler) != first
    loader.build(source, compiler, first)
    assert ctypes.CDLL(str(first)).probe() == 8


@needs_compiler
def test_a_source_that_does_not_compile_raises_with_the_compiler_message(tmp_path):
    compiler = loader.find_compiler()
    assert compiler is not None
    source = tmp_path / "broken.cpp"
    source.write_text("this is not C++\n")
    target = tmp_path / "out" / "broken.so"
    with pytest.raises(RuntimeError, match="failed"):
        loader.build(source, compiler, target)
    assert not target.exists()
    assert list(target.parent.iterdir()) == []  # no partial file left


def test_no_compiler_gives_none_and_says_so_once(private_cache, no_compiler, caplog):
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        assert loader.load("cpu_decode_layers") is None
        assert loader.function("cpu_elu", "cadenza_elu_f32") is None
    assert caplog.text.count("no C++ compiler") == 1
    states = loader.report()
    assert [s.library for s in states] == list(LIBRARIES)
    assert all(s.status == "no_compiler" and not s.loaded and s.isa == "" for s in states)


def test_a_failing_compiler_gives_none_and_says_so(private_cache, monkeypatch, caplog):
    monkeypatch.setenv("CXX", "false")
    assert loader.find_compiler() is not None  # /bin/false: found, always fails
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        assert loader.load("cpu_decode_layers") is None
    assert "unavailable" in caplog.text
    assert loader.state("cpu_decode_layers").status == "build_failed"
    assert not list(private_cache.glob("*.so"))


def test_a_missing_configured_compiler_is_not_found(monkeypatch):
    monkeypatch.setenv("CXX", "no-such-compiler-here")
    assert loader.find_compiler() is None


def test_the_source_digest_names_the_kernel_source():
    digest = loader.source_digest("cpu_decode_layers")
    assert len(digest) == 16 and digest == loader.source_digest("cpu_decode_layers")
    assert digest != loader.source_digest("cpu_elu")


@needs_compiler
def test_a_changed_header_beside_the_source_builds_anew(tmp_path):
    compiler = loader.find_compiler()
    assert compiler is not None
    (tmp_path / "shared.h").write_text("#pragma once\nconstexpr int SEVEN = 7;\n")
    source = tmp_path / "probe.cpp"
    source.write_text('#include "shared.h"\nextern "C" int probe() { return SEVEN; }\n')
    first = loader.library_path(source, compiler)
    (tmp_path / "shared.h").write_text("#pragma once\nconstexpr int SEVEN = 8;\n")
    assert loader.library_path(source, compiler) != first
