"""What runs in the **edge** process: :mod:`~cadenza.ipc.edge_side.engine_client` starts an
engine, sends it requests and routes each stream's outputs to its caller. It never imports
torch (the in-process mode, for tests and tools, runs the engine loop in a thread)."""
