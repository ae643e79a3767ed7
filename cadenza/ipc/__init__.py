"""Process glue between the edge and the engine, over the typed contract
(:mod:`cadenza.contract.messages`) and ZeroMQ, in one sub-package per process:

* :mod:`~cadenza.ipc.edge_side` runs in the **edge** process (asyncio, never torch);
* :mod:`~cadenza.ipc.engine_side` runs in the **engine** process (the loop, the replica's
  placement, ``python -m cadenza.ipc.engine_side``).

Each side imports the other's messages only through the contract.

``EngineClient.start()`` spawns ``python -m cadenza.ipc.engine_side`` with the configuration as
JSON, binds two sockets in a temporary directory (``ipc://``: PUSH edge -> engine, PULL engine
-> edge) and waits for the engine's ``ready``, whose :class:`EngineInfo` carries everything
admission needs. A starting engine says every second what it does; the edge gives up only after
``supervision.startup_timeout_s`` without progress. With ``supervision.mode = "inprocess"``
the same loop runs in a thread over ``inproc://`` sockets: tests and tools get the identical
code path without a second process.

Failure and cancellation:

* A request the engine refuses (unknown voice, duplicate id, full queue, too large) gets a
  final output with ``error_code = "rejected"``; one that raises inside the model fails alone
  with ``"internal"``, and the loop goes on with the others. A step that raises outside that
  isolation ends the loop with ``fatal``.
* Leaving ``EngineClient.generate()`` early (a client that left or cancelled) sends an abort;
  the engine drops the request before its next step, so its pages are freed only when no step
  is using them.
* Each stream has a bounded queue of undelivered outputs (``server.max_queued_chunks``); a
  consumer that falls that far behind is cut off with ``slow_consumer`` and its request
  aborted.
* The engine exits when its parent process disappears, or when the edge has taken none of its
  messages for 30 s.
"""
