"""The native CPU kernels: C++ sources built once per machine and instruction-set level, and
loaded through ``ctypes`` (engine process).

======================  ======================================================================
file                    what it holds
======================  ======================================================================
``entry_points``        the one table: each library, its source, its functions' signatures
``loader``              builds, caches and loads a library; its state (loaded, level, ISA, why)
``isa``                 the levels (``native``, ``x86-64-v4``, ``x86-64-v3``) and what each uses
``cpu_vector.h``        vectors of the machine's width: loads, bf16 rounding, exp
``cpu_product.h``       few-row products over packed weights (AVX512-BF16 pairs, AMX tiles)
``cpu_*.cpp``           one library each; the Python wrappers are ``cadenza/kernels/cpu_*.py``
======================  ======================================================================

The engine process loads every library when it starts (:func:`cadenza.engine.builder.
load_native_kernels`) and logs one line: ``native kernels: 6 of 6 loaded for native
(avx512bf16)``, or what is off and why. It announces each library's state in
``EngineInfo.native_kernels`` (:mod:`cadenza.contract.native_kernels`: library, level, status
``loaded``, ``no_compiler``, ``build_failed``, ``load_failed``, ``cpu_lacks`` or
``unknown_level``, ISA); ``/readyz`` shows it per replica and ``/metrics`` has
``cadenza_native_kernel_loaded{model, replica, library, level, isa, status}``. The calibration
cache key holds every library's source hash, status, level and ISA, so a calibration measured
with the kernels on is never reused with them off or at another ISA.

The kernels' reference tests (``tests/kernels/test_cpu_*.py``, ``test_fused_cpu_decode.py``)
take the ``isa_level`` fixture and run at every level this CPU can run (``native`` and
``x86-64-v3`` by default; ``$CADENZA_TEST_ISA_LEVELS`` chooses), skipping one it cannot with
the reason.
"""
