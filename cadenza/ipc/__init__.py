"""Process glue between the edge and the engine, over the typed contract
(:mod:`cadenza.contract.messages`) and ZeroMQ.

* :mod:`~cadenza.ipc.engine_client` runs in the **edge** process: it starts the engine, sends
  requests and routes each stream's outputs to its caller. It never imports torch.
* :mod:`~cadenza.ipc.engine_loop` runs in the **engine** process (or, with ``supervision.mode =
  "inprocess"``, in a thread of the caller): the busy loop around a
  :class:`~cadenza.ipc.serving_engine.ServingEngine`.
"""
