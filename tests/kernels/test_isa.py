"""Instruction-set levels: what a level's build uses, named from the compiler's predefined
macros, and which of those instructions this CPU lacks."""

from __future__ import annotations

import platform

import pytest

from cadenza.kernels.native import isa, loader

needs_x86_compiler = pytest.mark.skipif(
    loader.find_compiler() is None or platform.machine().lower() not in ("x86_64", "amd64"),
    reason="needs a C++ compiler on an x86-64 machine",
)


@pytest.mark.parametrize(
    ("macros", "name"),
    [
        ({"__AMX_TILE__", "__AMX_BF16__", "__AVX512BF16__", "__AVX512F__"}, "amx"),
        ({"__AMX_TILE__", "__AVX512BF16__", "__AVX512F__"}, "avx512bf16"),
        ({"__AVX512F__", "__AVX2__", "__AVX__"}, "avx512f"),
        ({"__AVX2__", "__AVX__", "__FMA__"}, "avx2"),
        ({"__AVX__", "__SSE2__"}, "avx"),
        ({"__SSE2__"}, "sse"),
        ({"__ARM_NEON", "__aarch64__"}, "neon"),
        (set(), "generic"),
    ],
)
def test_the_isa_is_the_widest_instruction_set_the_kernels_branch_on(macros, name):
    assert isa.isa_of(frozenset(macros)) == name


def test_an_unknown_level_is_refused():
    with pytest.raises(ValueError, match="unknown level"):
        isa.probe("c++", "pentium")


@needs_x86_compiler
def test_each_x86_level_uses_what_its_name_says():
    compiler = loader.find_compiler()
    assert compiler is not None
    assert isa.probe(compiler, "x86-64-v3").isa == "avx2"
    assert isa.probe(compiler, "x86-64-v4").isa == "avx512f"
    macros = isa.predefined_macros(compiler, isa.LEVELS["x86-64-v3"])
    assert {"__AVX2__", "__FMA__"} <= macros and "__AVX512F__" not in macros


@needs_x86_compiler
def test_a_cpu_without_the_level_s_instructions_is_said_to_lack_them(monkeypatch):
    compiler = loader.find_compiler()
    assert compiler is not None
    monkeypatch.setattr(isa, "cpu_flags", lambda: frozenset({"sse2", "sse4_2", "avx", "avx2"}))
    isa.probe.cache_clear()
    try:
        assert {"fma", "bmi2"} <= set(isa.probe(compiler, "x86-64-v3").missing)
        assert "avx512f" in isa.probe(compiler, "x86-64-v4").missing
        assert isa.probe(compiler, "native").missing == ()  # what the compiler found here
    finally:
        isa.probe.cache_clear()


def test_a_compiler_that_refuses_the_flags_raises_with_its_message():
    with pytest.raises(RuntimeError, match="failed"):
        isa.predefined_macros("false", ("-march=native",))


def test_the_cpu_flags_come_from_the_flags_line(monkeypatch):
    monkeypatch.setattr(isa, "cpu_flags_line", lambda: "flags\t\t: fpu avx2 fma\n")
    assert isa.cpu_flags() == frozenset({"fpu", "avx2", "fma"})
    monkeypatch.setattr(isa, "cpu_flags_line", lambda: "")
    assert isa.cpu_flags() is None
