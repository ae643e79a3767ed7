"""KV memory in the engine: the preallocated paged tensors (``paged_kv_cache``), which pages
are free, cached or in use (``page_pool``), and which sequence holds which (``kv_cache_manager``:
prefix matching, reservation, growth, release).

The cache is allocated once, when the engine is built: ``engine.kv_cache_memory_bytes``, or
``engine.kv_cache_memory_fraction`` (by default 5 % on the CPU, 90 % on CUDA less the decode
graphs' memory) of the device's free memory once the weights are loaded, in pages of
``engine.page_size`` tokens (16) of every layer. What a token costs is the one formula of
:mod:`cadenza.contract.kv_memory`, which admission and ``cadenza plan`` use too;
``engine.kv_dtype`` sets the cache's dtype (int8 pages carry a float16 scale per token and KV
head, :mod:`cadenza.kernels.kv_quant`).

With ``engine.reserve_max_output`` (the default) a sequence is admitted only if the pool also
holds everything it may still generate, so no running sequence is ever preempted; without it,
a sequence that cannot grow makes the scheduler preempt the newest one (recompute).
``PagePool.check_integrity`` and ``KVCacheManager.check_integrity`` (run by
``Engine.check_integrity``) assert that the pool, the page tables, the runs and the reservation
ledger agree.
"""
