"""The engine's modules import in one direction: what drives an :class:`Engine` (offline use,
probes, calibration, the announcement's parts) is a module function over it, never a method
that imports its driver back. The one deliberate exception is the engine's constructors
(``Engine.from_pretrained``/``from_config``), which hand over to the builder lazily."""

from __future__ import annotations

import grimp

_LAZY_CONSTRUCTORS = ("cadenza.engine.engine", "cadenza.engine.builder")


def test_no_module_of_the_engine_is_part_of_an_import_cycle() -> None:
    graph = grimp.build_graph("cadenza")  # TYPE_CHECKING imports count too
    graph.remove_import(importer=_LAZY_CONSTRUCTORS[0], imported=_LAZY_CONSTRUCTORS[1])
    modules = {"cadenza.engine", *graph.find_descendants("cadenza.engine")}
    cycles = []
    for module in sorted(modules):
        for imported in graph.find_modules_directly_imported_by(module):
            back = graph.find_shortest_chain(importer=imported, imported=module)
            if imported != module and back is not None:
                cycles.append((module, *back))
    assert not cycles, f"import cycles: {cycles}"
