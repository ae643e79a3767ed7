"""The engine: model, scheduler loop, KV memory and codec stage, behind ``EngineClient``.

Modules that import torch (``engine``, ``engine_process``, ``models``) load only in the engine
process; ``engine_client``, ``messages`` and ``request`` are torch-free and serve the edge.
"""
