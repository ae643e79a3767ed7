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
"""
