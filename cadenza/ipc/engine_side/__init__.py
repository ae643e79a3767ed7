"""What runs in the **engine** process (or, with ``supervision.mode = "inprocess"``, in a thread
of the caller): :mod:`~cadenza.ipc.engine_side.engine_loop`, the busy loop around a
:class:`~cadenza.engine.serving_engine.ServingEngine`;
:mod:`~cadenza.ipc.engine_side.replica_placement`, where a replica runs (GPU, CPU cores); and
the process's entry point (``python -m cadenza.ipc.engine_side``)."""
