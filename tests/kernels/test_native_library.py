"""Building and loading the native kernels: once per machine and source, atomically, and a
clear ``None`` (never an exception) when there is no compiler or the build fails."""

from __future__ import annotations

import ctypes
import logging

import pytest

from cadenza.kernels import native_library


@pytest.fixture
def private_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    native_library.load.cache_clear()
    yield tmp_path / "cadenza" / "native"
    native_library.load.cache_clear()


needs_compiler = pytest.mark.skipif(
    native_library.find_compiler() is None, reason="no C++ compiler on this machine"
)


@needs_compiler
def test_a_source_is_built_once_and_loaded(private_cache):
    library = native_library.load("cpu_decode_layers.cpp")
    assert isinstance(library, ctypes.CDLL)
    builds = list(private_cache.glob("cpu_decode_layers-*.so"))
    assert len(builds) == 1
    stamp = builds[0].stat().st_mtime_ns
    native_library.load.cache_clear()
    assert native_library.load("cpu_decode_layers.cpp") is not None
    assert builds[0].stat().st_mtime_ns == stamp  # loaded, not rebuilt
    assert not list(private_cache.glob("*.so.*")) and len(list(private_cache.iterdir())) == 1


@needs_compiler
def test_the_build_is_named_by_source_and_compiler(private_cache, tmp_path):
    compiler = native_library.find_compiler()
    assert compiler is not None
    source = tmp_path / "probe.cpp"
    source.write_text('extern "C" int probe() { return 7; }\n')
    first = native_library.library_path(source, compiler)
    source.write_text('extern "C" int probe() { return 8; }\n')
    assert native_library.library_path(source, compiler) != first
    native_library.build(source, compiler, first)
    assert ctypes.CDLL(str(first)).probe() == 8


@needs_compiler
def test_a_source_that_does_not_compile_raises_with_the_compiler_message(tmp_path):
    compiler = native_library.find_compiler()
    assert compiler is not None
    source = tmp_path / "broken.cpp"
    source.write_text("this is not C++\n")
    target = tmp_path / "out" / "broken.so"
    with pytest.raises(RuntimeError, match="failed"):
        native_library.build(source, compiler, target)
    assert not target.exists()
    assert list(target.parent.iterdir()) == []  # no partial file left


def test_no_compiler_gives_none_and_says_so(private_cache, monkeypatch, caplog):
    monkeypatch.setattr(native_library, "find_compiler", lambda: None)
    with caplog.at_level(logging.WARNING, logger="cadenza.kernels.native_library"):
        assert native_library.load("cpu_decode_layers.cpp") is None
    assert "no C++ compiler" in caplog.text


def test_a_failing_compiler_gives_none_and_says_so(private_cache, monkeypatch, caplog):
    monkeypatch.setenv("CXX", "false")
    assert native_library.find_compiler() is not None  # /bin/false: found, always fails
    with caplog.at_level(logging.WARNING, logger="cadenza.kernels.native_library"):
        assert native_library.load("cpu_decode_layers.cpp") is None
    assert "unavailable" in caplog.text
    assert not list(private_cache.glob("*.so"))


def test_a_missing_configured_compiler_is_not_found(monkeypatch):
    monkeypatch.setenv("CXX", "no-such-compiler-here")
    assert native_library.find_compiler() is None


def test_the_source_digest_names_the_kernel_source():
    digest = native_library.source_digest("cpu_decode_layers.cpp")
    assert len(digest) == 16 and digest == native_library.source_digest("cpu_decode_layers.cpp")


@needs_compiler
def test_a_changed_header_beside_the_source_builds_anew(tmp_path):
    compiler = native_library.find_compiler()
    assert compiler is not None
    (tmp_path / "shared.h").write_text("#pragma once\nconstexpr int SEVEN = 7;\n")
    source = tmp_path / "probe.cpp"
    source.write_text('#include "shared.h"\nextern "C" int probe() { return SEVEN; }\n')
    first = native_library.library_path(source, compiler)
    (tmp_path / "shared.h").write_text("#pragma once\nconstexpr int SEVEN = 8;\n")
    assert native_library.library_path(source, compiler) != first
