"""What an engine says of its native kernels in one line: how many loaded, for which level and
ISA, which are off and why; without a compiler, that the CPU's work runs on torch paths."""

from __future__ import annotations

from cadenza.contract.native_kernels import (
    NO_COMPILER_NOTE,
    NativeKernel,
    compiler_missing,
    summary,
)
from tests.support.contract_examples import NATIVE_KERNELS, NO_COMPILER_KERNELS


def test_all_loaded_says_how_many_and_for_which_isa() -> None:
    assert summary(NATIVE_KERNELS) == "native kernels: 2 of 2 loaded for native (avx512bf16)"
    assert all(kernel.loaded for kernel in NATIVE_KERNELS)
    assert not compiler_missing(NATIVE_KERNELS)


def test_without_a_compiler_it_says_so() -> None:
    assert compiler_missing(NO_COMPILER_KERNELS)
    assert summary(NO_COMPILER_KERNELS) == NO_COMPILER_NOTE
    assert "no C++ compiler" in NO_COMPILER_NOTE and "torch" in NO_COMPILER_NOTE


def test_some_off_names_them_and_why() -> None:
    kernels = (
        NativeKernel("cpu_elu", "x86-64-v3", "loaded", "avx2"),
        NativeKernel("cpu_lstm", "x86-64-v3", "build_failed", "avx2", "c++ failed: ..."),
    )
    line = summary(kernels)
    assert line.startswith("native kernels: 1 of 2 loaded for x86-64-v3 (avx2)")
    assert "cpu_lstm build_failed" in line and "torch" in line
    assert not compiler_missing(kernels)


def test_an_engine_that_reports_none() -> None:
    assert summary(()) == "no native kernels reported"
    assert not compiler_missing(())
