"""How long a full garbage collection stalls a loaded engine process, and the edge's modules,
before and after :func:`cadenza.gc_pauses.freeze_loaded_heap`.

    .venv/bin/python benchmarks/gc_pauses.py

Each in a fresh process: the engine (cadenza-tiny built, as an engine process holds it) and the
edge (its app and the transports imported). Prints the objects the collector tracks and the
median of three full collections, before and after the freeze, in milliseconds.
"""

from __future__ import annotations

import gc
import statistics
import subprocess
import sys
import time


def full_collection_ms() -> float:
    times = []
    for _ in range(3):
        started = time.perf_counter()
        gc.collect()
        times.append(1000.0 * (time.perf_counter() - started))
    return statistics.median(times)


def child(which: str) -> None:
    from cadenza.gc_pauses import freeze_loaded_heap

    if which == "engine":
        from cadenza.config import EngineConfig
        from cadenza.engine.engine import Engine

        engine = Engine.from_pretrained(
            "cadenza-tiny", engine_config=EngineConfig(kv_cache_memory_bytes=256 << 20)
        )
        assert engine is not None
    else:
        from cadenza.config import CadenzaConfig
        from cadenza.edge.server.app import create_app

        create_app(CadenzaConfig())
    tracked, before = len(gc.get_objects()), full_collection_ms()
    freeze_loaded_heap()
    after_tracked, after = len(gc.get_objects()), full_collection_ms()
    print(f"| {which} | {tracked} | {before:.1f} | {after_tracked} | {after:.2f} |", flush=True)


def main() -> None:
    if len(sys.argv) > 1:
        child(sys.argv[1])
        return
    print("| process | objects tracked | full collection ms | after the freeze | ms |")
    print("| --- | --- | --- | --- | --- |")
    for which in ("engine", "edge"):
        subprocess.run([sys.executable, __file__, which], check=True, stderr=subprocess.DEVNULL)


if __name__ == "__main__":
    main()
