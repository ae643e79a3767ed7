"""The web stack's first-use imports: not loaded by importing the edge, loaded by the warm-up
(so no request pays for them on the event loop)."""

from __future__ import annotations

import subprocess
import sys

from cadenza.edge.server.lazy_modules import LAZY_MODULES

CHECK = """
import sys
import cadenza.edge.server.app
from cadenza.edge.server.lazy_modules import LAZY_MODULES, import_lazy_modules
before = [name for name in LAZY_MODULES if name in sys.modules]
import_lazy_modules()
after = [name for name in LAZY_MODULES if name in sys.modules]
print(len(before), len(after))
"""


def test_the_edge_imports_them_at_start_not_on_first_use() -> None:
    out = subprocess.run(
        [sys.executable, "-c", CHECK], capture_output=True, text=True, check=True, timeout=120
    ).stdout.split()
    # importing the app leaves them for a request to import; the warm-up loads every one
    assert out == ["0", str(len(LAZY_MODULES))]
