"""KV memory in the engine: the preallocated paged tensors (``paged_kv_cache``), which pages
are free, cached or in use (``page_pool``), and which sequence holds which (``kv_cache_manager``:
prefix matching, reservation, growth, release)."""
