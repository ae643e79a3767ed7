"""Process glue between the edge and the engine, over the typed contract
(:mod:`cadenza.contract.messages`) and ZeroMQ, in one sub-package per process:

* :mod:`~cadenza.ipc.edge_side` runs in the **edge** process (asyncio, never torch);
* :mod:`~cadenza.ipc.engine_side` runs in the **engine** process (the loop, the replica's
  placement, ``python -m cadenza.ipc.engine_side``).

Each side imports the other's messages only through the contract.
"""
