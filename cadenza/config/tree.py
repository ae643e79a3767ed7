"""The whole configuration: one section per owner, plain data the edge hands to each engine
process as JSON. Built from its sources by :func:`cadenza.config.loading.load_config`;
constructing it directly reads nothing but its arguments."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, field_validator

from cadenza.config.admission import AdmissionConfig
from cadenza.config.auth import AuthConfig
from cadenza.config.calibration import CalibrationConfig
from cadenza.config.cpu import CpuConfig
from cadenza.config.engine import EngineConfig
from cadenza.config.guard import GuardConfig
from cadenza.config.limits import LimitsConfig
from cadenza.config.model import ModelConfig, ServedModel
from cadenza.config.realtime import RealtimeConfig
from cadenza.config.server import ServerConfig
from cadenza.config.supervision import SupervisionConfig
from cadenza.config.text_stream import TextStreamConfig


class CadenzaConfig(BaseModel):
    """The whole configuration. Build it with :func:`~cadenza.config.load_config`.

    ======================  =================================================================
    section                 owner
    ======================  =================================================================
    ``server``              the edge process: sockets, timeouts, drain
    ``auth``                keys, client tokens, browser origins, trusted hosts
    ``model``, ``models``   what is served, on which device, in which dtype
    ``supervision``         the edge's engine processes: replicas, restarts, resumed streams
    ``engine``              the engine: kind, batch, KV cache
    ``realtime``            chunk sizes, real-time targets, lead (milliseconds)
    ``cpu``                 the CPU's fast paths (packed and bf16 products, fused decode)
    ``calibration``         the start-up step-time sweep and its cache
    ``limits``, ``guard``   what a request may ask for, and the text guard
    ``admission``           queues and the capacity check in front of the engines
    ``text_stream``         streams whose text arrives while they play
    ======================  =================================================================
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    server: ServerConfig = ServerConfig()
    auth: AuthConfig = AuthConfig()
    model: ModelConfig = ModelConfig()
    supervision: SupervisionConfig = SupervisionConfig()
    engine: EngineConfig = EngineConfig()
    realtime: RealtimeConfig = RealtimeConfig()
    cpu: CpuConfig = CpuConfig()
    calibration: CalibrationConfig = CalibrationConfig()
    limits: LimitsConfig = LimitsConfig()
    guard: GuardConfig = GuardConfig()
    admission: AdmissionConfig = AdmissionConfig()
    text_stream: TextStreamConfig = TextStreamConfig()
    models: list[ServedModel] = Field(
        default_factory=list,
        description="several models per server: [[models]] entries (name, path, codec); "
        "empty: the one [model]",
    )

    @field_validator("models")
    @classmethod
    def _unique_names(cls, models: list[ServedModel]) -> list[ServedModel]:
        names = [m.name for m in models]
        if len(set(names)) != len(names):
            raise ValueError(f"model names must be unique, got {names}")
        return models

    def without_secrets(self) -> CadenzaConfig:
        """The tree less what only the edge may hold (``[auth]``: key files and the token
        secret; ``limits.redis_url``, which may carry a password; the ICE servers, which may
        carry TURN credentials): what an engine process is handed."""
        return self.model_copy(
            update={
                "auth": AuthConfig(),
                "limits": self.limits.model_copy(update={"redis_url": None}),
                "server": self.server.model_copy(update={"webrtc_ice_servers": []}),
            }
        )

    def served_models(self) -> list[CadenzaConfig]:
        """One configuration per served model (its ``[model]`` section filled from its
        ``[[models]]`` entry), the first the default; ``[self]`` without entries."""
        if not self.models:
            return [self]
        return [
            self.model_copy(
                update={
                    "model": self.model.model_copy(
                        update={
                            "name": entry.path,
                            "served_name": entry.name,
                            "codec": entry.codec or self.model.codec,
                        }
                    ),
                    "models": [],
                }
            )
            for entry in self.models
        ]
