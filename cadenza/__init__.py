"""cadenza: a real-time streaming speech/audio generation server.

Public API: :class:`Engine` (offline and step-by-step generation), :class:`SamplingParams`,
``__version__``. ``Engine`` is imported lazily so that the edge process, which imports this
package, never loads torch.

The packages say which process they run in: ``edge/`` (HTTP, WebSocket, WebRTC, admission,
media containers; no torch), ``engine/``, ``codecs/`` and ``kernels/`` (the engine process),
``contract/`` (the typed boundary both share) and ``ipc/`` (the glue between them).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from cadenza.contract.sampling import SamplingParams
from cadenza.version import __version__

if TYPE_CHECKING:
    from cadenza.engine.engine import Engine

__all__ = ["Engine", "SamplingParams", "__version__"]


def __getattr__(name: str) -> Any:
    if name == "Engine":
        from cadenza.engine.engine import Engine

        return Engine
    raise AttributeError(f"module 'cadenza' has no attribute {name!r}")
