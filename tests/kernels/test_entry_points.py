"""The kernels' one table against the sources: every library's source is in the package, the
table names exactly the functions each source exports, and a loaded library has every entry
point declared as the table says."""

from __future__ import annotations

import re

import pytest

from cadenza.kernels.native import loader
from cadenza.kernels.native.entry_points import LIBRARIES

# A definition at the start of a line: ``void cadenza_x(`` / ``int64_t cadenza_y(``.
_DEFINITION = re.compile(r"^(?:void|int|int64_t)\s+(cadenza_\w+)\(", re.MULTILINE)
_LOCAL_INCLUDE = re.compile(r'^#include "([^"]+)"', re.MULTILINE)


def _exported(source: str, seen: set[str] | None = None) -> set[str]:
    """The ``cadenza_*`` functions ``source`` and the package headers it includes define."""
    seen = set() if seen is None else seen
    if source in seen:
        return set()
    seen.add(source)
    text = (loader.SOURCES / source).read_text()
    names = set(_DEFINITION.findall(text))
    for header in _LOCAL_INCLUDE.findall(text):
        names |= _exported(header, seen)
    return names


@pytest.mark.parametrize("name", list(LIBRARIES))
def test_the_table_names_exactly_what_each_source_exports(name):
    library = LIBRARIES[name]
    assert library.name == name and library.source == f"{name}.cpp"
    assert loader.source_path(name).is_file()
    assert library.names == _exported(library.source)
    assert len(library.names) == len(library.entry_points)  # no name twice


def test_every_source_of_the_package_is_in_the_table():
    sources = {path.name for path in loader.SOURCES.glob("*.cpp")}
    assert sources == {library.source for library in LIBRARIES.values()}


@pytest.mark.parametrize("name", list(LIBRARIES))
def test_a_loaded_library_has_every_entry_point_declared(name):
    library = loader.load(name)
    if library is None:
        pytest.skip(f"{name} is not built here: {loader.state(name).detail}")
    for entry in LIBRARIES[name].entry_points:
        function = getattr(library, entry.name)
        assert tuple(function.argtypes) == entry.argtypes
        assert function.restype == entry.restype
        assert loader.function(name, entry.name) is function


def test_names_outside_the_table_are_refused():
    with pytest.raises(KeyError):
        loader.function("cpu_elu", "cadenza_not_there")
    with pytest.raises(KeyError):
        loader.load("cpu_nothing")
