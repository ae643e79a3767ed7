"""cadenza: a real-time streaming speech/audio generation server.

Public API: :class:`Engine` (offline and step-by-step generation), :class:`SamplingParams`,
``__version__``. ``Engine`` is imported lazily so that the edge process, which imports this
package, never loads torch.
"""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version
from typing import TYPE_CHECKING, Any

from cadenza.engine.sampling_params import SamplingParams

if TYPE_CHECKING:
    from cadenza.engine.engine import Engine

try:
    __version__ = version("cadenza")
except PackageNotFoundError:  # running from a source tree without installing
    __version__ = "0.0.0"

__all__ = ["Engine", "SamplingParams", "__version__"]


def __getattr__(name: str) -> Any:
    if name == "Engine":
        from cadenza.engine.engine import Engine

        return Engine
    raise AttributeError(f"module 'cadenza' has no attribute {name!r}")
