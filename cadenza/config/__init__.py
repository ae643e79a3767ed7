"""One typed configuration tree for the whole server, one section per owner.

=================  ======================================================  ====================
section            keys                                                    module
=================  ======================================================  ====================
``server``         where the edge listens, its timeouts, drain             ``server.py``
``auth``           keys, admin keys, client tokens, origins, hosts         ``auth.py``
``model``          model, codec, device, dtypes, seed, torch threads       ``model.py``
``[[models]]``     several models per server                               ``model.py``
``supervision``    mode, startup/heartbeat timeouts, replicas, the host's  ``supervision.py``
                   cores shared among its nodes, warm spare, restart
                   backoff, start failures, resume replay
``engine``         kind, batch (tokens, sequences), pending requests,      ``engine.py``
                   KV pages, dtype, size, prefix caching, reservation
``realtime``       first and later chunk (ms), TTFA target, playout        ``realtime.py``
                   reserve, prompt TTFA multiple, lead and hysteresis,
                   headroom
``cpu``            packed weights, linear dtype, fused decode, codec dtype  ``cpu.py``
``calibration``    mode, batch sizes, duration (ms), long context,         ``calibration.py``
                   attempts, re-measuring when idle, tolerance, cache
                   directory
``limits``         what one request may ask for                            ``limits.py``
``guard``          the input-text guard                                    ``guard.py``
``admission``      queues, reserved shares, the capacity check             ``admission.py``
``text_stream``    segmenting streamed text, its limits                    ``text_stream.py``
=================  ======================================================  ====================

:func:`load_config` builds it from flags, ``CADENZA_*`` variables and a TOML file
(:mod:`cadenza.config.loading`); the previous release's ``[engine]`` keys are read for one more
release (:mod:`cadenza.config.old_keys`). The tree is plain data: the edge process hands it to
the engine process as JSON.
"""

from cadenza.config.admission import AdmissionConfig
from cadenza.config.auth import AuthConfig
from cadenza.config.calibration import CalibrationConfig
from cadenza.config.cpu import CpuConfig
from cadenza.config.engine import EngineConfig
from cadenza.config.guard import GuardConfig
from cadenza.config.limits import LimitsConfig
from cadenza.config.loading import config_reference, load_config
from cadenza.config.model import ModelConfig, ServedModel
from cadenza.config.realtime import RealtimeConfig
from cadenza.config.section import ConfigError
from cadenza.config.server import ServerConfig
from cadenza.config.sources import ENV_NESTED_DELIMITER, ENV_PREFIX
from cadenza.config.supervision import SupervisionConfig
from cadenza.config.text_stream import TextStreamConfig
from cadenza.config.tree import CadenzaConfig

__all__ = [
    "ENV_NESTED_DELIMITER",
    "ENV_PREFIX",
    "AdmissionConfig",
    "AuthConfig",
    "CadenzaConfig",
    "CalibrationConfig",
    "ConfigError",
    "CpuConfig",
    "EngineConfig",
    "GuardConfig",
    "LimitsConfig",
    "ModelConfig",
    "RealtimeConfig",
    "ServedModel",
    "ServerConfig",
    "SupervisionConfig",
    "TextStreamConfig",
    "config_reference",
    "load_config",
]
